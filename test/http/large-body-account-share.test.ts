/**
 * One account holds at most half the large-body budget (`LargeBodyBudget.accountShare`): a client
 * trickling a chunked multipart edit (which takes the whole budget without a cap) for up to
 * BODY_TIMEOUT_MS keeps no other account's large edits waiting (then 503 server_busy), and a large
 * request that would take its own account past the share is 429 too_many_in_flight at once, naming
 * the account, its body unread. A body of unknown length is granted the share and stops there (413);
 * one of known length is granted its length (the whole budget at most) when its account holds
 * nothing: the budget counts the bytes held in memory, never fewer.
 */
import { request, type ClientRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey, createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

const BUDGET = 4_000_000;
const SHARE = BUDGET / 2;

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({
    // A wait long enough that a request refused for its account's share cannot be a wait run out.
    env: { LARGE_BODY_BYTES: '200000', LARGE_BODY_BUDGET_BYTES: String(BUDGET), LARGE_BODY_WAIT_MS: '3000' },
  });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const BOUNDARY = 'b0undary';
const CONTENT_TYPE = `multipart/form-data; boundary=${BOUNDARY}`;
const HEAD = Buffer.from(
  `--${BOUNDARY}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\nlocal-image-1\r\n` +
    `--${BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`,
);

/** A whole multipart edit whose image is `bytes` bytes that are not an image (400 invalid_image once read). */
function editBody(bytes: number): Buffer {
  return Buffer.concat([HEAD, Buffer.alloc(bytes, 7), Buffer.from(`\r\n--${BOUNDARY}--\r\n`)]);
}

async function sendEdit(key: string, body: Buffer) {
  const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': CONTENT_TYPE }, body });
  const json = (await res.json()) as { error?: { code: string; message: string } };
  return { status: res.status, code: json.error?.code, message: json.error?.message, retryAfter: res.headers.get('retry-after') };
}

/** A chunked multipart edit whose head is sent and whose body never ends (until the test destroys it). */
function trickle(key: string): ClientRequest {
  const url = new URL(`${server.directUrl}/v1/images/edits`);
  const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': CONTENT_TYPE, 'Transfer-Encoding': 'chunked' } });
  req.on('error', () => undefined);
  req.on('response', (res) => res.resume());
  req.write(HEAD);
  return req;
}

describe("an account's share of the large-body budget", () => {
  it('leaves the other half to other accounts while one trickles a chunked body, and refuses its own next large body with 429', async () => {
    const budget = server.ctx.services.largeBodies;
    expect(budget.accountShare).toBe(SHARE);
    const hog = await createCustomer(server.db, { balance: 0 });
    const victim = await createCustomer(server.db, { balance: 100 });
    const slow = trickle(hog.key);
    try {
      await until(() => budget.inUse > 0, 10_000, 'the chunked body to take its part of the budget');

      // Another account's large edit is read and handled at once (its image is no image: 400),
      // not kept waiting LARGE_BODY_WAIT_MS for a budget the chunked body holds whole, then 503.
      expect(await sendEdit(victim.key, editBody(300_000))).toMatchObject({ status: 400, code: 'invalid_image' });
      // A body of unknown length takes its account's whole share, no more.
      expect([budget.inUse, budget.heldBy(hog.accountId)]).toEqual([SHARE, SHARE]);

      // The hog's next large body, from another key of the same account, is its account's excess.
      const second = await createApiKey(server.db, { accountId: hog.accountId, groupId: hog.groupId });
      expect(await sendEdit(second.key, editBody(300_000))).toEqual({
        status: 429,
        code: 'too_many_in_flight',
        message: `This API key's account already has 1.9 MiB of large request bodies being received or handled on this server; with this one's 0.3 MiB it would pass its share of 1.9 MiB. Retry when one of them has finished.`,
        retryAfter: '1',
      });
      expect(budget.heldBy(hog.accountId)).toBe(SHARE);
    } finally {
      slow.destroy();
    }
    // The share is given back with the response, and the account's large bodies are read again.
    await until(() => budget.inUse === 0 && budget.heldBy(hog.accountId) === 0, 10_000, 'the share given back');
    expect(await sendEdit(hog.key, editBody(300_000))).toMatchObject({ status: 400, code: 'invalid_image' });
  });

  it('takes a body of known length larger than the share whole when its account holds nothing (the budget bounds memory, never overcommitted)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const budget = server.ctx.services.largeBodies;
    const body = editBody(SHARE + 500_000);
    // Sent slowly enough to look at the budget while it is read.
    const url = new URL(`${server.directUrl}/v1/images/edits`);
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': CONTENT_TYPE, 'Content-Length': body.length } });
    const answered = new Promise<number>((resolve) => req.on('response', (res) => (res.resume(), resolve(res.statusCode!))));
    req.write(body.subarray(0, 1000));
    await until(() => budget.inUse > 0, 10_000, 'the body to take its part of the budget');
    expect([budget.inUse, budget.heldBy(c.accountId)]).toEqual([body.length, body.length]);
    req.end(body.subarray(1000));
    expect(await answered).toBe(400);
    await until(() => budget.heldBy(c.accountId) === 0, 10_000, 'the budget given back');
  });

  it('stops a body of unknown length at the share it was granted: 413, never more in memory than the budget counts', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const url = new URL(`${server.directUrl}/v1/images/edits`);
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': CONTENT_TYPE, 'Transfer-Encoding': 'chunked' } });
    req.on('error', () => undefined);
    const answered = new Promise<{ status: number; code?: string }>((resolve) =>
      req.on('response', (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, code: (JSON.parse(text) as { error?: { code: string } }).error?.code }));
      }),
    );
    req.end(editBody(SHARE + 500_000));
    expect(await answered).toEqual({ status: 413, code: 'body_too_large' });
  });
});
