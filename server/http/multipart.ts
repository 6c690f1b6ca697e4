/**
 * multipart/form-data parser of `POST /v1/images/edits` (OpenAI-compatible direct upload).
 *
 * Mounted before the OpenAPI validator (which runs with `fileUploader: false`). It streams the body
 * through busboy with hard limits, keeps the image files in memory up to the per-file limit only,
 * and hands the validator a `req.body` of text fields alone: file parts never appear in `req.body`
 * (every file property of `ImageEditMultipartRequest` is optional, so their absence validates) and
 * are read by the handler with `uploadedFiles(req)`.
 *
 * A rejected body is not read any further: the error response is sent with `Connection: close`
 * while the rest of the upload is discarded unread for a short linger, then the socket is closed.
 */
import busboy from 'busboy';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { ApiError } from '../errors.ts';
import { bodyDeadline, bodyTooLarge } from './request-guards.ts';

const KiB = 1024;
const MiB = 1024 * KiB;

export interface MultipartLimits {
  /** Image files per request (`image`, `image[]`, `image_*`); the mask does not count. */
  maxFiles: number;
  /** Bytes of one file (each image and the mask). */
  maxFileBytes: number;
  /** Bytes of the whole request body. */
  maxTotalBytes: number;
  /** Text fields per request. */
  maxFields: number;
  /** Bytes of one text field value (a 32,000-character prompt can be 128 KiB of UTF-8). */
  maxFieldBytes: number;
  /** 408 body_timeout when no byte arrived for this long (BODY_IDLE_TIMEOUT_MS)… */
  idleTimeoutMs: number;
  /** …or the body was not complete within this (BODY_TIMEOUT_MS), as for every other body. */
  timeoutMs: number;
}

export const DEFAULT_MULTIPART_LIMITS: Readonly<MultipartLimits> = Object.freeze({
  maxFiles: 16,
  maxFileBytes: 50 * MiB,
  maxTotalBytes: 200 * MiB,
  maxFields: 64,
  maxFieldBytes: 256 * KiB,
  idleTimeoutMs: 30_000,
  timeoutMs: 900_000,
});

export interface UploadedImage {
  fieldname: string;
  filename: string;
  mimeType: string;
  buffer: Buffer;
}

export interface UploadedFiles {
  /** Image files in the order they were sent. */
  images: UploadedImage[];
  mask: UploadedImage | undefined;
}

/** Header pairs per part (busboy 1.6 caps them itself at 2000 and 16 KiB per part header). */
const HEADER_PAIRS = 16;

const INTEGER_FIELDS = new Set(['n', 'output_compression', 'partial_images']);
const BOOLEAN_FIELDS: Record<string, boolean> = { true: true, false: false, '1': true, '0': false };
const IMAGE_FIELD = /^image(\[\]|_.+)?$/;
const DECIMAL_INTEGER = /^-?[0-9]+$/;

const UPLOADS = Symbol('mediagate.multipartUploads');
type WithUploads = Request & { [UPLOADS]?: UploadedFiles };

/** The files parsed by `imageEditMultipart` (empty for a JSON request). */
export function uploadedFiles(req: Request): UploadedFiles {
  const uploads = (req as WithUploads)[UPLOADS];
  return { images: uploads ? [...uploads.images] : [], mask: uploads?.mask };
}

export function isImageFieldName(name: string): boolean {
  return IMAGE_FIELD.test(name);
}

function isMultipartFormData(req: Request): boolean {
  const type = req.headers['content-type'];
  return typeof type === 'string' && /^\s*multipart\/form-data\s*(;|$)/i.test(type);
}

/** `n`, `output_compression`, `partial_images` and `stream` as the contract types them; anything else stays a string. */
export function coerceField(name: string, value: string): string | number | boolean {
  if (INTEGER_FIELDS.has(name) && DECIMAL_INTEGER.test(value)) {
    const n = Number(value);
    if (Number.isSafeInteger(n)) return n;
    return value;
  }
  if (name === 'stream') {
    const b = BOOLEAN_FIELDS[value.toLowerCase()];
    if (b !== undefined) return b;
  }
  return value;
}

interface PendingFile {
  info: Omit<UploadedImage, 'buffer'>;
  chunks: Buffer[];
}

const invalid = (message: string, param: string | null) => new ApiError(400, 'invalid_request', message, param);

const GRANTED = Symbol('mediagate.grantedBodyBytes');

/** Records that `req`'s body (of unknown length) was granted `bytes` of the large-body budget: its parser stops past them. */
export function grantBodyBytes(req: Request, bytes: number): void {
  (req as Request & { [GRANTED]?: number })[GRANTED] = bytes;
}

function grantedBodyBytes(req: Request): number {
  return (req as Request & { [GRANTED]?: number })[GRANTED] ?? Number.POSITIVE_INFINITY;
}

/**
 * Parses a multipart/form-data body for `POST /v1/images/edits`; calls `next()` untouched for any
 * other Content-Type. Text fields go to `req.body` (coerced, duplicates rejected); image files to
 * `req.files` (array, arrival order) and with the mask to `uploadedFiles(req)`.
 */
export function imageEditMultipart(limits: Partial<MultipartLimits> = {}): RequestHandler {
  const cfg: MultipartLimits = { ...DEFAULT_MULTIPART_LIMITS, ...limits };

  return (req: Request, res: Response, next: NextFunction): void => {
    if (!isMultipartFormData(req)) {
      next();
      return;
    }

    const body: Record<string, string | number | boolean> = {};
    const images: PendingFile[] = [];
    let mask: PendingFile | undefined;
    let total = 0;
    // A body of unknown length was granted this much of the large-body budget (largeBodySlots): it
    // is held in memory, so it may not grow past it.
    const maxTotal = Math.min(cfg.maxTotalBytes, grantedBodyBytes(req));
    let bb: busboy.Busboy | undefined;
    let settled = false;
    // A body that stops (or drips) is cut as any other is: it holds a share of the large-body
    // budget (largeBodySlots) that other clients' edits wait for.
    const deadline = bodyDeadline(cfg.idleTimeoutMs, cfg.timeoutMs, (err) => reject(err));

    const onData = (chunk: Buffer): void => {
      deadline.touch();
      total += chunk.length;
      if (total > maxTotal) {
        reject(bodyTooLarge(maxTotal));
        return;
      }
      if (bb && !bb.write(chunk)) {
        req.pause();
        bb.once('drain', () => {
          if (!settled) req.resume();
        });
      }
    };
    const onEnd = (): void => {
      if (!settled) bb?.end();
    };
    const onReqError = (): void => reject(invalid('The request was aborted by the client.', null));
    const onReqClose = (): void => {
      if (!req.complete) onReqError();
    };
    const detachFromRequest = (): void => {
      req.removeListener('data', onData);
      req.removeListener('end', onEnd);
      req.removeListener('error', onReqError);
      req.removeListener('close', onReqClose);
    };

    /** Rejects the request, stops parsing, drops the buffers and discards the rest of the body. */
    const reject = (err: ApiError): void => {
      if (settled) return;
      settled = true;
      deadline.clear();
      detachFromRequest();
      req.on('error', () => {});
      if (bb) {
        const parser = bb;
        parser.on('error', () => {});
        // Not synchronously: this may run inside one of busboy's own event emissions, which
        // continues to use its state after the listener returns. Nothing is fed to it any more.
        process.nextTick(() => {
          parser.removeAllListeners();
          parser.on('error', () => {});
          parser.destroy();
        });
      }
      images.length = 0;
      mask = undefined;
      // Discard (never buffer) whatever still arrives; the error middleware closes the connection after its answer.
      if (!req.complete && !req.destroyed) req.resume();
      next(err);
    };

    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > cfg.maxTotalBytes) {
      reject(bodyTooLarge(cfg.maxTotalBytes));
      return;
    }

    try {
      bb = busboy({
        headers: req.headers,
        defCharset: 'utf8',
        defParamCharset: 'utf8',
        limits: {
          // One more than allowed so that busboy's `limit`/truncation means "over the limit"
          // (busboy flags a file or field that reaches its limit exactly).
          fileSize: cfg.maxFileBytes + 1,
          fieldSize: cfg.maxFieldBytes + 1,
          files: cfg.maxFiles + 1, // + the mask
          fields: cfg.maxFields,
          parts: cfg.maxFiles + 1 + cfg.maxFields + 1,
          headerPairs: HEADER_PAIRS,
        },
      });
    } catch (err) {
      reject(invalid(`Invalid multipart/form-data request: ${(err as Error).message}.`, null));
      return;
    }

    bb.on('file', (name: string | undefined, stream, info) => {
      stream.on('error', () => {});
      if (settled) {
        stream.resume();
        return;
      }
      const fieldname = name ?? '';
      const isImage = isImageFieldName(fieldname);
      if (!isImage && fieldname !== 'mask') {
        reject(invalid(`Unexpected file field '${fieldname}'. Send images as 'image', 'image[]' or 'image_<suffix>' and the mask as 'mask'.`, fieldname || null));
        return;
      }
      const entry: PendingFile = { info: { fieldname, filename: info.filename ?? '', mimeType: info.mimeType }, chunks: [] };
      if (isImage) {
        if (images.length >= cfg.maxFiles) {
          reject(new ApiError(400, 'too_many_images', `Too many images: at most ${cfg.maxFiles} image files per request.`, fieldname));
          return;
        }
        images.push(entry);
      } else {
        if (mask) {
          reject(invalid("Only one 'mask' file is allowed.", 'mask'));
          return;
        }
        mask = entry;
      }
      stream.on('limit', () =>
        reject(new ApiError(413, 'media_too_large', `The file '${fieldname}' exceeds the limit of ${cfg.maxFileBytes} bytes.`, fieldname)),
      );
      stream.on('data', (chunk: Buffer) => {
        if (!settled) entry.chunks.push(chunk);
      });
    });

    bb.on('field', (name: string, value: string, info) => {
      if (settled) return;
      if (isImageFieldName(name) || name === 'mask') {
        reject(invalid(`'${name}' must be a file part (with a filename), not a text field.`, name));
        return;
      }
      if (info.valueTruncated) {
        reject(invalid(`The field '${name}' exceeds the limit of ${cfg.maxFieldBytes} bytes.`, name));
        return;
      }
      if (Object.hasOwn(body, name)) {
        reject(invalid(`The field '${name}' is sent more than once.`, name));
        return;
      }
      // defineProperty: a field named `__proto__` becomes an own (and so rejected) property.
      Object.defineProperty(body, name, { value: coerceField(name, value), enumerable: true, writable: true, configurable: true });
    });

    bb.on('filesLimit', () =>
      reject(new ApiError(400, 'too_many_images', `Too many images: at most ${cfg.maxFiles} image files per request.`, 'image')),
    );
    bb.on('fieldsLimit', () => reject(invalid(`Too many form fields: at most ${cfg.maxFields}.`, null)));
    bb.on('partsLimit', () => reject(invalid('Too many parts in the multipart body.', null)));
    bb.on('error', (err: Error) => reject(invalid(`Invalid multipart/form-data body: ${err.message}.`, null)));
    bb.on('finish', () => {
      if (settled) return;
      settled = true;
      deadline.clear();
      const toImage = (e: PendingFile): UploadedImage => ({ ...e.info, buffer: Buffer.concat(e.chunks) });
      const uploads: UploadedFiles = { images: images.map(toImage), mask: mask ? toImage(mask) : undefined };
      detachFromRequest();
      (req as WithUploads)[UPLOADS] = uploads;
      // `req.files` is typed by @types/multer (pulled in by express-openapi-validator) as Multer files;
      // these are not: read them through uploadedFiles(req).
      (req as unknown as { files: UploadedImage[] }).files = uploads.images;
      req.body = body;
      next();
    });

    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onReqError);
    req.on('close', onReqClose);
  };
}
