/**
 * The Files API in OpenAI's shape: POST /v1/files (a reusable media input), GET /v1/files (list),
 * GET /v1/files/{file_id} (the file object with the key; the bytes for a signed URL),
 * GET /v1/files/{file_id}/content (the bytes with the key), DELETE /v1/files/{file_id}.
 */
import type { Response } from 'express';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { AppContext } from '../context.ts';
import { badRequest } from '../errors.ts';
import { toApiFile } from '../services/file.service.ts';
import { authOf, hasAuth, noStore } from './auth.ts';
import { uploadOf } from './file-upload.ts';
import type { HandlerMap } from './types.ts';
import { sendJson } from './types.ts';

/** Streams stored bytes (never buffered: videos can be large) with their type and length. */
async function sendBytes(res: Response, file: { contentType: string; bytes: number }, stream: Readable, cacheControl: string): Promise<void> {
  res.status(200);
  res.setHeader('Content-Type', file.contentType);
  res.setHeader('Content-Length', String(file.bytes));
  res.setHeader('Cache-Control', cacheControl);
  await pipeline(stream, res);
}

export function filesHandlers(ctx: AppContext): Pick<HandlerMap, 'createFile' | 'listFiles' | 'getFile' | 'getFileContent' | 'deleteFile'> {
  const { config } = ctx;
  const files = ctx.services.files;
  return {
    async createFile(req, res) {
      const upload = uploadOf(req);
      if (!upload) throw badRequest('invalid_request', "The request has no 'file' part.", 'file');
      const given = req.body['expires_after[seconds]'];
      const seconds = given === undefined ? config.uploadDefaultExpirySeconds : Number(given);
      if (!(seconds >= 3600 && seconds <= config.uploadMaxExpirySeconds)) {
        throw badRequest('invalid_expires_after', `expires_after[seconds] must be 3600 to ${config.uploadMaxExpirySeconds}; got ${given}.`, 'expires_after[seconds]');
      }
      const file = await files.confirmUpload(upload.file, seconds);
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
        const { file, stream, maxAgeSeconds } = await files.open(req.params.file_id, expires, signature);
        await sendBytes(res, file, stream, `private, max-age=${maxAgeSeconds}`);
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
      const { file, stream } = await files.openOwned(req.params.file_id, authOf(req).accountId);
      await sendBytes(res, file, stream, 'no-store');
    },

    async deleteFile(req, res) {
      const { accountId } = authOf(req);
      await files.deleteOwned(req.params.file_id, accountId);
      ctx.log.info({ fileId: req.params.file_id, accountId }, 'file deleted');
      noStore(res);
      sendJson(res, 'deleteFile', 200, { id: req.params.file_id, object: 'file', deleted: true });
    },
  };
}
