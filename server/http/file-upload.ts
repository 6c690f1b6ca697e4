/**
 * multipart/form-data parser of `POST /v1/files`: the one file part is streamed into the media
 * store as it arrives (never held in memory) under the upload byte limit, and the text fields go
 * to `req.body` for the contract validator. The stored file is provisional (it expires within the
 * hour) until the handler confirms it; if validation or anything else fails, or the client goes
 * away, it is removed when the response is over. A write the store cannot do (full, failing) ends
 * the request at once with that storage error (507/503): the rest of the body is not read. A body
 * declared longer than a file within the limit and its fields can be is 413 before any of it is read.
 *
 * Each upload holds a place among its API key's uploads in flight on this instance
 * (UPLOADS_IN_FLIGHT_PER_KEY), taken before its body is read and given back when its response is
 * over: a key past its cap is `429 too_many_in_flight` at once, its body unread. The key's requests
 * per minute are taken before this (http/request-rate.ts), as for a generation. A client that goes
 * away while its upload waits for its turn to be decoded (image-inspect.ts) gives that turn up.
 */
import busboy from 'busboy';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { ApiError, badRequest, returningRateToken } from '../errors.ts';
import { MediaTooLarge, StorageError, type FileRow, type FileService } from '../services/file.service.ts';
import { IN_FLIGHT_RETRY_AFTER_SECONDS } from '../services/limits/client-limits.ts';
import { authOf } from './auth.ts';
import { bodyDeadline } from './request-guards.ts';

export interface UploadLimits {
  maxFileBytes: number;
  idleTimeoutMs: number;
  timeoutMs: number;
}

const MAX_FIELDS = 8;
const MAX_FIELD_BYTES = 1024;
/** Characters (code points, as the column's check and the contract count them) of a file name kept. */
const MAX_FILENAME_CHARS = 255;
/** Bytes of one part's boundary line and headers at most: busboy allows 16 KiB of headers, a boundary is at most 70 characters. */
const MAX_PART_FRAMING_BYTES = 16 * 1024 + 80;
/**
 * What an accepted body can hold besides its file's bytes: at most MAX_FIELDS text fields of
 * MAX_FIELD_BYTES, and the framing of their parts, of the file's part and of the closing boundary
 * (counted as one more part): 169 KiB. A declared Content-Length over the upload limit plus this
 * cannot carry a file within the limit (a preamble or epilogue, which no client sends, is not counted).
 */
const MAX_NON_FILE_BYTES = MAX_FIELDS * MAX_FIELD_BYTES + (MAX_FIELDS + 2) * MAX_PART_FRAMING_BYTES;

/**
 * Uploads one API key may have in flight at once on an instance, from before the body is read until
 * the answer. Each ends in a full decode, of which the process runs MAX_FULL_DECODES (2) at once:
 * four lets a key keep both decode turns busy while its next two bodies arrive, and puts at most
 * four of its uploads ahead of another account's in that queue. A client sending several frames or
 * images in parallel (a browser uploads a few at a time) is not held back.
 */
export const UPLOADS_IN_FLIGHT_PER_KEY = 4;

/** `429 too_many_in_flight` of a key at its cap of uploads in flight. */
function tooManyUploads(): ApiError {
  // Refused before the body is read: its request-per-minute token goes back.
  return returningRateToken(new ApiError(
    429,
    'too_many_in_flight',
    `This API key already has ${UPLOADS_IN_FLIGHT_PER_KEY} uploads in flight, its limit; retry when one of them has been answered.`,
    null,
    {},
    { 'Retry-After': String(IN_FLIGHT_RETRY_AFTER_SECONDS) },
  ));
}

/**
 * The name an upload is kept and later downloaded under, from the one the client sent: control
 * characters (C0, DEL, C1; busboy decodes `filename*=UTF-8''a%00b.png` to a NUL) become `_`, as
 * they must never reach a `Content-Disposition` and PostgreSQL refuses a NUL in the row; lone
 * surrogates (no character at all, and refused by PostgreSQL too) are dropped; and the name is cut
 * to 255 code points, never inside a surrogate pair (a `slice` of UTF-16 units halved an emoji).
 */
export function uploadFileName(given: string): string {
  return Array.from(given.replace(/\p{Cc}/gu, '_').replace(/\p{Cs}/gu, ''))
    .slice(0, MAX_FILENAME_CHARS)
    .join('');
}

const UPLOAD = Symbol('mediagate.upload');
type WithUpload = Request & { [UPLOAD]?: { file: FileRow; confirmed: boolean; signal: AbortSignal } };

/**
 * The file `fileUploadMultipart` stored for this request; the handler confirms it. `signal` aborts
 * when the response is over (the client gone, if the handler is still at work).
 */
export function uploadOf(req: Request): { file: FileRow; confirm(): void; signal: AbortSignal } | undefined {
  const upload = (req as WithUpload)[UPLOAD];
  return upload && { file: upload.file, confirm: () => void (upload.confirmed = true), signal: upload.signal };
}

export function fileUploadMultipart(files: FileService, limits: UploadLimits): RequestHandler {
  /** Uploads in flight per API key id on this instance (keys with none are not kept). */
  const perKey = new Map<string, number>();
  /** A place among the key's uploads in flight, or undefined at its cap: a refusal, not a queue. */
  const takePlace = (apiKeyId: string): (() => void) | undefined => {
    const ofKey = perKey.get(apiKeyId) ?? 0;
    if (ofKey >= UPLOADS_IN_FLIGHT_PER_KEY) return undefined;
    perKey.set(apiKeyId, ofKey + 1);
    let given = false;
    return () => {
      if (given) return;
      given = true;
      const left = (perKey.get(apiKeyId) ?? 1) - 1;
      if (left > 0) perKey.set(apiKeyId, left);
      else perKey.delete(apiKeyId);
    };
  };

  return (req: Request, res: Response, next: NextFunction): void => {
    if (!/^\s*multipart\/form-data\s*(;|$)/i.test(String(req.headers['content-type'] ?? ''))) return next();
    const { accountId, apiKeyId } = authOf(req);
    const body: Record<string, string> = {};
    let saving: Promise<FileRow> | undefined;
    let settled = false;
    let deadline: ReturnType<typeof bodyDeadline> | undefined;
    const tooLarge = () => new ApiError(413, 'media_too_large', `The file exceeds the limit of ${limits.maxFileBytes} bytes.`, 'file');

    res.once('close', () => {
      void saving?.then(
        async (file) => {
          const upload = (req as WithUpload)[UPLOAD];
          if (!upload?.confirmed) await files.discard(file).catch(() => undefined);
        },
        () => undefined, // nothing was kept
      );
    });

    let bb: busboy.Busboy | undefined;
    const finish = (err?: ApiError | StorageError) => {
      if (settled) return;
      settled = true;
      deadline?.clear();
      req.unpipe(bb);
      if (err) {
        // Ends the file part too (busboy destroys it with the error): the store's write fails and
        // drops what it wrote (its temporary file, its multipart upload) instead of waiting forever
        // for bytes that will not come. Not synchronously: this may run inside one of busboy's own
        // event emissions ('limit'), after which busboy still uses the part it would have dropped.
        const parser = bb;
        if (parser) process.nextTick(() => parser.destroy(err));
        // Discard (never buffer) what still arrives; the error middleware closes the connection after its answer.
        if (!req.complete && !req.destroyed) req.resume();
        next(err);
        return;
      }
      saving!.then(
        (file) => {
          (req as WithUpload)[UPLOAD] = { file, confirmed: false, signal: gone.signal };
          req.body = body;
          next();
        },
        // Past the limit is the client's; the store's own failures (StorageError) and the rest are not.
        (e: unknown) => next(e instanceof MediaTooLarge ? tooLarge() : e),
      );
    };

    // A body declared too long for any file within the limit is refused before a byte of it is
    // stored, instead of once the limit's worth has been streamed into the store.
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > limits.maxFileBytes + MAX_NON_FILE_BYTES) {
      finish(tooLarge());
      return;
    }

    // A client that left during an earlier async step (the key lookup, the rate gate) had its
    // 'close' already: a place taken now would never be given back. Nobody is left to answer.
    if (res.destroyed || req.socket.destroyed) return;
    const givePlaceBack = takePlace(apiKeyId);
    // Refused before a byte of the body is read: the error middleware closes the connection after
    // its answer instead of reading a large body.
    if (!givePlaceBack) return next(tooManyUploads());
    const gone = new AbortController();
    res.once('close', () => {
      givePlaceBack();
      gone.abort(badRequest('invalid_request', 'The client went away before its upload was checked.'));
    });

    try {
      bb = busboy({
        headers: req.headers,
        defCharset: 'utf8',
        // Filenames as the client's UTF-8 (curl, browsers), not Latin-1: `фото.png` stays `фото.png`.
        defParamCharset: 'utf8',
        limits: { files: 2, fileSize: limits.maxFileBytes + 1, fields: MAX_FIELDS, fieldSize: MAX_FIELD_BYTES + 1, parts: MAX_FIELDS + 2, headerPairs: 16 },
      });
    } catch (err) {
      finish(badRequest('invalid_request', `Invalid multipart/form-data request: ${(err as Error).message}.`));
      return;
    }
    bb.on('file', (name, stream, info) => {
      stream.on('error', () => undefined);
      if (settled || saving || name !== 'file') {
        stream.resume();
        finish(badRequest('invalid_request', name === 'file' ? "Send one 'file' part only." : `Unexpected file field '${name}'; send the file as 'file'.`, name));
        return;
      }
      // Over the limit: answer 413 now, without reading the rest (the store drops what it wrote).
      stream.on('limit', () => {
        stream.destroy(new MediaTooLarge(limits.maxFileBytes));
        finish(tooLarge());
      });
      const filename = uploadFileName(info.filename ?? '');
      saving = files.save({ accountId, purpose: 'upload', contentType: 'application/octet-stream', filename, expiresAt: new Date(Date.now() + 3_600_000) }, stream, { maxBytes: limits.maxFileBytes });
      // The store failed (full, I/O): answer now instead of waiting for a body it no longer reads.
      // Any other outcome is observed by finish() or the close hook.
      saving.catch((err: unknown) => err instanceof StorageError && finish(err));
    });
    bb.on('field', (name, value, info) => {
      if (settled) return;
      if (name === 'file') return finish(badRequest('invalid_request', "'file' must be a file part (with a filename), not a text field.", 'file'));
      if (info.valueTruncated) return finish(badRequest('invalid_request', `The field '${name}' exceeds ${MAX_FIELD_BYTES} bytes.`, name));
      if (Object.hasOwn(body, name)) return finish(badRequest('invalid_request', `The field '${name}' is sent more than once.`, name));
      Object.defineProperty(body, name, { value, enumerable: true, writable: true, configurable: true });
    });
    bb.on('fieldsLimit', () => finish(badRequest('invalid_request', `Too many form fields: at most ${MAX_FIELDS}.`)));
    bb.on('partsLimit', () => finish(badRequest('invalid_request', 'Too many parts in the multipart body.')));
    bb.on('error', (err: Error) => finish(badRequest('invalid_request', `Invalid multipart/form-data body: ${err.message}.`)));
    bb.on('close', () => {
      if (settled) return;
      if (!saving) return finish(badRequest('invalid_request', "The request has no 'file' part.", 'file'));
      finish();
    });

    const armed = bodyDeadline(limits.idleTimeoutMs, limits.timeoutMs, finish);
    deadline = armed;
    req.on('data', armed.touch);
    // The idle limit is the client's: the pipe pauses the request while the store is slow to take
    // the file (a stalled S3 part upload), and once the whole body has arrived only the store's
    // writes are left. Neither is time the client could send in: once the body is whole, neither
    // limit runs any more (the store's own timeouts bound its writes).
    req.on('pause', armed.pause);
    req.on('resume', armed.touch);
    req.once('end', armed.clear);
    req.once('close', () => {
      if (!req.complete) finish(badRequest('invalid_request', 'The client went away before the request body was complete.'));
    });
    req.pipe(bb);
  };
}
