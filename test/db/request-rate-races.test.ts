/**
 * The requests-per-minute count decides and counts in one step, in Redis and in memory: a refused
 * request takes no token, not even for a moment, so it can neither make a sibling key's request
 * look over its account's limit nor, given back after its window ended, start the next window
 * below zero. Against the local Redis (127.0.0.1:6379) under a prefix of its own, like
 * test/process/limits-two-instances.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { connect, createServer, type Server } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { RequestRateLimiter } from '../../server/services/limits/request-rate.ts';
import type { RequestLimits } from '../../server/services/limits/client-limits.ts';

const REDIS_PORT = 6379;
const REDIS_URL = `redis://127.0.0.1:${REDIS_PORT}`;
const log = createLogger('silent');

const limits = (key: number | null, account: number | null): RequestLimits => ({
  key: { requestsPerMinute: key, maxInFlight: null },
  account: { requestsPerMinute: account, maxInFlight: null },
});

/** Until the limiter's connection is ready its counts go to memory: wait until one shows up in Redis. */
async function untilCountedInRedis(limiter: RequestRateLimiter, redis: Redis, prefix: string): Promise<void> {
  for (let i = 0; ; i++) {
    await limiter.consume({ apiKeyId: `key_probe${i}`, accountId: 'acct_probe' }, limits(1, null));
    if ((await redis.exists(`${prefix}rpm:k:key_probe${i}`)) === 1) return;
    await sleep(20);
  }
}

describe.each(['memory', 'redis'] as const)('RequestRateLimiter (%s)', (mode) => {
  const prefix = `mediagate-test-${randomBytes(6).toString('hex')}:`;
  const redis = new Redis(REDIS_URL, { lazyConnect: true });
  let limiter: RequestRateLimiter;

  beforeAll(async () => {
    limiter = new RequestRateLimiter({ redisUrl: mode === 'redis' ? REDIS_URL : undefined, keyPrefix: prefix, log });
    if (mode === 'redis') await untilCountedInRedis(limiter, redis, prefix);
  });
  afterAll(async () => {
    await limiter?.close();
    redis.disconnect();
  });

  it("lets a sibling key through while requests of a key over its own limit are refused: they hold none of the account's tokens", async () => {
    const spent = { apiKeyId: 'key_spent', accountId: 'acct_shared' };
    const sibling = { apiKeyId: 'key_sibling', accountId: 'acct_shared' };
    // The spent key's one token; the account (10) has 9 left.
    expect((await limiter.consume(spent, limits(1, 10))).allowed).toBe(true);
    // 9 requests of the spent key, then one of its sibling, all under way together.
    const refused = Array.from({ length: 9 }, () => limiter.consume(spent, limits(1, 10)));
    const passed = limiter.consume(sibling, limits(null, 10));
    expect(await passed).toEqual({ allowed: true, headers: { limit: 10, remaining: 8, resetMs: expect.any(Number) } });
    for (const d of await Promise.all(refused)) {
      expect(d).toMatchObject({ allowed: false, blamed: 'key', limit: 1, headers: { limit: 1, remaining: 0 } });
      if (!d.allowed) expect(d.retryAfterMs).toBeGreaterThan(50_000);
    }
    // The refused requests counted for nothing: 2 of the account's 10 taken, this is the third.
    expect(await limiter.consume(sibling, limits(null, 10))).toMatchObject({ allowed: true, headers: { limit: 10, remaining: 7 } });
  });

  it("gives back a request's tokens (key and account), never below zero", async () => {
    const ids = { apiKeyId: `key_back_${mode}`, accountId: `acct_back_${mode}` };
    expect((await limiter.consume(ids, limits(2, 5))).headers).toMatchObject({ limit: 2, remaining: 1 });
    expect((await limiter.consume(ids, limits(2, 5))).headers).toMatchObject({ limit: 2, remaining: 0 });
    await limiter.giveBack(ids, limits(2, 5));
    const again = await limiter.consume(ids, limits(2, 5));
    expect(again).toMatchObject({ allowed: true, headers: { limit: 2, remaining: 0 } });
    // The account's count went back too: 2 of its 5 taken.
    expect((await limiter.consume({ apiKeyId: `key_other_${mode}`, accountId: ids.accountId }, limits(null, 5))).headers).toMatchObject({ limit: 5, remaining: 2 });
    for (let i = 0; i < 5; i++) await limiter.giveBack(ids, limits(2, 5));
    expect((await limiter.consume(ids, limits(2, 5))).headers).toMatchObject({ limit: 2, remaining: 1 });
  });
});

/** A TCP proxy that holds every byte sent to Redis for `ms` (the answers come back at once). */
async function slowProxy(ms: number): Promise<Server> {
  const server = createServer((client) => {
    const upstream = connect(REDIS_PORT, '127.0.0.1');
    client.on('data', (chunk) => void setTimeout(() => upstream.write(chunk), ms));
    upstream.on('data', (chunk) => client.write(chunk));
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return server;
}

describe('RequestRateLimiter (redis) at the end of a window', () => {
  const prefix = `mediagate-test-${randomBytes(6).toString('hex')}:`;
  const redis = new Redis(REDIS_URL, { lazyConnect: true });
  let proxy: Server;
  let limiter: RequestRateLimiter;

  beforeAll(async () => {
    proxy = await slowProxy(200);
    const port = (proxy.address() as { port: number }).port;
    limiter = new RequestRateLimiter({ redisUrl: `redis://127.0.0.1:${port}`, keyPrefix: prefix, log, redisTimeoutMs: 2_000 });
    await untilCountedInRedis(limiter, redis, prefix);
  });
  afterAll(async () => {
    await limiter?.close();
    redis.disconnect();
    proxy?.close();
  });

  it('starts the next window at its first token when the last one ends while refused requests are under way: 2 pass, no more', async () => {
    const ids = { apiKeyId: 'key_boundary', accountId: 'acct_boundary' };
    const key = `${prefix}rpm:k:key_boundary`;
    for (let i = 0; i < 2; i++) expect((await limiter.consume(ids, limits(2, null))).allowed).toBe(true);
    // 20 requests reach Redis 0.2 s from now and are refused; the window ends 0.1 s later, before
    // anything else they might send (0.4 s).
    const refused = Array.from({ length: 20 }, () => limiter.consume(ids, limits(2, null)));
    await redis.pexpire(key, 300);
    expect((await Promise.all(refused)).map((d) => d.allowed)).toEqual(Array(20).fill(false));
    await sleep(400);
    const next = [];
    for (let i = 0; i < 4; i++) next.push((await limiter.consume(ids, limits(2, null))).allowed);
    expect(next).toEqual([true, true, false, false]);
    expect(await redis.get(key)).toBe('2');
    expect(await redis.pttl(key)).toBeGreaterThan(55_000);
  });
});
