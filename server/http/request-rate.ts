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
 * refused for a cap on what is in flight before it cost anything (`429 too_many_in_flight` of the
 * upload or webhook-test cap or an account's share of large bodies, its body unread; of a hold with
 * no media inputs) gets its tokens back (`ApiError.rateTokenBack`, `RequestRateLimiter.giveBack`):
 * a client that follows its `Retry-After: 1` does not spend its minute waiting for a place. One that
 * read, stored or fetched media first keeps its token spent: the rate bounds how often it can.
 */

import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { rateLimited } from '../services/limits/client-limits.ts';
import { formatReset, type RateHeaders, type RequestRateLimiter } from '../services/limits/request-rate.ts';
import { authOf, hasAuth } from './auth.ts';

const GIVE_BACK = 'giveBackRateToken';

/** Gives back the request's request-per-minute tokens, if the gate took any (the error middleware, for a refusal marked so). */
export function giveBackRateToken(res: Response): void {
  (res.locals[GIVE_BACK] as (() => void) | undefined)?.();
}

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
      // For the error middleware, should the request be refused before it cost anything (ApiError.rateTokenBack).
      if (decision.allowed && decision.headers) res.locals[GIVE_BACK] = () => void limiter.giveBack(auth, auth.limits);
      if (decision.allowed) next();
      else next(rateLimited(decision.blamed, decision.limit, decision.retryAfterMs));
    }, next);
  };
}
