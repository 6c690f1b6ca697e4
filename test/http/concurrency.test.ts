/**
 * One account and one key under ordinary client concurrency: 64 image generations and 64 video
 * creates at once, while the video tasks complete and settle. Every statement takes its locks in
 * one order (task → hold → key → account), so nothing deadlocks: no 5xx, no retried transaction,
 * and every credit is accounted for in the ledger.
 */
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { instantImageProvider, instantVideoProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let server: TestServer;

beforeAll(async () => {
  const png = await sharp({ create: { width: 32, height: 32, channels: 3, background: '#123456' } }).png().toBuffer();
  server = await startTestServer({
    workers: true,
    env: { WORKER_CONCURRENCY: '8', TASK_POLL_MS: '20' },
    overrides: { providers: { local: { image: instantImageProvider(png), video: instantVideoProvider(Buffer.from('fake mp4 bytes')) } } },
  });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function post(key: string, path: string, body: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  await res.arrayBuffer();
  return res.status;
}

describe('one account, one key, 128 concurrent generations mixed with settlements', () => {
  it('never deadlocks, never answers 5xx, and accounts for every credit', async () => {
    const c = await createCustomer(server.db, { balance: 1000, creditLimit: 900 });
    const images = Array.from({ length: 64 }, (_, i) => post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: `conc ${i}` }));
    const videos = Array.from({ length: 64 }, (_, i) =>
      post(c.key, '/v1/videos/generations', { client_request_id: `conc-${i}`, prompt: `conc ${i}`, model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
    );
    const statuses = await Promise.all([...images, ...videos]);
    expect(statuses.slice(0, 64).every((s) => s === 200)).toBe(true);
    expect(statuses.slice(64).every((s) => s === 202)).toBe(true);

    // Every video completes and captures its quote.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const open = await server.db.selectFrom('videoTasks').select(sql<number>`count(*)::int`.as('n')).where('accountId', '=', c.accountId).where('status', '<>', 'completed').executeTakeFirstOrThrow();
      if (open.n === 0) break;
      if (Date.now() > deadline) throw new Error(`${open.n} video tasks did not complete`);
      await new Promise((r) => setTimeout(r, 50));
    }

    const holds = await server.db.selectFrom('creditHolds').select(['status', 'amount', 'captured']).where('accountId', '=', c.accountId).execute();
    expect(holds).toHaveLength(128);
    expect(holds.every((h) => h.status === 'captured' && h.captured === h.amount)).toBe(true);
    const spent = 64 * 1_000_000 + 64 * 100_000; // 64 images at 1 credit, 64 videos of 2 s at 0.05/s
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: 1_000_000_000 - spent, totalSpent: spent });
    const key = await server.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', c.apiKeyId).executeTakeFirstOrThrow();
    expect(key.creditsUsed).toBe(spent);
    const ledger = await sql<{ kind: string; total: number }>`
      select kind, sum(amount)::bigint as total from ledger_entries where account_id = ${c.accountId} group by kind order by kind`.execute(server.db);
    expect(Object.fromEntries(ledger.rows.map((r) => [r.kind, Number(r.total)]))).toEqual({ grant: 1_000_000_000, hold: spent, capture: spent });

    expect(server.logs.filter((l) => /deadlock|conflicted|"level":50/.test(l))).toEqual([]);
  }, 60_000);
});
