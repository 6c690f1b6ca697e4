/**
 * Demo data for a fresh install (design.md §10): account `demo` with 1,000 credits, group `default`
 * with a `local` member serving every local model, the local catalog with prices, and one API key.
 * Runs only on an empty database (no accounts and no groups), under a transaction-level advisory
 * lock so that instances booting together seed once. Returns the new key, or undefined when the
 * database was not empty: then one line says why no key was printed (a restart, or accounts or
 * groups written first by `npm run admin` or the admin API) and how to make a key; in the second
 * case the local models are still put in the catalog, for a `local` member.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { CatalogModelDefinition } from '../catalog/capabilities.ts';
import { inTransaction, type TransactionLogger } from './transaction.ts';
import { LOCAL_MODELS } from '../catalog/local-catalog.ts';
import { generateApiKey } from '../lib/api-key-material.ts';
import { newId } from '../lib/ids.ts';
import { MICRO } from '../lib/money.ts';

const SEED_LOCK = 0x6d67_5345; // "mgSE"
export const DEMO_CREDITS = 1_000;

/** Inserts catalog rows and their prices (idempotent per model id). */
export async function upsertCatalog(db: Kysely<DB>, models: CatalogModelDefinition[]): Promise<void> {
  for (const model of models) {
    await db
      .insertInto('catalogModels')
      .values({ id: model.id, kind: model.kind, displayName: model.displayName, capabilities: JSON.stringify(model.capabilities) })
      .onConflict((oc) => oc.column('id').doNothing())
      .execute();
    await db
      .insertInto('modelPrices')
      .values(model.prices.map((p) => ({ modelId: model.id, resolution: p.resolution, quality: p.quality, mode: p.mode, unitPrice: p.unitPrice })))
      .onConflict((oc) => oc.columns(['modelId', 'resolution', 'quality']).doNothing())
      .execute();
  }
}

export interface SeedLogger extends TransactionLogger {
  info(obj: object, msg: string): void;
}

export async function seedDemoData(db: Kysely<DB>, log: SeedLogger): Promise<{ apiKey: string; accountId: string } | undefined> {
  return inTransaction(db, log, async (trx) => {
    await sql`select pg_advisory_xact_lock(${SEED_LOCK})`.execute(trx);
    const existing = await trx
      .selectNoFrom((eb) => [
        eb.exists(eb.selectFrom('accounts').select('id')).as('hasAccounts'),
        eb.exists(eb.selectFrom('backendGroups').select('id')).as('hasGroups'),
        eb.exists(eb.selectFrom('accounts').select('id').where('name', '=', 'demo')).as('hasDemo'),
        eb.selectFrom('catalogModels').select((c) => c.fn.countAll<string>().as('n')).where('id', 'in', LOCAL_MODELS.map((m) => m.id)).as('localModels'),
      ])
      .executeTakeFirstOrThrow();
    if (existing.hasAccounts || existing.hasGroups) {
      // A start that prints no key must say why: a first start after an admin command looks like a
      // fresh install that forgot its demo data. The local models still go into the catalog (kept as
      // they are when there): they ship with no definition file, and a `local` member needs them.
      // Only while one is missing: a restart writes nothing.
      if (!existing.hasDemo && Number(existing.localModels) < LOCAL_MODELS.length) await upsertCatalog(trx, LOCAL_MODELS);
      log.info(
        { demoData: 'skipped' },
        existing.hasDemo
          ? "demo data skipped: it exists already (its key was printed at the first start); make another key with `npm run admin -- keys create --account demo --name NAME`"
          : `demo data skipped: the database already has accounts or groups (written by \`npm run admin\` or the admin API), so no demo account, group or key was made; set up a group, a member and a key with \`npm run admin\` (groups create, members add, keys create), or start on an empty database. The local models are in the catalog for a member of provider local: \`npm run admin -- members add --group GROUP --name local --provider local --models ${LOCAL_MODELS.map((m) => m.id).join(',')}\``,
      );
      return undefined;
    }

    await upsertCatalog(trx, LOCAL_MODELS);
    const groupId = newId('grp');
    await trx.insertInto('backendGroups').values({ id: groupId, name: 'default', description: 'Default group (demo data)' }).execute();
    await trx
      .insertInto('groupMembers')
      .values({ id: newId('mem'), groupId, name: 'local', provider: 'local', models: LOCAL_MODELS.map((m) => m.id), priority: 0, weight: 1 })
      .execute();

    const accountId = newId('acct');
    const grant = DEMO_CREDITS * MICRO;
    await trx.insertInto('accounts').values({ id: accountId, name: 'demo', balance: grant, totalEarned: grant }).execute();
    await trx.insertInto('ledgerEntries').values({ accountId, kind: 'grant', amount: grant, reason: 'demo data' }).execute();

    const key = generateApiKey();
    await trx
      .insertInto('apiKeys')
      .values({ id: newId('key'), accountId, groupId, name: 'demo', keyHash: key.hash, keyPrefix: key.prefix, lastFour: key.lastFour })
      .execute();
    return { apiKey: key.key, accountId };
  });
}
