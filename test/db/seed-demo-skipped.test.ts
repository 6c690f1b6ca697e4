/**
 * Demo data at start-up (`npm start`): made only on an empty database, and a start that makes none
 * says why in one log line, so that a first start after an admin command, or a restart whose key
 * was lost, is not a silent dead end.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { seedDemoData, type SeedLogger } from '../../server/db/seed-demo.ts';
import { createAccount } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase | undefined;
afterEach(async () => {
  await t?.destroy();
  t = undefined;
});

function recorder(): SeedLogger & { lines: { level: string; obj: object; msg: string }[] } {
  const lines: { level: string; obj: object; msg: string }[] = [];
  return {
    lines,
    info: (obj, msg) => lines.push({ level: 'info', obj, msg }),
    warn: (obj, msg) => lines.push({ level: 'warn', obj, msg }),
  };
}

describe('seedDemoData', () => {
  it('on an empty database makes the demo account and key and logs nothing', async () => {
    t = await createTestDatabase({ max: 2 });
    const log = recorder();
    const demo = await seedDemoData(t.db, log);
    expect(demo?.apiKey).toMatch(/^mg_/);
    expect(log.lines).toEqual([]);
  });

  it('after an admin command wrote an account, makes nothing and logs one line saying why and what to do', async () => {
    t = await createTestDatabase({ max: 2 });
    await createAccount(t.db, { name: 'acme' });
    const log = recorder();
    expect(await seedDemoData(t.db, log)).toBeUndefined();
    expect(log.lines).toHaveLength(1);
    expect(log.lines[0]).toMatchObject({ level: 'info', obj: { demoData: 'skipped' } });
    expect(log.lines[0]!.msg).toContain('the database already has accounts or groups');
    expect(log.lines[0]!.msg).toContain('keys create');
    expect(await t.db.selectFrom('accounts').select('name').execute()).toEqual([{ name: 'acme' }]);
  });

  it('on a restart says the demo data exists and how to make another key', async () => {
    t = await createTestDatabase({ max: 2 });
    expect(await seedDemoData(t.db, recorder())).toBeDefined();
    const log = recorder();
    expect(await seedDemoData(t.db, log)).toBeUndefined();
    expect(log.lines).toHaveLength(1);
    expect(log.lines[0]!.msg).toContain('exists already');
    expect(log.lines[0]!.msg).toContain('npm run admin -- keys create --account demo --name');
  });
});
