/**
 * The poll of one task (`GET /v1/videos/{id}`, `GET /v1/images/{task_id}`), the request a client
 * repeats most, served ahead of the body parsers and the contract validator. Only requests the
 * validator would pass unchanged take this path: no query string, an id of the gateway's own form
 * (`vid_…`, `img_…`; the contract's 1–128 characters, nothing to decode). The caller is
 * authenticated as the validator's security handler does it (the key cache), and the operation's
 * own handler answers, so the body, headers, errors (the error middleware) and the access log's
 * operation label are those of the validated route. Everything else goes on through the pipeline.
 */
import type { NextFunction, Request, Response } from 'express';
import type { AppContext } from '../context.ts';
import { rememberAuthError } from './error-middleware.ts';
import { setAuth } from './auth.ts';
import type { HandlerMap } from './types.ts';

const POLL = /^\/v1\/(?:videos\/(vid_[A-Za-z0-9_-]{1,124})|images\/(img_[A-Za-z0-9_-]{1,124}))$/;

export function taskPollFastPath(ctx: AppContext, handlers: Pick<HandlerMap, 'getVideo' | 'getImageTask'>) {
  const video = { schema: { operationId: 'getVideo' } };
  const image = { schema: { operationId: 'getImageTask' } };
  return (req: Request, res: Response, next: NextFunction): void => {
    if (req.method !== 'GET') return next();
    const m = POLL.exec(req.url);
    if (!m) return next();
    const videoId = m[1];
    // What the validator leaves for the access log and the error middleware.
    (req as Request & { openapi?: unknown }).openapi = videoId ? video : image;
    ctx.services.auth.authenticate(req.headers.authorization).then(
      async (auth) => {
        setAuth(req, auth);
        if (videoId) {
          req.params = { id: videoId };
          await handlers.getVideo(req as never, res, next);
        } else {
          req.params = { task_id: m[2]! };
          await handlers.getImageTask(req as never, res, next);
        }
      },
      (err: unknown) => {
        rememberAuthError(req, err);
        throw err;
      },
    ).catch(next);
  };
}
