/**
 * Factories with defaults and overrides (no fixtures). They write straight to the database, the way
 * the services would, so tests can set up any state in one call.
 */
import type { Insertable, Kysely } from 'kysely';
import type { DB, ImageTasks } from '../../generated/db.d.ts';
import type { CatalogModelDefinition } from '../../server/catalog/capabilities.ts';
import { upsertCatalog } from '../../server/db/seed-demo.ts';
import { LOCAL_MODELS } from '../../server/catalog/local-catalog.ts';
import { generateApiKey } from '../../server/lib/api-key-material.ts';
import { newId } from '../../server/lib/ids.ts';
import { MICRO } from '../../server/lib/money.ts';

export interface AccountOverrides {
  name?: string;
  /** Credits (not micro-credits). */
  balance?: number;
  status?: 'active' | 'suspended';
}

export async function createAccount(db: Kysely<DB>, o: AccountOverrides = {}): Promise<{ id: string }> {
  const id = newId('acct');
  const balance = Math.round((o.balance ?? 100) * MICRO);
  await db
    .insertInto('accounts')
    .values({ id, name: o.name ?? `account-${id}`, status: o.status ?? 'active', balance, totalEarned: balance })
    .execute();
  if (balance > 0) await db.insertInto('ledgerEntries').values({ accountId: id, kind: 'grant', amount: balance, reason: 'test factory' }).execute();
  return { id };
}

export async function createGroup(db: Kysely<DB>, o: { name?: string } = {}): Promise<{ id: string }> {
  const id = newId('grp');
  await db.insertInto('backendGroups').values({ id, name: o.name ?? `group-${id.slice(4, 14).toLowerCase()}` }).execute();
  return { id };
}

export async function createMember(
  db: Kysely<DB>,
  groupId: string,
  o: { name?: string; provider?: 'local' | 'openai' | 'gemini' | 'ark' | 'kling'; models?: string[]; enabled?: boolean; credentials?: Buffer | null } = {},
): Promise<{ id: string }> {
  const id = newId('mem');
  await db
    .insertInto('groupMembers')
    .values({
      id,
      groupId,
      name: o.name ?? `member-${id}`,
      provider: o.provider ?? 'local',
      models: o.models ?? LOCAL_MODELS.map((m) => m.id),
      enabled: o.enabled ?? true,
      credentialsCiphertext: o.credentials ?? null,
    })
    .execute();
  return { id };
}

export interface KeyOverrides {
  accountId?: string;
  groupId?: string;
  name?: string;
  /** Credits; null = unlimited (default). */
  creditLimit?: number | null;
  isActive?: boolean;
}

export async function createApiKey(db: Kysely<DB>, o: KeyOverrides & { accountId: string; groupId: string }): Promise<{ id: string; key: string }> {
  const material = generateApiKey();
  const id = newId('key');
  await db
    .insertInto('apiKeys')
    .values({
      id,
      accountId: o.accountId,
      groupId: o.groupId,
      name: o.name ?? 'test key',
      keyHash: material.hash,
      keyPrefix: material.prefix,
      lastFour: material.lastFour,
      isActive: o.isActive ?? true,
      creditLimit: o.creditLimit === undefined || o.creditLimit === null ? null : Math.round(o.creditLimit * MICRO),
    })
    .execute();
  return { id, key: material.key };
}

export async function seedCatalog(db: Kysely<DB>, models: CatalogModelDefinition[] = LOCAL_MODELS): Promise<void> {
  await upsertCatalog(db, models);
}

/** An account with a balance, a group with a local member serving every local model, and a key. */
export async function createCustomer(
  db: Kysely<DB>,
  o: AccountOverrides & Omit<KeyOverrides, 'accountId' | 'groupId'> & { models?: string[] } = {},
): Promise<{ accountId: string; groupId: string; apiKeyId: string; key: string }> {
  const account = await createAccount(db, o);
  const group = await createGroup(db);
  await createMember(db, group.id, { models: o.models });
  const key = await createApiKey(db, { ...o, accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, apiKeyId: key.id, key: key.key };
}

/**
 * A synchronous image task of `n` images at `unitPrice` micro-credits, as the image service inserts
 * it with its hold (leased by `leaseOwner`, attempt 1), for a fresh account of `balance` credits.
 */
export async function imageTaskToHold(db: Kysely<DB>, o: { n?: number; unitPrice?: number; balance?: number; leaseOwner?: string } = {}) {
  const group = await createGroup(db);
  const account = await createAccount(db, { balance: o.balance ?? 100 });
  const key = await createApiKey(db, { accountId: account.id, groupId: group.id });
  const n = o.n ?? 1;
  const unitPrice = o.unitPrice ?? MICRO;
  const taskId = newId('img');
  const row: Insertable<ImageTasks> = {
    id: taskId,
    accountId: account.id,
    apiKeyId: key.id,
    groupId: group.id,
    operation: 'generation',
    model: 'm',
    prompt: 'p',
    params: JSON.stringify({ outputFormat: 'png' }),
    inputFileIds: [],
    maskFileId: null,
    n,
    unitPrice,
    quotedCredits: n * unitPrice,
    runAsync: false,
    attempt: 1,
    leaseOwner: o.leaseOwner ?? 'test',
    leaseExpiresAt: new Date(Date.now() + 60_000),
  };
  return { accountId: account.id, apiKeyId: key.id, taskId, row, hold: { holdId: newId('hold'), accountId: account.id, apiKeyId: key.id, taskId, amount: n * unitPrice } };
}
