/**
 * What a media input of a request (a video frame or reference image, an image edit's image or
 * mask) may be, and how each becomes a stored file of the account (design §7):
 *
 *   a data URL   decoded while the body was read and staged (the JSON holds its token)
 *   a file id    a file of this account that has not expired: an upload (POST /v1/files), an
 *                earlier input or output; anything else is 404 file_not_found
 *   an https URL fetched SSRF-safely (lib/safe-fetch: every resolved address checked and connected
 *                to directly, redirects followed only after the same checks, at most 3), within a
 *                time limit and the request's remaining byte budget, and staged like a data URL
 *
 * An input's identity, for alias agreement and idempotency, is the bytes' SHA-256 for staged data
 * (`InputStaging.identity`), the id for a file, the URL for a URL.
 */
import type { Readable } from 'node:stream';
import { ApiError, badRequest, tooLarge } from '../../errors.ts';
import type { InspectedImage } from '../../lib/image-inspect.ts';
import { SafeFetchError, safeRequest, type SafeFetchOptions } from '../../lib/safe-fetch.ts';
import type { FileRow } from '../../repositories/file.repository.ts';
import { MediaTooLarge, StorageError } from '../../storage/media-store.ts';
import type { FileService } from '../file.service.ts';
import type { InputStaging } from './input-staging.ts';

const FILE_ID = /^file_[0-9A-Za-z]{1,123}$/;
const MAX_REDIRECTS = 3;
const IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/webp', 'image/gif']);

export interface MediaInputOptions {
  /** Time limit of one URL input: every hop, and the whole body. */
  urlTimeoutMs: number;
  /** URL inputs may be on private networks (the operator's ALLOW_PRIVATE_TARGETS). */
  allowPrivate: boolean;
  /** Test seams of the URL fetch: the resolver, extra trusted CAs, addresses that count as public. */
  fetch?: Pick<SafeFetchOptions, 'resolve' | 'ca' | 'treatAsPublic'>;
}

/** A resolved input: its file and what inspection found (PNG/JPEG/WebP/GIF, size). */
export interface ResolvedInput {
  file: FileRow;
  image: InspectedImage;
  param: string;
}

export class MediaInputs {
  constructor(
    private readonly files: FileService,
    private readonly options: MediaInputOptions,
  ) {}

  /**
   * The stored file of each value, in order, each inspected as an image (400 invalid_image when
   * it is not a complete one). URL inputs count against `maxBytes` together with the staged data.
   */
  async resolveAll(staging: InputStaging, inputs: { value: string; param: string }[], limits: { maxBytes: number; maxItemBytes: number }): Promise<ResolvedInput[]> {
    const resolved: ResolvedInput[] = [];
    let total = 0;
    // One at a time: each inspection decodes a whole image.
    for (const { value, param } of inputs) {
      const file = await this.fileOf(staging, value, param, limits);
      total += file.bytes;
      if (total > limits.maxBytes) throw tooLarge('media_total_too_large', `Media inputs exceed ${limits.maxBytes} bytes in total.`, param);
      if (file.bytes > limits.maxItemBytes) throw tooLarge('media_too_large', `'${param}' is larger than ${limits.maxItemBytes} bytes.`, param);
      resolved.push({ file, image: await this.inspect(file, param), param });
    }
    return resolved;
  }

  private async fileOf(staging: InputStaging, value: string, param: string, limits: { maxBytes: number; maxItemBytes: number }): Promise<FileRow> {
    const staged = staging.get(value);
    if (staged) return staged.file;
    if (FILE_ID.test(value)) {
      const file = await this.files.findForAccount(value, staging.accountId);
      if (!file) throw new ApiError(404, 'file_not_found', `'${param}' names no file of this account (or it has expired): '${value}'.`, param);
      return file;
    }
    // Plain http:// only where the operator allows private targets, and then only to this machine
    // (the fetch's own URL rule, as for a callback_url): a development loop that feeds a local
    // gateway's or test server's links back in.
    if (/^https:\/\//i.test(value) || (this.options.allowPrivate && /^http:\/\//i.test(value))) {
      const left = limits.maxBytes - staging.bytes;
      const room = left <= limits.maxItemBytes ? { bytes: Math.max(0, left), code: 'media_total_too_large' as const } : { bytes: limits.maxItemBytes, code: 'media_too_large' as const };
      return (await this.fetchInto(staging, value, param, room)).file;
    }
    const urls = this.options.allowPrivate ? 'an https URL (or http:// to this machine)' : 'an https URL';
    throw badRequest('invalid_data_url', `'${param}' must be a base64 image data URL (data:image/png;base64,...), a file id (file_...) or ${urls}.`, param);
  }

  /**
   * Inspects an input the service has not seen decoded yet; uploads and outputs were checked when
   * stored. What it found is recorded where the row differs (a staged input has no size yet; a row
   * without its EXIF orientation gets it, which tells `FileService.mediaInputs` to send an upright copy).
   */
  private async inspect(file: FileRow, param: string): Promise<InspectedImage> {
    const image = await this.files.inspectStored(file, param);
    const orientation = image.orientation ?? 1;
    if (file.contentType !== image.mimeType || file.width !== image.width || file.height !== image.height || file.orientation !== orientation) {
      await this.files.describeImage(file.id, image);
      Object.assign(file, { contentType: image.mimeType, width: image.width, height: image.height, orientation });
    }
    return image;
  }

  /** Fetches an https URL input into a staged file of at most `maxBytes`. */
  private async fetchInto(staging: InputStaging, url: string, param: string, room: { bytes: number; code: 'media_too_large' | 'media_total_too_large' }) {
    const maxBytes = room.bytes;
    const deadline = AbortSignal.timeout(this.options.urlTimeoutMs);
    const fail = (err: unknown): never => {
      if (err instanceof ApiError) throw err;
      // The gateway's own storage failed while the bytes arrived: not the URL's fault (507/503).
      if (err instanceof StorageError) throw err;
      if (err instanceof MediaTooLarge) throw this.tooLarge(param, room);
      if (err instanceof SafeFetchError) {
        if (err.errorClass === 'blocked_address' || err.errorClass === 'invalid_url') throw badRequest('invalid_media_url', `'${param}' cannot be fetched: ${err.message}.`, param);
        throw badRequest('media_url_unavailable', `'${param}' could not be fetched: ${err.message}.`, param);
      }
      if (deadline.aborted) throw badRequest('media_url_unavailable', `'${param}' could not be fetched within ${this.options.urlTimeoutMs} ms.`, param);
      throw badRequest('media_url_unavailable', `'${param}' could not be fetched: ${err instanceof Error ? err.message : String(err)}.`, param);
    };
    let current = url;
    try {
      for (let hop = 0; ; hop++) {
        const { res } = await safeRequest(current, {
          method: 'GET',
          headers: { accept: 'image/png, image/jpeg, image/webp, image/gif', 'user-agent': 'Mediagate-Media/1' },
          timeoutMs: this.options.urlTimeoutMs,
          allowPrivate: this.options.allowPrivate,
          signal: deadline,
          ...this.options.fetch,
        });
        const status = res.statusCode ?? 0;
        if (status >= 300 && status < 400 && res.headers.location) {
          res.destroy();
          if (hop >= MAX_REDIRECTS) throw badRequest('media_url_unavailable', `'${param}' redirects more than ${MAX_REDIRECTS} times.`, param);
          current = new URL(res.headers.location, current).href; // checked like the first URL by the next safeRequest
          continue;
        }
        if (status !== 200) {
          res.destroy();
          throw badRequest('media_url_unavailable', `'${param}' could not be fetched: the server answered HTTP ${status}.`, param);
        }
        const declared = Number(res.headers['content-length']);
        if (Number.isFinite(declared) && declared > maxBytes) {
          res.destroy();
          throw this.tooLarge(param, room);
        }
        const type = String(res.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
        return await staging.store(param, IMAGE_TYPES.has(type) ? type : 'application/octet-stream', res as Readable, maxBytes);
      }
    } catch (err) {
      return fail(err);
    }
  }

  private tooLarge(param: string, room: { bytes: number; code: 'media_too_large' | 'media_total_too_large' }): ApiError {
    return room.code === 'media_too_large'
      ? tooLarge('media_too_large', `'${param}' is larger than ${room.bytes} bytes.`, param)
      : tooLarge('media_total_too_large', `'${param}' does not fit in what is left of the media inputs' byte limit (${room.bytes} bytes).`, param);
  }
}
