/**
 * The request-rate counter's fallback to memory is logged for every way Redis can fail a command,
 * not only for a lost connection: a reply error (READONLY, OOM, NOPERM) and a command timeout are
 * no 'error' event of ioredis. Said once per transition, with the error's message and never the
 * REDIS_URL; and once when Redis answers again (a command succeeds, or the lost connection is ready
 * again: a process that sends no command would otherwise say Redis is away for good). During such
 * an outage Redis is asked again by one request after a wait, not by every request (a Redis that
 * hangs with its connection up cost each one the whole command timeout), and a connection whose
 * commands keep timing out is replaced.
 * What is no outage is not called one: the commands in flight during one stall past the timeout, and
 * the requests of a start-up before the connection is ready.
 * Against a fake Redis on a loopback port whose answer to the script the test chooses.
 */
import { createServer, type Server, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import type { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { RequestRateLimiter } from '../../server/services/limits/request-rate.ts';
import type { RequestLimits } from '../../server/services/limits/client-limits.ts';
import { until } from '../support/tasks.ts';

type ScriptAnswer = 'readonly' | 'taken' | 'full' | 'silent';

/**
 * Enough of RESP for ioredis: every command is answered +OK but INFO (its ready check, unanswered
 * when `info` is false) and the script (EVALSHA), which gets `answer`: a READONLY error, one token
 * taken of a limit of 3, a refusal with all 3 taken, or nothing at all (ioredis times the command
 * out). Until `stallUntil` (ms since the epoch) nothing is answered; then everything is, in order,
 * as a Redis busy with one slow command.
 */
function fakeRedis(): { server: Server; answer: ScriptAnswer; info: boolean; stallUntil: number; scripts: number; connections: number; sockets: Set<Socket> } {
  const fake = { server: undefined as unknown as Server, answer: 'readonly' as ScriptAnswer, info: true, stallUntil: 0, scripts: 0, connections: 0, sockets: new Set<Socket>() };
  const reply = (command: string): string | undefined => {
    if (command === 'INFO') {
      const info = '# Server\r\nredis_version:7.2.0\r\nloading:0\r\n';
      return fake.info ? `$${Buffer.byteLength(info)}\r\n${info}\r\n` : undefined;
    }
    if (command === 'EVALSHA' || command === 'EVAL') {
      fake.scripts++;
      if (fake.answer === 'readonly') return "-READONLY You can't write against a read only replica.\r\n";
      if (fake.answer === 'taken') return '*3\r\n:1\r\n:1\r\n:60000\r\n';
      if (fake.answer === 'full') return '*3\r\n:0\r\n:3\r\n:60000\r\n';
      return undefined;
    }
    return '+OK\r\n';
  };
  fake.server = createServer((socket: Socket) => {
    fake.connections++;
    fake.sockets.add(socket);
    // One answer after the other, each once any stall is over.
    let answered = Promise.resolve();
    const send = (text: string) => {
      answered = answered.then(async () => {
        if (fake.stallUntil > Date.now()) await sleep(fake.stallUntil - Date.now());
        if (!socket.destroyed) socket.write(text);
      });
    };
    let buffered = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      // Commands are arrays of bulk strings: *<n>\r\n then n times $<len>\r\n<bytes>\r\n.
      for (;;) {
        const args = parseCommand(buffered);
        if (!args) return;
        buffered = buffered.subarray(args.length);
        const text = reply(args.words[0]!.toUpperCase());
        if (text !== undefined) send(text);
      }
    });
    socket.on('error', () => undefined);
  });
  return fake;
}

function parseCommand(data: Buffer): { words: string[]; length: number } | undefined {
  const line = (from: number) => {
    const end = data.indexOf('\r\n', from);
    return end < 0 ? undefined : { text: data.subarray(from, end).toString(), next: end + 2 };
  };
  const head = line(0);
  if (!head) return undefined;
  const words: string[] = [];
  let at = head.next;
  for (let i = 0; i < Number(head.text.slice(1)); i++) {
    const size = line(at);
    if (!size) return undefined;
    const length = Number(size.text.slice(1));
    if (data.length < size.next + length + 2) return undefined;
    words.push(data.subarray(size.next, size.next + length).toString());
    at = size.next + length + 2;
  }
  return { words, length: at };
}

const limits: RequestLimits = { key: { requestsPerMinute: 3, maxInFlight: null }, account: { requestsPerMinute: null, maxInFlight: null } };
const ids = { apiKeyId: 'key_fallback', accountId: 'acct_fallback' };

describe('RequestRateLimiter when Redis answers a command with an error or not at all', () => {
  const lines: Record<string, any>[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
  const redis = fakeRedis();
  let limiter: RequestRateLimiter | undefined;
  afterAll(async () => {
    await limiter?.close();
    redis.server.close();
  });

  it('logs each move to in-memory counting once (three READONLY answers, then three timeouts in a row) and each return once, never the URL', async () => {
    await new Promise<void>((resolve) => redis.server.listen(0, '127.0.0.1', () => resolve()));
    const url = `redis://:not-for-logs@127.0.0.1:${(redis.server.address() as { port: number }).port}`;
    limiter = new RequestRateLimiter({ redisUrl: url, keyPrefix: 'unit:', log, redisTimeoutMs: 100, redisRetryMs: 300 });
    // Connected and ready (its commands are refused while it is not: that is the connection's outage, logged as such).
    const connection = (limiter as unknown as { redis: Redis }).redis;
    await until(() => connection.status === 'ready', 10_000, 'the connection to be ready');
    const messages = () => lines.filter((l) => l.msg.startsWith('Redis is')).map((l) => [l.level, l.msg.split(':')[0], l.err?.message]);

    // A replica that refuses writes: counted in memory; one refused command is no outage, three in a row are, said once.
    for (let i = 0; i < 3; i++) {
      expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 - i } });
      expect(messages()).toHaveLength(i < 2 ? 0 : 1);
    }
    expect(redis.scripts).toBe(3);
    expect(messages()).toEqual([[40, 'Redis is unreachable', "READONLY You can't write against a read only replica."]]);

    // It takes the script again: the first request after the wait asks, and counting is shared again, said once.
    redis.answer = 'taken';
    await sleep(300);
    for (let i = 0; i < 2; i++) expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 } });
    expect(messages()).toHaveLength(2);
    expect(messages()[1]).toEqual([30, 'Redis is reachable again', undefined]);

    // It stops answering: commands time out, and three in a row are a move to memory too.
    redis.answer = 'silent';
    for (let i = 0; i < 3; i++) await limiter.consume(ids, limits);
    expect(messages()).toEqual([
      [40, 'Redis is unreachable', "READONLY You can't write against a read only replica."],
      [30, 'Redis is reachable again', undefined],
      [40, 'Redis is unreachable', 'Command timed out'],
    ]);
    expect(JSON.stringify(lines)).not.toContain('not-for-logs');
  });
});

describe('RequestRateLimiter when Redis hangs with its connection up', () => {
  const lines: Record<string, any>[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
  const redis = fakeRedis();
  let limiter: RequestRateLimiter | undefined;
  afterAll(async () => {
    await limiter?.close();
    redis.server.close();
  });

  it('stops asking it after three timeouts, replaces the connection, and asks again once per wait until it answers', async () => {
    await new Promise<void>((resolve) => redis.server.listen(0, '127.0.0.1', () => resolve()));
    const url = `redis://127.0.0.1:${(redis.server.address() as { port: number }).port}`;
    // A wait long enough that the requests below, counted in memory (no round trip), all fall in it.
    const retryMs = 2_000;
    limiter = new RequestRateLimiter({ redisUrl: url, keyPrefix: 'unit:', log, redisTimeoutMs: 100, redisRetryMs: retryMs });
    const connection = (limiter as unknown as { redis: Redis }).redis;
    await until(() => connection.status === 'ready', 10_000, 'the connection to be ready');
    const messages = () => lines.filter((l) => l.msg.startsWith('Redis is')).map((l) => [l.level, l.msg.split(':')[0], l.err?.message]);
    const many = { key: { requestsPerMinute: 1_000, maxInFlight: null }, account: { requestsPerMinute: null, maxInFlight: null } };
    const consumeMany = (n: number) => Promise.all(Array.from({ length: n }, () => limiter!.consume({ apiKeyId: 'key_hung', accountId: 'acct_hung' }, many)));

    // Three timeouts in a row: an outage, said once, and the connection that stopped answering is replaced.
    redis.answer = 'silent';
    for (let i = 0; i < 3; i++) await consumeMany(1);
    expect(redis.scripts).toBe(3);
    expect(messages()).toEqual([[40, 'Redis is unreachable', 'Command timed out']]);
    await until(() => redis.connections === 2 && connection.status === 'ready', 10_000, 'a new connection');
    // Until the wait is over no request asks Redis, on the new connection either: each counts in memory at once.
    for (let i = 0; i < 20; i++) await consumeMany(5);
    expect(redis.scripts).toBe(3);

    // After it one request asks (the others meanwhile count in memory); it times out too, and its connection is replaced.
    await sleep(retryMs);
    await consumeMany(5);
    expect(redis.scripts).toBe(4);
    await until(() => redis.connections === 3 && connection.status === 'ready', 10_000, 'another new connection');
    for (let i = 0; i < 20; i++) await consumeMany(5);
    expect(redis.scripts).toBe(4);

    // Once Redis answers, the next probe brings counting back to it for every request, said once.
    redis.answer = 'taken';
    await sleep(retryMs);
    await consumeMany(1);
    expect(redis.scripts).toBe(5);
    await consumeMany(3);
    expect(redis.scripts).toBe(8);
    expect(messages()).toEqual([
      [40, 'Redis is unreachable', 'Command timed out'],
      [30, 'Redis is reachable again', undefined],
    ]);
  });
});

describe('RequestRateLimiter when the connection to Redis is lost', () => {
  const lines: Record<string, any>[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
  const first = fakeRedis();
  const restarted = fakeRedis();
  let limiter: RequestRateLimiter | undefined;
  afterAll(async () => {
    await limiter?.close();
    first.server.close();
    restarted.server.close();
  });

  it('says Redis is back as soon as the connection is ready again, with no request sent (a worker, an idle instance), and asks it at once', async () => {
    await new Promise<void>((resolve) => first.server.listen(0, '127.0.0.1', () => resolve()));
    const port = (first.server.address() as { port: number }).port;
    // A wait far longer than the test: only the connection's return can end the outage.
    limiter = new RequestRateLimiter({ redisUrl: `redis://127.0.0.1:${port}`, keyPrefix: 'unit:', log, redisTimeoutMs: 100, redisRetryMs: 600_000 });
    const connection = (limiter as unknown as { redis: Redis }).redis;
    await until(() => connection.status === 'ready', 10_000, 'the connection to be ready');
    const messages = () => lines.filter((l) => l.msg.startsWith('Redis is') || l.msg.startsWith('Connected')).map((l) => [l.level, l.msg.split(':')[0]]);

    // Redis goes away (a restart): its connection is cut and reconnecting is refused.
    first.server.close();
    for (const socket of first.sockets) socket.destroy();
    await until(() => messages().length === 2, 10_000, 'the outage in the log');
    expect(messages()).toEqual([
      [30, 'Connected to Redis'],
      [40, 'Redis is unreachable'],
    ]);
    // Requests meanwhile fail at once (no connection) and make it an outage of commands too: counted in memory.
    for (let i = 0; i < 3; i++) expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 - i } });

    // It is back on the same port: the connection's return says so, no command needed.
    restarted.answer = 'taken';
    await new Promise<void>((resolve) => restarted.server.listen(port, '127.0.0.1', () => resolve()));
    await until(() => messages().length === 3, 10_000, 'the return in the log');
    expect(messages()[2]).toEqual([30, 'Redis is reachable again']);
    expect(restarted.scripts).toBe(0);
    // The next request is counted by Redis (1 taken of 3), not in memory until the wait is over.
    expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 } });
    expect(restarted.scripts).toBe(1);
    expect(messages()).toHaveLength(3);
  });
});

describe('RequestRateLimiter when Redis stalls once past the timeout', () => {
  const lines: Record<string, any>[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
  const redis = fakeRedis();
  let limiter: RequestRateLimiter | undefined;
  afterAll(async () => {
    await limiter?.close();
    redis.server.close();
  });

  it('counts the requests that timed out together as one failure: no outage, the same connection, and their memory windows start at the counts Redis reported', async () => {
    await new Promise<void>((resolve) => redis.server.listen(0, '127.0.0.1', () => resolve()));
    const url = `redis://127.0.0.1:${(redis.server.address() as { port: number }).port}`;
    limiter = new RequestRateLimiter({ redisUrl: url, keyPrefix: 'unit:', log, redisTimeoutMs: 100, redisRetryMs: 5_000 });
    const connection = (limiter as unknown as { redis: Redis }).redis;
    await until(() => connection.status === 'ready', 10_000, 'the connection to be ready');
    const outages = () => lines.filter((l) => l.msg.startsWith('Redis is'));

    // The key has used its minute in Redis.
    redis.answer = 'full';
    expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: false, blamed: 'key', headers: { limit: 3, remaining: 0 } });
    // Redis stalls for 400 ms (a fork, a slow command): four requests in flight time out together
    // and are answered from memory, which starts at the count Redis reported last.
    redis.stallUntil = Date.now() + 400;
    const during = await Promise.all(Array.from({ length: 4 }, () => limiter!.consume(ids, limits)));
    expect(during.map((d) => d.allowed)).toEqual([false, false, false, false]);
    expect(redis.scripts).toBe(5);

    // Once it answers again it is asked at once, on the same connection, and nothing was logged.
    await sleep(redis.stallUntil - Date.now() + 50);
    expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: false, headers: { remaining: 0 } });
    expect(redis.scripts).toBe(6);
    expect(redis.connections).toBe(1);
    expect(outages()).toEqual([]);
  });
});

describe('RequestRateLimiter at start-up', () => {
  const lines: Record<string, any>[] = [];
  const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
  const redis = fakeRedis();
  const hung = fakeRedis();
  const limiters: RequestRateLimiter[] = [];
  afterAll(async () => {
    for (const l of limiters) await l.close();
    redis.server.close();
    hung.server.close();
  });
  const listen = async (fake: ReturnType<typeof fakeRedis>) => {
    await new Promise<void>((resolve) => fake.server.listen(0, '127.0.0.1', () => resolve()));
    const limiter = new RequestRateLimiter({ redisUrl: `redis://127.0.0.1:${(fake.server.address() as { port: number }).port}`, keyPrefix: 'unit:', log, redisTimeoutMs: 100, redisRetryMs: 5_000 });
    limiters.push(limiter);
    return { limiter, connection: (limiter as unknown as { redis: Redis }).redis };
  };

  it('counts in memory without asking Redis until the connection is first ready, calls that no outage, and says once when Redis counts', async () => {
    redis.answer = 'taken';
    const { limiter, connection } = await listen(redis);
    // Requests before the connection is ready (their commands would fail at once): counted in memory.
    for (let i = 0; i < 3; i++) expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 - i } });
    expect(connection.status).not.toBe('ready');
    await until(() => connection.status === 'ready', 10_000, 'the connection to be ready');
    // The next one is counted by Redis (its answer: 1 taken of 3).
    expect(await limiter.consume(ids, limits)).toMatchObject({ allowed: true, headers: { limit: 3, remaining: 2 } });
    expect(redis.scripts).toBe(1);
    expect(lines.map((l) => [l.level, l.msg.split(':')[0]])).toEqual([[30, 'Connected to Redis']]);
  });

  it('still says Redis is unreachable when the connection never becomes ready (a server that takes it but does not answer)', async () => {
    hung.info = false;
    const { limiter } = await listen(hung);
    lines.length = 0;
    for (let i = 0; i < 4; i++) expect((await limiter.consume(ids, limits)).allowed).toBe(i < 3);
    await until(() => lines.length > 0, 10_000, 'a line in the log');
    await sleep(500);
    expect(lines.map((l) => [l.level, l.msg.split(':')[0]])).toEqual([[40, 'Redis is unreachable']]);
    expect(hung.scripts).toBe(0);
  });
});
