/**
 * Client limits across two server processes on one database and the local Redis (issue 32,
 * items 1 and 7): a cap on generations in flight is exact across them (PostgreSQL), and so is a
 * rate of requests per minute with REDIS_URL (one count in Redis). Both processes run the API
 * only (`--role api`): no engine picks the video tasks up, so each stays `queued`, in flight.
 * And the start-up check of item 6: a listen address other machines reach without
 * PUBLIC_BASE_URL ends in one line on stderr and exit code 1; no HOST listens on 127.0.0.1.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const VIDEO = { prompt: 'a boat', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' };

describe('two instances on one database and one Redis', { timeout: 120_000 }, () => {
  let t: TestDatabase;
  const servers: ServerProcess[] = [];
  const prefix = `mediagate-test-${randomBytes(6).toString('hex')}:`;

  beforeAll(async () => {
    t = await createTestDatabase();
    await seedCatalog(t.db);
    const secret = randomBytes(32).toString('hex');
    const env = { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: secret, DEMO_DATA: '0', REDIS_URL: 'redis://127.0.0.1:6379', REDIS_KEY_PREFIX: prefix, MEDIAGATE_DATA_DIR: `${repoRoot}.test-data/limits-${randomBytes(4).toString('hex')}` };
    const command: [string, ...string[]] = [process.execPath, SERVER_ENTRY, '--role', 'api'];
    servers.push(...(await Promise.all([spawnServer({ env, command }), spawnServer({ env, command })])));
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.kill()));
    await t?.destroy();
  });

  async function create(server: ServerProcess, key: string, n: number) {
    const res = await fetch(`${server.url}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...VIDEO, client_request_id: `two-${n}-${randomBytes(4).toString('hex')}` }),
    });
    const body = (await res.json()) as { error?: { code: string } };
    return { status: res.status, code: body.error?.code, remaining: res.headers.get('x-ratelimit-remaining-requests') };
  }

  /** 40 creations at once, alternating between the two instances. */
  const burst = (key: string) => Promise.all(Array.from({ length: 40 }, (_, i) => create(servers[i % 2]!, key, i)));

  it('lets exactly max_in_flight generations of a key in, whichever instance takes them', async () => {
    const c = await createCustomer(t.db, { balance: 1000 });
    // Set before the instances ever saw the key (their auth caches start empty).
    await t.db.updateTable('apiKeys').set({ maxInFlight: 7 }).where('id', '=', c.apiKeyId).execute();
    const results = await burst(c.key);
    expect(results.filter((r) => r.status === 202)).toHaveLength(7);
    expect(results.filter((r) => r.status === 429).every((r) => r.code === 'too_many_in_flight')).toBe(true);
    expect(results.filter((r) => r.status === 429)).toHaveLength(33);
    const counted = await t.db
      .selectFrom('videoTasks')
      .select(sql<number>`count(*)::int`.as('n'))
      .where('apiKeyId', '=', c.apiKeyId)
      .executeTakeFirstOrThrow();
    expect(counted.n).toBe(7);
    const holds = await t.db.selectFrom('creditHolds').select(sql<number>`count(*)::int`.as('n')).where('apiKeyId', '=', c.apiKeyId).executeTakeFirstOrThrow();
    expect(holds.n).toBe(7);
  });

  it("lets exactly an account's requests per minute in across both instances (counted in Redis)", async () => {
    const c = await createCustomer(t.db, { balance: 1000 });
    await t.db.updateTable('accounts').set({ requestsPerMinute: 11 }).where('id', '=', c.accountId).execute();
    const results = await burst(c.key);
    const passed = results.filter((r) => r.status === 202);
    expect(passed).toHaveLength(11);
    expect(results.filter((r) => r.status === 429).every((r) => r.code === 'rate_limited')).toBe(true);
    // One bucket for both: every accepted request saw a different count.
    expect(new Set(passed.map((r) => r.remaining)).size).toBe(11);
    expect(passed.map((r) => Number(r.remaining)).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  });
});

describe('start-up check', { timeout: 60_000 }, () => {
  function run(env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      const child = spawn(process.execPath, [SERVER_ENTRY], {
        cwd: repoRoot,
        env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.once('exit', (code) => resolve({ code, stdout, stderr }));
    });
  }

  it('refuses HOST=0.0.0.0 without PUBLIC_BASE_URL in one line on stderr and exit code 1, before touching anything', async () => {
    const dataDir = `${repoRoot}.test-data/host-${randomBytes(4).toString('hex')}`;
    const res = await run({ HOST: '0.0.0.0', PORT: '0', MEDIAGATE_DATA_DIR: dataDir });
    expect(res.code).toBe(1);
    expect(res.stdout).toBe('');
    expect(res.stderr.endsWith('\n')).toBe(true);
    expect(res.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(res.stderr).toMatch(/^configuration error: HOST=0\.0\.0\.0 is reachable from other machines but PUBLIC_BASE_URL is not set/);
    expect(res.stderr).toContain('set PUBLIC_BASE_URL');
  });

  it('starts on 127.0.0.1 when HOST is not set, and on 0.0.0.0 once PUBLIC_BASE_URL is given', async () => {
    const t = await createTestDatabase();
    try {
      const env = { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), DEMO_DATA: '0' };
      const plain = await spawnServer({ env: { ...env, HOST: '' } });
      try {
        expect(plain.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
        expect((await fetch(`${plain.url}/healthz`)).status).toBe(200);
      } finally {
        await plain.kill();
      }
      const open = await spawnServer({ env: { ...env, HOST: '0.0.0.0', PUBLIC_BASE_URL: 'https://media.example.com' } });
      try {
        expect((await fetch(`${open.url}/healthz`)).status).toBe(200);
      } finally {
        await open.kill();
      }
    } finally {
      await t.destroy();
    }
  });
});
