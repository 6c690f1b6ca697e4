/** POST /v1/files (a reusable media input), GET /v1/files/{file_id} (a signed download URL). */
import { pipeline } from 'node:stream/promises';
import type { AppContext } from '../context.ts';
import { badRequest } from '../errors.ts';
import { authOf, noStore } from './auth.ts';
import { uploadOf } from './file-upload.ts';
import type { HandlerMap } from './types.ts';
import { sendJson } from './types.ts';

export function filesHandlers(ctx: AppContext): Pick<HandlerMap, 'createFile' | 'getFile'> {
  const { config } = ctx;
  return {
    async createFile(req, res) {
      const upload = uploadOf(req);
      if (!upload) throw badRequest('invalid_request', "The request has no 'file' part.", 'file');
      const given = req.body['expires_after[seconds]'];
      const seconds = given === undefined ? config.uploadDefaultExpirySeconds : Number(given);
      if (!(seconds >= 3600 && seconds <= config.uploadMaxExpirySeconds)) {
        throw badRequest('invalid_expires_after', `expires_after[seconds] must be 3600 to ${config.uploadMaxExpirySeconds}; got ${given}.`, 'expires_after[seconds]');
      }
      const file = await ctx.services.files.confirmUpload(upload.file, seconds);
      upload.confirm();
      ctx.log.info({ fileId: file.id, accountId: authOf(req).accountId, bytes: file.bytes, expiresAt: file.expiresAt }, 'file uploaded');
      noStore(res);
      sendJson(res, 'createFile', 201, {
        id: file.id,
        object: 'file',
        purpose: 'input',
        filename: file.filename ?? '',
        bytes: file.bytes,
        content_type: file.contentType as 'image/png',
        width: file.width!,
        height: file.height!,
        created_at: file.createdAt.toISOString(),
        expires_at: file.expiresAt!.toISOString(),
      });
    },

    async getFile(req, res) {
      const { file, stream, maxAgeSeconds } = await ctx.services.files.open(req.params.file_id, req.query.expires, req.query.signature);
      res.status(200);
      res.setHeader('Content-Type', file.contentType);
      res.setHeader('Content-Length', String(file.bytes));
      res.setHeader('Cache-Control', `private, max-age=${maxAgeSeconds}`);
      // Streamed, never buffered: videos can be large.
      await pipeline(stream, res);
    },
  };
}
