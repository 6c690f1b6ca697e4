/**
 * Production safety (hardening): a server pointed at an external database creates no demo account
 * or key unless DEMO_DATA is set explicitly, and then it says so with a warning.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
const running: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGKILL')));
  await t?.destroy();
});

async function start(extra: Record<string, string>): Promise<ServerProcess> {
  const p = await spawnServer({
    env: { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), LOG_LEVEL: 'info', ...extra },
  });
  running.push(p);
  return p;
}

describe('demo data with an external database', () => {
  it('is off by default, and an explicit DEMO_DATA=1 seeds it with a warning', async () => {
    const quiet = await start({});
    expect(quiet.stdout()).not.toMatch(/Demo API key/);
    expect(await t.db.selectFrom('accounts').select('name').execute()).toEqual([]);
    await quiet.kill('SIGTERM');

    const explicit = await start({ DEMO_DATA: '1' });
    expect(explicit.stdout()).toMatch(/Demo API key \(shown only this once; store it now\):\s+mg_/);
    expect(explicit.stdout()).toMatch(/"level":40.*DEMO_DATA is on with an external database/);
    expect(await t.db.selectFrom('accounts').select('name').execute()).toEqual([{ name: 'demo' }]);
    await explicit.kill('SIGTERM');
  }, 120_000);
});
