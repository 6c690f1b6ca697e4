/**
 * The Files API in OpenAI's shape: POST /v1/files (a reusable media input), GET /v1/files (list),
 * GET /v1/files/{file_id} (the file object with the key; the bytes for a signed URL),
 * GET /v1/files/{file_id}/content (the bytes with the key), DELETE /v1/files/{file_id}. HEAD on
 * both GETs answers as they do, without a body (and without reading the bytes).
 */
import type { Readable } from 'node:stream';
import type { Request, Response } from 'express';
import type { AppContext } from '../context.ts';
import { ApiError, badRequest } from '../errors.ts';
import { StorageError } from '../storage/storage-error.ts';
import { pipeBounded } from '../lib/base64-json.ts';
import type { Logger } from '../logger.ts';
import { toApiFile, type OpenedFile } from '../services/file.service.ts';
import { authOf, hasAuth, noStore } from './auth.ts';
import { uploadOf } from './file-upload.ts';
import type { HandlerMap } from './types.ts';
import { sendJson, type Schemas } from './types.ts';

/**
 * The one byte range a `Range` header asks for in a file of `size` bytes (RFC 9110 §14): `whole`
 * when there is none to honour (no header, another unit, a malformed or reversed spec, several
 * ranges: answered with the whole file, as RFC 9110 allows), `unsatisfiable` when it starts past
 * the end (416). A suffix longer than the file (`bytes=-1000` of 236 bytes) is the whole file.
 */
export function byteRange(header: string | undefined, size: number): { start: number; end: number } | 'whole' | 'unsatisfiable' {
  const m = header === undefined ? null : /^bytes=\s*(\d*)-(\d*)\s*$/i.exec(header.trim());
  if (!m || (m[1] === '' && m[2] === '')) return 'whole';
  if (m[1] === '') {
    const suffix = Number(m[2]);
    if (suffix === 0 || size === 0) return 'unsatisfiable';
    return { start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(m[1]);
  if (m[2] !== '' && Number(m[2]) < start) return 'whole';
  if (start >= size) return 'unsatisfiable';
  return { start, end: m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1) };
}

/**
 * The contract's `File.content_type`: the types a file is served as, inline. Any other one (a file
 * stored before its type was checked) is sent as bytes to save, never rendered on this origin.
 */
const INLINE_TYPES: Record<Schemas['File']['content_type'], true> = { 'image/png': true, 'image/jpeg': true, 'image/webp': true, 'image/gif': true, 'video/mp4': true };

/**
 * Sends a stored file, streamed (never buffered: videos can be large): whole, or the one byte
 * range a `Range` header asks for (206; a video seeks in a browser), with the validators a cache
 * and a download tool need — a file never changes, so its id is a strong `ETag` — and `304` for a
 * copy the client already has, checked before the range (RFC 9110 §13.2.2). Several ranges in one
 * request are answered with the whole file (allowed by RFC 9110), an unsatisfiable one with `416`.
 * A HEAD gets the whole file's header fields and no body: the store is never asked for the bytes
 * (S3 would start sending a whole video), and its `Range` is ignored (RFC 9110 §14.2: GET only).
 * The answer is committed once the store has its first bytes (`started`): a read that fails before
 * them is the error middleware's to answer (503 storage_unavailable; 404 when the file was deleted
 * meanwhile: a delete commits its row before it removes the bytes). A client that takes none of
 * the bytes for `stall.idleMs` is cut off (`pipeBounded`), and the store's stream it held open (a
 * file descriptor, a socket of the S3 read client) closed with it.
 */
async function sendFile(req: Pick<Request, 'headers' | 'method'> & { id?: string }, res: Response, opened: OpenedFile, cacheControl: string, stall: { idleMs: number; log: Logger }): Promise<void> {
  const { file, stored, name } = opened;
  const head = req.method === 'HEAD';
  const etag = `"${file.id}"`;
  const validators = () => {
    res.setHeader('Cache-Control', cacheControl);
    res.setHeader('ETag', etag);
    res.setHeader('Last-Modified', stored.modifiedAt.toUTCString());
    res.setHeader('Accept-Ranges', 'bytes');
    // The type said is the type meant: a browser never guesses another one (HTML) from the bytes.
    res.setHeader('X-Content-Type-Options', 'nosniff');
  };
  // A copy the client already has (If-None-Match naming this file's ETag, or `*`): nothing to send.
  const ifNoneMatch = req.headers['if-none-match'];
  if (ifNoneMatch !== undefined && ifNoneMatch.split(',').some((tag) => ['*', etag].includes(tag.trim().replace(/^W\//, '')))) {
    validators();
    res.status(304).end();
    return;
  }
  // If-Range: the range only applies to the copy the client names (a file never changes: its ETag).
  const ifRange = req.headers['if-range'];
  const range = !head && (ifRange === undefined || ifRange === etag) ? byteRange(req.headers.range, stored.bytes) : 'whole';
  if (range === 'unsatisfiable') {
    validators();
    throw new ApiError(416, 'range_not_satisfiable', `The range asked for is outside the file's ${stored.bytes} bytes.`, null, {}, { 'Content-Range': `bytes */${stored.bytes}` });
  }
  const source = head ? undefined : opened.read(range === 'whole' ? undefined : range);
  // Nothing of the file's is set before its bytes are there: a failure is answered as any error,
  // or as the file's absence when it was deleted meanwhile (its bytes went first): no store outage.
  if (source && !(await started(source, res).catch(async (err: unknown) => {
    if (err instanceof StorageError && (await opened.deleted())) throw new ApiError(404, 'file_not_found', 'No such file: it was deleted.');
    throw err;
  }))) return;
  validators();
  const inline = Object.hasOwn(INLINE_TYPES, file.contentType);
  res.setHeader('Content-Type', inline ? file.contentType : 'application/octet-stream');
  // An ASCII fallback and the name itself in UTF-8 (RFC 6266): a header cannot carry non-Latin-1 text.
  // One `_` per character (`u`): an emoji is one, not one per UTF-16 unit.
  const ascii = name.replace(/[^\x20-\x7e]/gu, '_').replace(/["\\]/g, '');
  res.setHeader('Content-Disposition', `${inline ? 'inline' : 'attachment'}; filename="${ascii}"${ascii === name ? '' : `; filename*=UTF-8''${encodeURIComponent(name)}`}`);
  if (range === 'whole') {
    res.status(200);
    res.setHeader('Content-Length', String(stored.bytes));
  } else {
    res.status(206);
    res.setHeader('Content-Range', `bytes ${range.start}-${range.end}/${stored.bytes}`);
    res.setHeader('Content-Length', String(range.end - range.start + 1));
  }
  if (!source) {
    res.end();
    return;
  }
  await pipeBounded(source, res, stall.idleMs, (err) => stall.log.warn({ reqId: req.id, fileId: file.id, err: err.message }, 'download cut off: its client stopped reading'));
}

/**
 * Waits for the store's first bytes (or the end of an empty file) before a download commits its
 * status: pipeline() would destroy a response whose head was not sent yet, and a read failing first
 * (S3 answering 503 after the HEAD passed, an object removed meanwhile) left the client a closed
 * connection. Rejects with that failure; resolves false when the client went away meanwhile (the
 * read is ended). Costs one event: the bytes stay in the stream's buffer for the pipe.
 */
function started(source: Readable, res: Response): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => {
    const settle = (outcome: () => void) => {
      source.off('readable', onReadable);
      res.off('close', onClose);
      outcome();
    };
    const onReadable = () => settle(() => resolve(true));
    const onClose = () =>
      settle(() => {
        source.destroy();
        resolve(false);
      });
    // Kept after the first bytes (once settled it does nothing): an error emitted before the pipe
    // has its own listener must not go unheard; the pipe hears it too.
    source.once('error', (err) => settle(() => reject(err)));
    source.on('readable', onReadable);
    res.once('close', onClose);
  });
}

type FilesOperation = 'createFile' | 'listFiles' | 'getFile' | 'headFile' | 'getFileContent' | 'headFileContent' | 'deleteFile';

export function filesHandlers(ctx: AppContext): Pick<HandlerMap, FilesOperation> {
  const { config } = ctx;
  const files = ctx.services.files;
  /**
   * A download waits for a client that stops reading as long as a JSON answer carrying images
   * does (images.handlers.ts): ten times STREAM_WRITE_IDLE_MS. A slow client on a poor network
   * still gets a whole video; one that took nothing for that long no longer holds the store's stream.
   */
  const stall = { idleMs: config.streamWriteIdleMs * 10, log: ctx.log };
  const handlers: Omit<Pick<HandlerMap, FilesOperation>, 'headFile' | 'headFileContent'> = {
    async createFile(req, res) {
      const upload = uploadOf(req);
      if (!upload) throw badRequest('invalid_request', "The request has no 'file' part.", 'file');
      const given = req.body['expires_after[seconds]'];
      const seconds = given === undefined ? config.uploadDefaultExpirySeconds : Number(given);
      if (!(seconds >= 3600 && seconds <= config.uploadMaxExpirySeconds)) {
        throw badRequest('invalid_expires_after', `expires_after[seconds] must be 3600 to ${config.uploadMaxExpirySeconds}; got ${given}.`, 'expires_after[seconds]');
      }
      // A client gone while its upload waits for its turn to be decoded gives that turn up.
      const file = await files.confirmUpload(upload.file, seconds, upload.signal);
      upload.confirm();
      ctx.log.info({ fileId: file.id, accountId: authOf(req).accountId, bytes: file.bytes, expiresAt: file.expiresAt }, 'file uploaded');
      noStore(res);
      sendJson(res, 'createFile', 201, toApiFile(file));
    },

    async listFiles(req, res) {
      const page = await files.listOwned(authOf(req).accountId, req.query);
      noStore(res);
      sendJson(res, 'listFiles', 200, page);
    },

    async getFile(req, res) {
      const { expires, signature } = req.query;
      if (expires !== undefined || signature !== undefined) {
        if (expires === undefined || signature === undefined) {
          const missing = expires === undefined ? 'expires' : 'signature';
          throw badRequest('invalid_request', `A signed URL carries both 'expires' and 'signature': '${missing}' is missing. Send the URL unchanged, or neither parameter (with the API key) for the file object.`, missing);
        }
        // The signed URL is the credential: a key sent along is not needed and not looked at.
        const opened = await files.open(req.params.file_id, expires, signature);
        await sendFile(req, res, opened, `private, max-age=${opened.maxAgeSeconds}`, stall);
        return;
      }
      // The contract lets this operation through without a key (for signed URLs); without a
      // signature one is required, and authenticating again gives its precise error (401, 403, 503).
      const auth = hasAuth(req) ? authOf(req) : await ctx.services.auth.authenticate(req.headers.authorization);
      const file = await files.describeOwned(req.params.file_id, auth.accountId);
      noStore(res);
      sendJson(res, 'getFile', 200, file);
    },

    async getFileContent(req, res) {
      await sendFile(req, res, await files.openOwned(req.params.file_id, authOf(req).accountId), 'no-store', stall);
    },

    async deleteFile(req, res) {
      const { accountId } = authOf(req);
      const left = await files.deleteOwned(req.params.file_id, accountId);
      // A completed task whose video this was answers without it from now on, here at once (others
      // when the database's notification arrives).
      ctx.services.videos.invalidateCaches();
      ctx.log.info({ fileId: req.params.file_id, accountId }, 'file deleted');
      if (left.length > 0) ctx.log.warn({ fileId: req.params.file_id, objects: left }, "could not delete a deleted file's bytes; the media sweep tries them again every minute");
      noStore(res);
      sendJson(res, 'deleteFile', 200, { id: req.params.file_id, object: 'file', deleted: true });
    },
  };
  // A HEAD is its GET: Node sends no body for it, and sendFile does not read the bytes.
  return {
    ...handlers,
    headFile: (req, res, next) => handlers.getFile(req, res, next),
    headFileContent: (req, res, next) => handlers.getFileContent(req, res, next),
  };
}
