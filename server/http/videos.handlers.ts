import type { AppContext } from '../context.ts';
import { ApiError } from '../errors.ts';
import { authOf, noStore } from './auth.ts';
import { stagingOf } from './media-body.ts';
import { sendJson, type HandlerMap, type OperationHandler } from './types.ts';

export function videosHandlers(ctx: AppContext): Pick<HandlerMap, 'getVideoCapabilities' | 'createVideo' | 'createVideoApiV1' | 'createVideoLegacyPath' | 'getVideo' | 'listVideos'> {
  const create: OperationHandler<'createVideo'> = async (req, res) => {
    // Before the service runs, so that its errors carry it too (a 409 quote_stale holds a quote bound to the key).
    noStore(res);
    const task = await ctx.services.videos.create(authOf(req), req.body, stagingOf(req, ctx.services.files));
    // 202 both for a new task and for an idempotent retry (product spec §4.6 rule 3).
    sendJson(res, 'createVideo', 202, task);
  };
  return {
    async getVideoCapabilities(req, res) {
      noStore(res);
      sendJson(res, 'getVideoCapabilities', 200, await ctx.services.videos.capabilities(authOf(req)));
    },
    createVideo: create,
    createVideoApiV1: create as unknown as OperationHandler<'createVideoApiV1'>,
    createVideoLegacyPath() {
      throw new ApiError(404, 'video_creation_endpoint_moved', 'POST /v1/videos is not a video creation endpoint; use POST /v1/videos/generations.');
    },
    async listVideos(req, res) {
      const page = await ctx.services.videos.list(authOf(req), req.query);
      noStore(res);
      sendJson(res, 'listVideos', 200, page);
    },
    async getVideo(req, res) {
      noStore(res);
      sendJson(res, 'getVideo', 200, await ctx.services.videos.get(authOf(req), req.params.id));
    },
  };
}
