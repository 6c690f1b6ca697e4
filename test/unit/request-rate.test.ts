/**
 * The requests-per-minute counter on its own: shared by every client of one limiter whatever the
 * limit, a refused request taking no token, OpenAI's reset format, and Redis that cannot be reached
 * (counted in memory instead, said once in the log, never an error for the client). Races between
 * requests, in memory and in Redis: test/db/request-rate-races.test.ts.
 */
import { createServer } from 'node:net';
import { Writable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { formatReset, RequestRateLimiter } from '../../server/services/limits/request-rate.ts';
import type { RequestLimits } from '../../server/services/limits/client-limits.ts';

const limits = (key: number | null, account: number | null): RequestLimits => ({
  key: { requestsPerMinute: key, maxInFlight: null },
  account: { requestsPerMinute: account, maxInFlight: null },
});
const ids = { apiKeyId: 'key_unit', accountId: 'acct_unit' };

describe('RequestRateLimiter in memory', () => {
  const limiter = new RequestRateLimiter({ keyPrefix: 'unit:', log: createLogger('silent') });

  it('counts down, refuses at the limit naming the bucket, and takes no token of a refused request', async () => {
    const seen = [];
    for (let i = 0; i < 3; i++) seen.push(await limiter.consume(ids, limits(3, 10)));
    expect(seen.map((d) => d.allowed && d.headers?.remaining)).toEqual([2, 1, 0]);
    const refused = await limiter.consume(ids, limits(3, 10));
    expect(refused).toMatchObject({ allowed: false, blamed: 'key', limit: 3, headers: { limit: 3, remaining: 0 } });
    if (!refused.allowed) expect(refused.retryAfterMs).toBeGreaterThan(50_000);
    // The refused request took none of the account's: 3 taken of 10, so 7 left once the key's limit is lifted.
    const lifted = await limiter.consume(ids, limits(null, 10));
    expect(lifted).toMatchObject({ allowed: true, headers: { limit: 10, remaining: 6 } });
    expect(await limiter.consume(ids, limits(null, null))).toEqual({ allowed: true, headers: undefined });
  });
});

describe('RequestRateLimiter with Redis away', () => {
  const lines: string[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(String(chunk)), cb()) }));
  // A port that accepts and closes at once: never a Redis.
  const dead = createServer((socket) => socket.destroy());
  let limiter: RequestRateLimiter;
  afterAll(async () => {
    await limiter?.close();
    dead.close();
  });

  it('counts in memory, logs the outage once, and still refuses past the limit', async () => {
    await new Promise<void>((r) => dead.listen(0, '127.0.0.1', () => r()));
    const port = (dead.address() as { port: number }).port;
    limiter = new RequestRateLimiter({ redisUrl: `redis://127.0.0.1:${port}`, keyPrefix: 'unit:', log, redisTimeoutMs: 200 });
    expect(limiter.mode).toBe('redis');
    const decisions = [];
    for (let i = 0; i < 4; i++) decisions.push(await limiter.consume({ apiKeyId: 'key_away', accountId: 'acct_away' }, limits(3, null)));
    expect(decisions.map((d) => d.allowed)).toEqual([true, true, true, false]);
    await new Promise((r) => setTimeout(r, 500));
    const outages = lines.filter((l) => l.includes('Redis is unreachable'));
    expect(outages).toHaveLength(1);
  });
});

describe('formatReset', () => {
  it('writes durations as OpenAI does', () => {
    expect(formatReset(20)).toBe('20ms');
    expect(formatReset(999.2)).toBe('1s');
    expect(formatReset(12_500)).toBe('12.5s');
    expect(formatReset(60_000)).toBe('1m0s');
  });
});
