/**
 * The requests-per-minute gate of the generation operations (image generations and edits, video
 * creation at both paths), of uploads (`POST /v1/files`: each is stored and decoded whole, and costs
 * no credit) and of test webhook events (each holds an outbound connection for up to
 * WEBHOOK_TIMEOUT_MS): the key's buckets bound how often it may start one. Run right after the API
 * key check and before the body is read: a refused request reads nothing (the error middleware
 * closes its connection after the answer instead of reading the body), stores nothing and holds
 * nothing. Every response of these operations to a key or account with a limit carries OpenAI's
 * `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests` and `x-ratelimit-reset-requests`
 * (events streams and errors included: they are set before anything is written). A request then
 * refused for a cap on what is in flight (`429 too_many_in_flight`: generations, uploads, webhook
 * tests, an account's share of large bodies) gets its tokens back (`RequestRateLimiter.giveBack`).
 */
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { rateLimited } from '../services/limits/client-limits.ts';
import { formatReset, type RateHeaders, type RequestRateLimiter } from '../services/limits/request-rate.ts';
import { errorCodeOf } from './access-log.ts';
import { authOf, hasAuth } from './auth.ts';

const GENERATION_PATHS = ['/v1/images/generations', '/v1/images/edits', '/v1/videos/generations', '/api/v1/videos/generations'];
/** The paths whose requests take a token of the key's and the account's buckets. */
export const RATED_PATHS = [...GENERATION_PATHS, '/v1/files', '/v1/webhooks/test'];

export function setRateHeaders(res: Response, h: RateHeaders): void {
  res.setHeader('x-ratelimit-limit-requests', String(h.limit));
  res.setHeader('x-ratelimit-remaining-requests', String(h.remaining));
  res.setHeader('x-ratelimit-reset-requests', formatReset(h.resetMs));
}

export function requestRateGate(limiter: RequestRateLimiter): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    // Without a key the credentials check has already answered 401.
    if (!hasAuth(req)) return next();
    const auth = authOf(req);
    limiter.consume(auth, auth.limits).then((decision) => {
      if (decision.headers) setRateHeaders(res, decision.headers);
      if (decision.allowed && decision.headers) {
        res.once('finish', () => {
          if (res.statusCode === 429 && errorCodeOf(res) === 'too_many_in_flight') void limiter.giveBack(auth, auth.limits);
        });
      }
      if (decision.allowed) next();
      else next(rateLimited(decision.blamed, decision.limit, decision.retryAfterMs));
    }, next);
  };
}
