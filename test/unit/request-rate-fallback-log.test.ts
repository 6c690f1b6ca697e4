/**
 * The request-rate counter's fallback to memory is logged for every way Redis can fail a command,
 * not only for a lost connection: a reply error (READONLY, OOM, NOPERM) and a command timeout are
 * no 'error' event of ioredis. Said once per transition, with the error's message and never the
 * REDIS_URL; and once when Redis answers again. During such an outage Redis is asked again by one
 * request after a wait, not by every request (a Redis that hangs with its connection up cost each
 * one the whole command timeout), and a connection whose commands keep timing out is replaced.
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

type ScriptAnswer = 'readonly' | 'taken' | 'silent';

/**
 * Enough of RESP for ioredis: every command is answered +OK but INFO (its ready check) and the
 * script (EVALSHA), which gets `answer`: a READONLY error, one token taken of a limit of 3, or
 * nothing at all (ioredis times the command out).
 */
function fakeRedis(): { server: Server; answer: ScriptAnswer; scripts: number; connections: number } {
  const fake = { server: undefined as unknown as Server, answer: 'readonly' as ScriptAnswer, scripts: 0, connections: 0 };
  const reply = (socket: Socket, command: string) => {
    if (command === 'INFO') {
      const info = '# Server\r\nredis_version:7.2.0\r\nloading:0\r\n';
      socket.write(`$${Buffer.byteLength(info)}\r\n${info}\r\n`);
    } else if (command === 'EVALSHA' || command === 'EVAL') {
      fake.scripts++;
      if (fake.answer === 'readonly') socket.write("-READONLY You can't write against a read only replica.\r\n");
      else if (fake.answer === 'taken') socket.write('*3\r\n:1\r\n:1\r\n:60000\r\n');
    } else socket.write('+OK\r\n');
  };
  fake.server = createServer((socket) => {
    fake.connections++;
    let buffered = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      // Commands are arrays of bulk strings: *<n>\r\n then n times $<len>\r\n<bytes>\r\n.
      for (;;) {
        const args = parseCommand(buffered);
        if (!args) return;
        buffered = buffered.subarray(args.length);
        reply(socket, args.words[0]!.toUpperCase());
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
