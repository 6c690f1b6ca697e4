/**
 * Demo data at start-up (`npm start`): made only on an empty database, and a start that makes none
 * says why in one log line, so that a first start after an admin command, or a restart whose key
 * was lost, is not a silent dead end.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LOCAL_MODELS } from '../../server/catalog/local-catalog.ts';
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
    // The local models are in the catalog all the same, for a member of provider local (named in the line).
    const models = await t.db.selectFrom('catalogModels').select('id').orderBy('id').execute();
    expect(models.map((m) => m.id)).toEqual(LOCAL_MODELS.map((m) => m.id).sort());
    expect(log.lines[0]!.msg).toContain(`--provider local --models ${LOCAL_MODELS.map((m) => m.id).join(',')}`);
  });

  it('leaves the local models as an operator changed them', async () => {
    t = await createTestDatabase({ max: 2 });
    await createAccount(t.db, { name: 'acme' });
    await seedDemoData(t.db, recorder());
    await t.db.updateTable('modelPrices').set({ unitPrice: 7 }).where('modelId', '=', 'local-image-1').execute();
    await t.db.updateTable('catalogModels').set({ enabled: false }).where('id', '=', 'local-image-1').execute();
    await seedDemoData(t.db, recorder());
    const model = await t.db.selectFrom('catalogModels').select('enabled').where('id', '=', 'local-image-1').executeTakeFirstOrThrow();
    const prices = await t.db.selectFrom('modelPrices').select('unitPrice').where('modelId', '=', 'local-image-1').execute();
    expect([model.enabled, prices.every((p) => Number(p.unitPrice) === 7)]).toEqual([false, true]);
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
