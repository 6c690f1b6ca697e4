import { Writable } from 'node:stream';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { ApiError } from '../../server/errors.ts';
import { errorMiddleware, paramFromPath } from '../../server/http/error-middleware.ts';
import { createLogger } from '../../server/logger.ts';
import { isDatabaseUnavailable } from '../../server/db/database.ts';
import { StorageUnavailable } from '../../server/storage/storage-error.ts';

const logs: string[] = [];
let server: Server;
let url: string;

/** A tiny app whose routes throw what the real handlers may throw. */
beforeAll(async () => {
  const log = createLogger('info', new Writable({ write: (chunk: Buffer, _e, cb) => (logs.push(chunk.toString()), cb()) }));
  const app = express();
  app.use((req, _res, next) => {
    (req as express.Request & { id: string }).id = 'req_test123';
    next();
  });
  app.get('/boom', () => {
    throw new Error('secret internals at /srv/app.ts:12');
  });
  app.get('/domain', () => {
    throw new ApiError(409, 'quote_stale', 'The price changed.', 'quote_token', { currentQuote: { unitPrice: 1 } });
  });
  const pgError = (code: string) => Object.assign(new Error(`pg says ${code}`), { code, severity: 'ERROR' });
  app.get('/pg/:code', (req) => {
    throw pgError(req.params.code);
  });
  // What node-postgres throws when the database goes away (see isDatabaseUnavailable).
  const unreachable: Record<string, () => Error> = {
    fatal: () => Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01', severity: 'FATAL' }),
    refused: () => Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED', syscall: 'connect', errno: -111 }),
    terminated: () => new Error('Connection terminated unexpectedly'),
    pooltimeout: () => new Error('timeout exceeded when trying to connect'),
    // PostgreSQL's disk is full: every write fails until space is freed (not the request's fault).
    diskfull: () => Object.assign(new Error('could not extend file "base/16384/16397": No space left on device'), { code: '53100', severity: 'ERROR' }),
  };
  app.get('/db-away/:kind', (req) => {
    throw unreachable[req.params.kind]!();
  });
  app.use(errorMiddleware(log));
  server = app.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

async function get(path: string) {
  const res = await fetch(url + path);
  return { status: res.status, body: (await res.json()) as { error: Record<string, unknown>; [k: string]: unknown } };
}

describe('the error middleware', () => {
  it('answers unexpected errors with 500, the request id and no details, and logs the stack', async () => {
    const res = await get('/boom');
    expect(res.status).toBe(500);
    expect(res.body).toEqual({
      error: { message: "Internal error. Quote request id 'req_test123' when reporting it.", type: 'server_error', code: 'internal_error', param: null, request_id: 'req_test123' },
    });
    expect(JSON.stringify(res.body)).not.toContain('secret internals');
    expect(logs.join('')).toContain('secret internals');
  });

  it('renders domain errors with their extra members', async () => {
    const res = await get('/domain');
    expect(res.status).toBe(409);
    expect(res.body).toEqual({ error: { message: 'The price changed.', type: 'conflict_error', code: 'quote_stale', param: 'quote_token' }, currentQuote: { unitPrice: 1 } });
  });

  it.each([
    ['23505', 409, 'conflict'],
    ['23503', 400, 'invalid_request'],
    ['23514', 400, 'invalid_request'],
    ['40001', 503, 'not_ready'],
    ['08006', 503, 'database_unavailable'],
    ['57P03', 503, 'database_unavailable'],
    ['XX000', 500, 'internal_error'],
  ])('maps SQLSTATE %s to %i %s', async (code, status, errorCode) => {
    const res = await get(`/pg/${code}`);
    expect(res.status).toBe(status);
    expect(res.body.error.code).toBe(errorCode);
    expect(JSON.stringify(res.body)).not.toContain('pg says');
  });
});

describe('a database that cannot be reached', () => {
  it("is never the media store's failure, whose socket error carries a code and a call too (an S3 endpoint refusing connections)", () => {
    const s3 = new StorageUnavailable('video_output/ab/file', Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9000'), { code: 'ECONNREFUSED', syscall: 's3' }));
    expect(isDatabaseUnavailable(s3)).toBe(false);
    expect(isDatabaseUnavailable(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED', syscall: 'connect' }))).toBe(true);
  });

  it.each(['fatal', 'refused', 'terminated', 'pooltimeout', 'diskfull'])('answers %s with a retryable 503 database_unavailable and logs one line without a stack', async (kind) => {
    const before = logs.length;
    const res = await fetch(`${url}/db-away/${kind}`);
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('2');
    expect(await res.json()).toEqual({
      error: { message: 'The database is unavailable right now; retry in 2 s.', type: 'server_error', code: 'database_unavailable', param: null, request_id: 'req_test123' },
    });
    const lines = logs.slice(before).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 40, msg: 'request failed', code: 'database_unavailable' });
    expect(JSON.stringify(lines[0])).not.toContain('stack');
  });
});

describe('paramFromPath', () => {
  it.each([
    ['/body/prompt', "must have required property 'prompt'", 'prompt'],
    ['/body/account/name', 'must be string', 'account.name'],
    ['/query/limit', 'must be <= 200', 'limit'],
    ['/body', "must have required property 'model'", 'model'],
    ['/body', "must NOT have additional properties; found 'colour'", 'colour'],
    [undefined, '', null],
  ])('%s (%s) -> %s', (path, message, expected) => {
    expect(paramFromPath(path, message)).toBe(expected);
  });
});
