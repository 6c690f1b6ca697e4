import { pipeline } from 'node:stream/promises';
import type { AppContext } from '../context.ts';
import type { HandlerMap } from './types.ts';

export function filesHandlers(ctx: AppContext): Pick<HandlerMap, 'getFile'> {
  return {
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
