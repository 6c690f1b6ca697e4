/**
 * Date-time query parameters (`created_after` / `created_before` of the listings, `from` / `to` of
 * the usage report) name a time that exists: an impossible calendar date or clock time (Feb 31,
 * month 13, hour 29, offset +99:99) is a 400 naming the parameter, not a 500 from PostgreSQL nor a
 * report of other dates (JavaScript's Date rolls Feb 30 to Mar 2). What the format lets through and
 * PostgreSQL cannot take (year 0000, an offset past 15:59) is a 400 too, by its SQLSTATE.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { contractSchema, isDateTime } from '../../server/contract-schemas.ts';

let server: TestServer;
let key: string;

beforeAll(async () => {
  server = await startTestServer();
  key = (await createCustomer(server.db, { balance: 10 })).key;
});
afterAll(async () => server?.close());

interface Answer {
  status: number;
  error?: { code: string; param: string | null; message: string };
  body: Record<string, unknown>;
}

/** GET `path` with `query` (values as written, percent-encoded), straight to the server: Prism would refuse them first. */
async function get(path: string, query: Record<string, string>, authorization = `Bearer ${key}`): Promise<Answer> {
  const qs = Object.entries(query)
    .map(([k, v]) => `${k}=${encodeURIComponent(v)}`)
    .join('&');
  const res = await fetch(`${server.directUrl}${path}?${qs}`, { headers: { Authorization: authorization } });
  const body = (await res.json()) as Record<string, unknown> & { error?: Answer['error'] };
  return { status: res.status, error: body.error, body };
}

const admin = (path: string, query: Record<string, string>) => get(path, query, `Bearer ${ADMIN_TOKEN}`);

const IMPOSSIBLE = ['2026-02-31T00:00:00Z', '2026-02-29T00:00:00Z', '2026-13-01T00:00:00Z', '2026-00-10T00:00:00Z', '2026-04-31T00:00:00Z', '2026-01-01T29:00:00Z', '2026-01-01T24:00:00Z', '2026-01-01T00:00:00+99:99', '2026-01-01T00:00:00-24:00', '2026-06-30T12:59:60Z'];

describe('impossible date-times', () => {
  it('GET /v1/videos?created_after=2026-02-31T00:00:00Z and the like are 400 naming the parameter', async () => {
    for (const value of IMPOSSIBLE) {
      const res = await get('/v1/videos', { created_after: value });
      expect([value, res.status, res.error?.code, res.error?.param]).toEqual([value, 400, 'invalid_request', 'created_after']);
      expect(res.error!.message).toBe(`Invalid 'created_after': must match format "date-time".`);
    }
    const before = await get('/v1/images', { created_before: '2026-02-30T00:00:00Z' });
    expect([before.status, before.error?.code, before.error?.param]).toEqual([400, 'invalid_request', 'created_before']);
  });

  it('the admin listings too (GET /admin/v1/tasks, /ledger, /webhook-deliveries)', async () => {
    for (const path of ['/admin/v1/tasks', '/admin/v1/ledger', '/admin/v1/webhook-deliveries']) {
      const res = await admin(path, { created_before: '2026-02-30T00:00:00Z' });
      expect([path, res.status, res.error?.code, res.error?.param]).toEqual([path, 400, 'invalid_request', 'created_before']);
    }
  });

  it('GET /admin/v1/usage with from=2026-02-30 is 400, not a report from Mar 2', async () => {
    const res = await admin('/admin/v1/usage', { from: '2026-02-30T00:00:00Z', to: '2026-03-05T00:00:00Z' });
    expect([res.status, res.error?.code, res.error?.param]).toEqual([400, 'invalid_request', 'from']);
    expect(res.error!.message).toBe(`Invalid 'from': must match format "date-time".`);
    const to = await admin('/admin/v1/usage', { from: '2026-02-01T00:00:00Z', to: '2026-02-29T00:00:00Z' });
    expect([to.status, to.error?.param]).toEqual([400, 'to']);
  });

  it('times that exist still pass: a leap day, a leap second, offsets, fractions, lower case', async () => {
    for (const value of ['2024-02-29T00:00:00Z', '2000-02-29T12:00:00+01:00', '2026-12-31T23:59:60Z', '2026-01-01T00:00:00.123456-15:59', '2026-01-01t00:00:00z', '0001-01-01T00:00:00Z']) {
      const res = await get('/v1/videos', { created_after: value });
      expect([value, res.status]).toEqual([value, 200]);
    }
    const report = await admin('/admin/v1/usage', { from: '2024-02-29T00:00:00Z', to: '2024-03-01T00:00:00Z' });
    expect(report.status).toBe(200);
    expect(report.body).toMatchObject({ from: '2024-02-29T00:00:00.000Z', to: '2024-03-01T00:00:00.000Z' });
  });
});

describe('date-times the format passes and PostgreSQL cannot take', () => {
  it('year 0000 and an offset past 15:59 are 400 naming the parameter (SQLSTATE 22008, 22009), not 500', async () => {
    const year0 = await get('/v1/videos', { created_after: '0000-01-01T00:00:00Z' });
    expect([year0.status, year0.error?.code, year0.error?.param]).toEqual([400, 'invalid_request', 'created_after']);
    expect(year0.error!.message).toBe(`Invalid 'created_after': a date or time is out of range.`);
    const offset = await admin('/admin/v1/tasks', { created_after: '2026-01-01T00:00:00Z', created_before: '2026-01-01T00:00:00+16:00' });
    expect([offset.status, offset.error?.code, offset.error?.param]).toEqual([400, 'invalid_request', 'created_before']);
    expect(offset.error!.message).toBe(`Invalid 'created_before': a time zone offset is out of range.`);
    // Nothing of it was an unknown error.
    expect(server.logs.filter((line) => line.includes('"request failed"'))).toEqual([]);
  });
});

describe('the format', () => {
  it('isDateTime: RFC 3339 as the fast format writes it, of a date and time that exist', () => {
    for (const value of IMPOSSIBLE) expect([value, isDateTime(value)]).toEqual([value, false]);
    for (const value of ['2026-01-01', '2026-01-01T00:00Z', '2026-01-01 00:00:00Z', '2026-01-01T00:00:00', ' 2026-01-01T00:00:00Z']) expect([value, isDateTime(value)]).toEqual([value, false]);
    for (const value of ['2024-02-29T00:00:00Z', '1900-02-28T00:00:00Z', '2026-12-31T23:59:60+00:00', '2026-01-31T00:00:00.5+0530', '2026-01-01T00:00:00-01', '0000-01-01T00:00:00Z']) {
      expect([value, isDateTime(value)]).toEqual([value, true]);
    }
    expect(isDateTime('1900-02-29T00:00:00Z')).toBe(false);
  });

  it('the schemas the CLI and the generation fast path compile check it as the validator does', () => {
    const spec = { openapi: '3.1.0', paths: {}, components: { schemas: { When: { type: 'object', properties: { at: { type: 'string', format: 'date-time' } } } } } };
    const validate = contractSchema('When', spec);
    expect(validate({ at: '2026-02-28T00:00:00Z' })).toBe(true);
    expect(validate({ at: '2026-02-31T00:00:00Z' })).toBe(false);
    expect(validate.errors?.[0]).toMatchObject({ instancePath: '/at', message: 'must match format "date-time"' });
  });
});
