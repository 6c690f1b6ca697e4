/**
 * Requests per minute of a key and of its account (issue 32, item 1), counted by
 * rate-limiter-flexible: in Redis when REDIS_URL is set (one count shared by every instance,
 * exact), else in this process's memory (each instance counts its own).
 *
 * Each key and each account is a bucket of N tokens (its limit) that refills whole one minute after
 * its first token of the window was taken: rate-limiter-flexible's counter of N points per 60 s,
 * whose window starts at the first request (a fixed window per client, not per clock minute).
 * A generation request takes one token of its key and one of its account; when either is empty the
 * request is refused, and the tokens it took are given back (a refused request costs the client
 * nothing and does not count). A limit changed by the operator applies to the current window at once: the
 * count is kept per client (one limiter counts everyone), the limit is read per request.
 *
 * When Redis cannot be reached (down, restarting, too slow: 500 ms), each instance counts in memory
 * instead (rate-limiter-flexible's insurance limiter), logged once per outage; requests are never
 * refused, or let through unlimited, because Redis is away.
 */
import { Redis } from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes, type RateLimiterAbstract } from 'rate-limiter-flexible';
import { MAX_REQUESTS_PER_MINUTE } from '../../config.ts';
import type { Logger } from '../../logger.ts';
import type { RequestLimits } from './client-limits.ts';

const WINDOW_SECONDS = 60;

/** What the `x-ratelimit-*-requests` headers say: the bucket closest to empty of the request's key and account. */
export interface RateHeaders {
  limit: number;
  remaining: number;
  /** Milliseconds until that bucket is full again. */
  resetMs: number;
}

export type RateDecision =
  | { allowed: true; headers: RateHeaders | undefined }
  | { allowed: false; headers: RateHeaders; blamed: 'key' | 'account'; limit: number; retryAfterMs: number };

interface Outcome {
  who: 'key' | 'account';
  limit: number;
  res: RateLimiterRes;
  /** Tokens of the window taken, this request's included (until it gives its back). */
  consumed: number;
  allowed: boolean;
}

export interface RequestRateOptions {
  /** REDIS_URL; unset: memory of this process. */
  redisUrl?: string;
  /** REDIS_KEY_PREFIX ('mediagate:'). */
  keyPrefix: string;
  log: Logger;
  /** Longest wait for Redis before counting in memory (ms). */
  redisTimeoutMs?: number;
}

export class RequestRateLimiter {
  private readonly redis: Redis | undefined;
  /**
   * One counter for every client: rate-limiter-flexible fixes `points` per limiter, so it counts up
   * to the largest limit an operator can set and each request compares the count with its own limit.
   */
  private readonly limiter: RateLimiterAbstract;
  private readonly prefix: string;
  private redisDown = false;

  constructor(private readonly opts: RequestRateOptions) {
    this.prefix = `${opts.keyPrefix}rpm`;
    if (opts.redisUrl !== undefined) {
      const timeout = opts.redisTimeoutMs ?? 500;
      this.redis = new Redis(opts.redisUrl, {
        // Fail fast while disconnected: the insurance limiter answers instead of a queue that waits.
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        commandTimeout: timeout,
        connectTimeout: 2_000,
        // The key's and the account's counts go to Redis in one round trip.
        enableAutoPipelining: true,
        retryStrategy: (times) => Math.min(200 * times, 2_000),
      });
      this.redis.on('error', (err: Error) => {
        if (this.redisDown) return;
        this.redisDown = true;
        opts.log.warn({ err: { message: err.message } }, 'Redis is unreachable: request rates are counted by each instance in its own memory until it is back');
      });
      this.redis.on('ready', () => {
        if (!this.redisDown) return;
        this.redisDown = false;
        opts.log.info('Redis is reachable again: request rates are counted across instances');
      });
    }
    const points = MAX_REQUESTS_PER_MINUTE + 1;
    const memory = new RateLimiterMemory({ points, duration: WINDOW_SECONDS, keyPrefix: this.prefix });
    this.limiter = this.redis
      ? new RateLimiterRedis({ storeClient: this.redis, points, duration: WINDOW_SECONDS, keyPrefix: this.prefix, rejectIfRedisNotReady: true, insuranceLimiter: memory })
      : memory;
  }

  /** `redis` when counts are shared by every instance, `memory` when each counts its own. */
  get mode(): 'redis' | 'memory' {
    return this.redis === undefined ? 'memory' : 'redis';
  }

  private async take(who: 'key' | 'account', id: string, limit: number): Promise<Outcome> {
    let res: RateLimiterRes;
    try {
      res = await this.limiter.consume(clientKey(who, id), 1);
    } catch (err) {
      // Past even the largest limit: refused all the same.
      if (!(err instanceof RateLimiterRes)) throw err;
      res = err;
    }
    return { who, limit, res, consumed: res.consumedPoints, allowed: res.consumedPoints <= limit };
  }

  /** Takes one token of the key and one of its account (those that have a limit). */
  async consume(ids: { apiKeyId: string; accountId: string }, limits: RequestLimits): Promise<RateDecision> {
    const keyLimit = limits.key.requestsPerMinute;
    const accountLimit = limits.account.requestsPerMinute;
    if (keyLimit === null && accountLimit === null) return { allowed: true, headers: undefined };
    const pending: Promise<Outcome>[] = [];
    if (keyLimit !== null) pending.push(this.take('key', ids.apiKeyId, keyLimit));
    if (accountLimit !== null) pending.push(this.take('account', ids.accountId, accountLimit));
    const outcomes = await Promise.all(pending);
    const refused = outcomes.filter((o) => !o.allowed);
    if (refused.length > 0) {
      // Every token it took goes back: a refused request costs nothing and counts for nothing.
      await Promise.all(
        outcomes.map(async (o) => {
          await this.limiter.reward(clientKey(o.who, o.who === 'key' ? ids.apiKeyId : ids.accountId), 1).catch(() => undefined);
          o.consumed -= 1;
        }),
      );
      // The bucket that refills last decides when a retry can pass.
      const blame = refused.reduce((a, b) => (b.res.msBeforeNext > a.res.msBeforeNext ? b : a));
      return { allowed: false, headers: headersOf(outcomes), blamed: blame.who, limit: blame.limit, retryAfterMs: blame.res.msBeforeNext };
    }
    return { allowed: true, headers: headersOf(outcomes) };
  }

  async close(): Promise<void> {
    if (!this.redis) return;
    this.redis.removeAllListeners('error');
    this.redis.on('error', () => undefined);
    await this.redis.quit().catch(() => this.redis!.disconnect());
  }
}

const clientKey = (who: 'key' | 'account', id: string) => `${who === 'key' ? 'k' : 'a'}:${id}`;

function headersOf(outcomes: Outcome[]): RateHeaders {
  const remainingOf = (o: Outcome) => Math.max(0, o.limit - o.consumed);
  const tightest = outcomes.reduce((a, b) => {
    const ra = remainingOf(a);
    const rb = remainingOf(b);
    return rb < ra || (rb === ra && b.limit < a.limit) ? b : a;
  });
  return { limit: tightest.limit, remaining: remainingOf(tightest), resetMs: Math.max(0, tightest.res.msBeforeNext) };
}

/** OpenAI's form of `x-ratelimit-reset-requests`: `20ms`, `1.5s`, `1m0s`. */
export function formatReset(ms: number): string {
  const whole = Math.max(0, Math.ceil(ms));
  if (whole < 1_000) return `${whole}ms`;
  const minutes = Math.floor(whole / 60_000);
  const seconds = (whole % 60_000) / 1_000;
  const s = `${Number(seconds.toFixed(3))}s`;
  return minutes > 0 ? `${minutes}m${s}` : s;
}
