/**
 * Requests per minute of a key and of its account (issue 32, item 1): counted in Redis when
 * REDIS_URL is set (one count shared by every instance, exact), else in this process's memory (each
 * instance counts its own).
 *
 * Each key and each account is a bucket of N tokens (its limit) that refills whole one minute after
 * the first token of its window was taken (a fixed window per client, not per clock minute). A
 * generation request looks at both buckets and, in the same step, either takes one token of each or,
 * when either is empty, is refused and takes none: a refused request costs the client nothing,
 * counts for nothing, and never holds a token another request could have used. In Redis that step is
 * one Lua script (atomic: no other request and no end of a window falls between the look and the
 * take); in memory it is synchronous. (rate-limiter-flexible, used before, counts one key per call:
 * a refused request's tokens could only be given back afterwards, which held a sibling key's account
 * tokens meanwhile and, at the end of a window, started the next one below zero.) A limit changed
 * by the operator applies to the current window at once: the count is kept per client, the limit is
 * read per request.
 *
 * When Redis cannot be reached (down, restarting, too slow: 500 ms) or refuses the script (READONLY,
 * OOM, NOPERM), each instance counts in memory instead, logged once per outage (and once when Redis
 * answers again: a command succeeds, or, when the connection was lost, it is ready again); requests
 * are never refused, or let through unlimited, because Redis is away. The memory windows start
 * from the counts Redis last reported to this instance, so a key that used its minute in Redis does
 * not get it again. Once that is an outage, Redis is asked again by one request every few seconds,
 * not by each: a Redis that hangs with its connection up would otherwise cost every request the
 * whole timeout; and a connection whose commands keep timing out is replaced.
 * Until the connection is first ready (start-up) requests count in memory without asking.
 */
import { Redis, type Result } from 'ioredis';
import type { Logger } from '../../logger.ts';
import type { RequestLimits } from './client-limits.ts';

const WINDOW_MS = 60_000;

/**
 * KEYS: the request's counters (its key's, its account's); ARGV: their limits, then the window (ms).
 * When a counter is at its limit nothing is written; else each gets one more, a new one expiring one
 * window after its first token. Returns 1 (taken) or 0, then each counter's count and ms left (< 0:
 * no window).
 */
const TAKE_SCRIPT = `
local out = {1}
for i, key in ipairs(KEYS) do
  out[2 * i] = tonumber(redis.call('GET', key) or '0')
  out[2 * i + 1] = redis.call('PTTL', key)
  if out[2 * i] >= tonumber(ARGV[i]) then out[1] = 0 end
end
if out[1] == 1 then
  for i, key in ipairs(KEYS) do
    out[2 * i] = redis.call('INCR', key)
    if out[2 * i + 1] < 0 then
      out[2 * i + 1] = tonumber(ARGV[#KEYS + 1])
      redis.call('PEXPIRE', key, out[2 * i + 1])
    end
  end
end
return out`;

/** KEYS: the counters of a request's tokens to give back: each loses one, never going below 0 nor starting a window. */
const GIVE_BACK_SCRIPT = `
for _, key in ipairs(KEYS) do
  if tonumber(redis.call('GET', key) or '0') > 0 then redis.call('DECR', key) end
end
return 1`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** TAKE_SCRIPT, by its SHA (ioredis loads it when Redis does not know it). */
    takeRequestTokens(numKeys: number, ...keysThenArgs: (string | number)[]): Result<number[], Context>;
    /** GIVE_BACK_SCRIPT. */
    giveBackRequestTokens(numKeys: number, ...keys: string[]): Result<number, Context>;
  }
}

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

interface Bucket {
  who: 'key' | 'account';
  /** Its counter's name under the prefix. */
  name: string;
  limit: number;
}

/** A bucket after the request: tokens of its window taken (this request's included when it passed). */
interface Count {
  count: number;
  /** Milliseconds until its window ends (0: none begun). */
  resetMs: number;
}

interface Taken {
  allowed: boolean;
  counts: Count[];
}

export interface RequestRateOptions {
  /** REDIS_URL; unset: memory of this process. */
  redisUrl?: string;
  /** REDIS_KEY_PREFIX ('mediagate:'). */
  keyPrefix: string;
  log: Logger;
  /** Longest wait for Redis before counting in memory (ms). */
  redisTimeoutMs?: number;
  /** During an outage, how long requests count in memory before one asks Redis again (ms). */
  redisRetryMs?: number;
}

/**
 * Redis commands failing in a row (the connection up) that make an outage: logged, and requests
 * count in memory without asking Redis until the next probe. Timeouts in a row as many also
 * replace the connection. A failure counts only when its command was sent after the last counted
 * failure (an outage counts once, as in pool/member-health.ts): the commands of one auto-pipelined
 * round trip, or all those in flight during one stall past the timeout, are one failure.
 */
const COMMAND_FAILURES_DOWN = 3;

export class RequestRateLimiter {
  private readonly redis: Redis | undefined;
  /** Counter names as rate-limiter-flexible wrote them: old and new instances share one count during an update. */
  private readonly prefix: string;
  /** The windows counted in memory (no Redis, or Redis away; with Redis, its last counts), by counter name. */
  private readonly windows = new Map<string, { count: number; endsAt: number }>();
  private sweepAt = 0;
  private redisDown = false;
  /** Commands that failed in a row while the connection stood (timeouts, reply errors). */
  private commandFailures = 0;
  /** Commands that timed out in a row, over connections: no reply at all, whatever the connection's status says. */
  private timeouts = 0;
  /**
   * Set during an outage (COMMAND_FAILURES_DOWN failures in a row, until a command succeeds): when
   * the next request may ask Redis. Until then, and while that probe is out, requests count in memory.
   */
  private retryAt: number | undefined;
  private probing = false;
  /** When (performance.now()) the last failure that counted was seen: commands sent before it count for nothing more. */
  private lastCountedAt = -Infinity;
  /**
   * The connection has been ready once. Before that (start-up) its commands would fail at once
   * (no offline queue), which is no outage of Redis: requests count in memory without asking, and
   * a Redis that cannot be reached says so by the connection's own 'error' event.
   */
  private readyOnce = false;
  /**
   * The connection itself failed during this outage (its 'error' event: refused, reset, timed out).
   * Its next 'ready' then says Redis is back: ready means Redis answered the connection's ready
   * check, and a process that sends no commands (no limited request comes) has no other way to know.
   */
  private connectionLost = false;

  constructor(private readonly opts: RequestRateOptions) {
    this.prefix = `${opts.keyPrefix}rpm:`;
    if (opts.redisUrl !== undefined) {
      const timeout = opts.redisTimeoutMs ?? 500;
      this.redis = new Redis(opts.redisUrl, {
        // Fail fast while disconnected: memory answers instead of a queue that waits.
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        commandTimeout: timeout,
        connectTimeout: 2_000,
        // Concurrent requests' scripts share round trips.
        enableAutoPipelining: true,
        retryStrategy: (times) => Math.min(200 * times, 2_000),
      });
      this.redis.defineCommand('takeRequestTokens', { lua: TAKE_SCRIPT });
      this.redis.defineCommand('giveBackRequestTokens', { lua: GIVE_BACK_SCRIPT });
      this.redis.on('error', (err: Error) => {
        this.connectionLost = true;
        this.wentDown(err);
      });
      this.redis.on('ready', () => {
        // A new connection: the failures of the old one are not a streak of this one.
        this.commandFailures = 0;
        const first = !this.readyOnce;
        this.readyOnce = true;
        if (this.redisDown && this.connectionLost) {
          // Back after the connection was lost (a restart, a network blip): asked at once again.
          this.retryAt = undefined;
          this.cameBack();
        } else if (first && !this.redisDown) {
          this.opts.log.info('Connected to Redis: request rates are counted across instances');
        }
        // An outage of commands (timeouts, READONLY, OOM) with the connection up is over only when
        // a command succeeds: the connection replaced after timeouts gets ready with its server
        // still refusing or hanging on scripts.
      });
    }
  }

  /** `redis` when counts are shared by every instance, `memory` when each counts its own. */
  get mode(): 'redis' | 'memory' {
    return this.redis === undefined ? 'memory' : 'redis';
  }

  /** Takes one token of the key and one of its account (those that have a limit), or none when either is empty. */
  async consume(ids: { apiKeyId: string; accountId: string }, limits: RequestLimits): Promise<RateDecision> {
    const buckets = bucketsOf(ids, limits);
    if (buckets.length === 0) return { allowed: true, headers: undefined };
    const taken = await this.take(buckets);
    const states = buckets.map((b, i) => ({ ...b, ...taken.counts[i]! }));
    const headers = headersOf(states);
    if (taken.allowed) return { allowed: true, headers };
    // The empty bucket that refills last decides when a retry can pass.
    const blame = states.filter((s) => s.count >= s.limit).reduce((a, b) => (b.resetMs > a.resetMs ? b : a));
    return { allowed: false, headers, blamed: blame.who, limit: blame.limit, retryAfterMs: blame.resetMs };
  }

  /**
   * Gives back the tokens `consume` took for a request that was then refused for a cap on what is in
   * flight (429 too_many_in_flight): it created nothing, as a rate-limited request creates nothing,
   * and a client that follows that answer's `Retry-After: 1` (the OpenAI SDKs do, twice) must not
   * spend its minute on waiting for a place. Where the token was counted (Redis, or memory during an
   * outage) is where it goes back; best effort: a failure leaves the token spent.
   */
  async giveBack(ids: { apiKeyId: string; accountId: string }, limits: RequestLimits): Promise<void> {
    const buckets = bucketsOf(ids, limits);
    if (buckets.length === 0) return;
    if (this.redis && this.readyOnce && this.retryAt === undefined) {
      try {
        await this.redis.giveBackRequestTokens(buckets.length, ...buckets.map((b) => this.prefix + b.name));
      } catch {
        // Left spent: a failure here is no outage of its own (the next take finds out).
      }
    }
    const now = Date.now();
    for (const b of buckets) {
      const w = this.windows.get(b.name);
      if (w !== undefined && w.endsAt > now && w.count > 0) w.count -= 1;
    }
  }

  private async take(buckets: Bucket[]): Promise<Taken> {
    if (this.redis && this.readyOnce && this.mayAskRedis()) {
      const probe = this.retryAt !== undefined;
      if (probe) this.probing = true;
      const sentAt = performance.now();
      try {
        const keys = buckets.map((b) => this.prefix + b.name);
        const out = await this.redis.takeRequestTokens(keys.length, ...keys, ...buckets.map((b) => b.limit), WINDOW_MS);
        this.commandFailures = 0;
        this.timeouts = 0;
        this.retryAt = undefined;
        this.cameBack();
        const counts = buckets.map((_, i) => ({ count: out[2 * i + 1]!, resetMs: Math.max(0, out[2 * i + 2]!) }));
        this.remember(buckets, counts);
        return { allowed: out[0] === 1, counts };
      } catch (err) {
        this.failed(err instanceof Error ? err : new Error(String(err)), probe, sentAt);
      } finally {
        if (probe) this.probing = false;
      }
    }
    return this.takeInMemory(buckets);
  }

  /** Outside an outage always; during one, one request at a time once its wait is over. */
  private mayAskRedis(): boolean {
    return this.retryAt === undefined || (!this.probing && Date.now() >= this.retryAt);
  }

  /**
   * Redis away, too slow or refusing (a timeout and a reply error such as READONLY or OOM are no
   * 'error' event of the connection): this instance counts alone. One slow command is no outage:
   * COMMAND_FAILURES_DOWN in a row are, each sent after the last one counted (a connection error
   * says it at once), and so is a failed probe.
   */
  private failed(err: Error, probe: boolean, sentAt: number): void {
    if (!probe && sentAt <= this.lastCountedAt) return;
    this.lastCountedAt = performance.now();
    if (++this.commandFailures >= COMMAND_FAILURES_DOWN || probe) {
      this.retryAt = Date.now() + (this.opts.redisRetryMs ?? 5_000);
      this.wentDown(err);
    }
    // ioredis rejects a command with this plain Error when `commandTimeout` passes. Any other
    // failure is an answer, or a connection ioredis already knows is down.
    if (err.message !== 'Command timed out') {
      this.timeouts = 0;
      return;
    }
    // No answer at all, the connection still 'ready' (a hung server, a path that drops packets): a
    // new connection, where ioredis's reconnection finds out whether Redis is there. The streak
    // outlives it: a probe that times out on the new one replaces that too, as replies to its
    // commands may never come, or come for the commands that timed out before.
    if (++this.timeouts >= COMMAND_FAILURES_DOWN && this.redis!.status === 'ready') this.redis!.disconnect(true);
  }

  /** Counting moves to memory: said once per outage, with the error's message only (never REDIS_URL). */
  private wentDown(err: Error): void {
    if (this.redisDown) return;
    this.redisDown = true;
    this.opts.log.warn({ err: { message: err.message } }, 'Redis is unreachable: request rates are counted by each instance in its own memory until it is back');
  }

  /** Redis answers again (reconnected after the connection was lost, or a command succeeded after failing ones): said once. */
  private cameBack(): void {
    if (!this.redisDown) return;
    this.redisDown = false;
    this.connectionLost = false;
    this.opts.log.info('Redis is reachable again: request rates are counted across instances');
  }

  /** The counts Redis reported: where this instance's memory windows start should Redis go away. */
  private remember(buckets: Bucket[], counts: Count[]): void {
    const now = this.sweep();
    buckets.forEach((b, i) => this.windows.set(b.name, { count: counts[i]!.count, endsAt: now + counts[i]!.resetMs }));
  }

  /** Forgets the windows that ended (once a window at most); returns the time. */
  private sweep(): number {
    const now = Date.now();
    if (now >= this.sweepAt) {
      for (const [name, w] of this.windows) if (w.endsAt <= now) this.windows.delete(name);
      this.sweepAt = now + WINDOW_MS;
    }
    return now;
  }

  /** TAKE_SCRIPT's step on this process's windows, synchronous: nothing else runs in between. */
  private takeInMemory(buckets: Bucket[]): Taken {
    const now = this.sweep();
    const current = buckets.map((b) => {
      const w = this.windows.get(b.name);
      return w !== undefined && w.endsAt > now ? w : undefined;
    });
    const allowed = buckets.every((b, i) => (current[i]?.count ?? 0) < b.limit);
    if (allowed) {
      buckets.forEach((b, i) => {
        const w = current[i] ?? { count: 0, endsAt: now + WINDOW_MS };
        w.count += 1;
        this.windows.set(b.name, w);
        current[i] = w;
      });
    }
    return { allowed, counts: current.map((w) => ({ count: w?.count ?? 0, resetMs: w ? w.endsAt - now : 0 })) };
  }

  async close(): Promise<void> {
    if (!this.redis) return;
    this.redis.removeAllListeners('error');
    this.redis.on('error', () => undefined);
    await this.redis.quit().catch(() => this.redis!.disconnect());
  }
}

/** The buckets of a request: its key's and its account's, those with a limit. */
function bucketsOf(ids: { apiKeyId: string; accountId: string }, limits: RequestLimits): Bucket[] {
  const buckets: Bucket[] = [];
  if (limits.key.requestsPerMinute !== null) buckets.push({ who: 'key', name: `k:${ids.apiKeyId}`, limit: limits.key.requestsPerMinute });
  if (limits.account.requestsPerMinute !== null) buckets.push({ who: 'account', name: `a:${ids.accountId}`, limit: limits.account.requestsPerMinute });
  return buckets;
}

function headersOf(states: (Bucket & Count)[]): RateHeaders {
  const remainingOf = (s: Bucket & Count) => Math.max(0, s.limit - s.count);
  const tightest = states.reduce((a, b) => {
    const ra = remainingOf(a);
    const rb = remainingOf(b);
    return rb < ra || (rb === ra && b.limit < a.limit) ? b : a;
  });
  return { limit: tightest.limit, remaining: remainingOf(tightest), resetMs: tightest.resetMs };
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
