import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedCatalog } from '../support/factories.ts';
import { PROVIDER_KINDS } from '../../server/providers/provider-kinds.ts';
import { decryptSecret } from '../../server/lib/secret-box.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';
import { adminCli, adminProcess, type CliRun } from '../support/admin-cli.ts';

const secretKey = randomBytes(32);
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
});
afterAll(() => t?.destroy());

/** `npm run admin -- …` on this file's database, in this process (test/support/admin-cli.ts). */
function admin(...args: string[]): Promise<CliRun> {
  return adminCli(args, { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: secretKey.toString('hex') });
}

/** The same as a process, as `npm run admin` runs it. */
function adminProcessHere(...args: string[]): Promise<CliRun> {
  return adminProcess(args, { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: secretKey.toString('hex') });
}

async function json<T>(...args: string[]): Promise<T> {
  const run = await admin(...args, '--json');
  expect(run.stderr).toBe('');
  expect(run.code).toBe(0);
  return JSON.parse(run.stdout) as T;
}

const KEY = /mg_[0-9A-Za-z]{33}/g;

describe('admin CLI', { timeout: 90_000 }, () => {
  describe('as a process', () => {
    it('prints the usage with no arguments, exit code 0', async () => {
      const run = await adminProcessHere();
      expect(run.code).toBe(0);
      expect(run.stdout).toContain('Usage: npm run admin -- <resource> <verb>');
    });

    it('a usage error: exit code 2, the error on stderr, nothing on stdout', async () => {
      const run = await adminProcessHere('accounts', 'frobnicate');
      expect(run.code).toBe(2);
      expect(run.stdout).toBe('');
      expect(run.stderr).toContain("error: unknown command 'accounts frobnicate'");
    });

    it('a command: its JSON on stdout, exit code 0; a refused one: exit code 1', async () => {
      const created = await adminProcessHere('accounts', 'create', '--name', 'cli-process', '--json');
      expect(created.code).toBe(0);
      expect(JSON.parse(created.stdout)).toMatchObject({ name: 'cli-process' });
      const again = await adminProcessHere('accounts', 'create', '--name', 'cli-process');
      expect(again.code).toBe(1);
      expect(again.stdout).toBe('');
      expect(again.stderr).toMatch(/^error: .+\(\w+/);
    });
  });

  it('prints the usage with no arguments', async () => {
    const run = await admin();
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('Usage: npm run admin -- <resource> <verb>');
  });

  it('create account -> create key (printed once) -> list keys (never the key) -> credit', async () => {
    const account = await json<{ id: string; balance: number }>('accounts', 'create', '--name', 'cli-acme', '--initial-credits', '25');
    expect(account.balance).toBe(25);
    await json('groups', 'create', '--name', 'default');

    const created = await admin('keys', 'create', '--account', 'cli-acme', '--name', 'cli key', '--credit-limit', 'none');
    expect(created.code).toBe(0);
    const keys = created.stdout.match(KEY) ?? [];
    expect(keys).toHaveLength(1);
    const fullKey = keys[0]!;
    expect(created.stdout).toContain('shown only once');
    const row = await t.db.selectFrom('apiKeys').select(['id', 'keyPrefix', 'creditLimit']).where('accountId', '=', account.id).executeTakeFirstOrThrow();
    expect(row.creditLimit).toBeNull();
    expect(fullKey.startsWith(row.keyPrefix)).toBe(true);

    for (const args of [['keys', 'list'], ['keys', 'list', '--json'], ['keys', 'get', row.id], ['keys', 'list', '--account', account.id]]) {
      const listed = await admin(...args);
      expect(listed.code).toBe(0);
      expect(listed.stdout).toContain(row.id);
      expect(listed.stdout).not.toMatch(KEY);
      expect(listed.stdout + listed.stderr).not.toContain(fullKey);
    }

    const debit = await json<{ account: { balance: number; total_spent: number }; entry: { kind: string; amount: number } }>(
      'accounts', 'credit', account.id, '--amount', '-5', '--reason', 'cli debit',
    );
    expect(debit.account).toMatchObject({ balance: 20, total_spent: 5 });
    expect(debit.entry).toMatchObject({ kind: 'debit', amount: -5 });
    const grant = await admin('accounts', 'credit', 'cli-acme', '--amount', '2.5', '--reason', 'cli grant');
    expect(grant.code).toBe(0);
    expect(grant.stdout).toMatch(/balance\s+22\.5/);

    const stored = await t.db.selectFrom('accounts').select(['balance', 'totalEarned', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', account.id).executeTakeFirstOrThrow();
    expect(stored).toEqual({ balance: 22_500_000, totalEarned: 27_500_000, totalSpent: 5_000_000 });
    const ledger = await t.db.selectFrom('ledgerEntries').select(['kind', 'amount', 'reason']).where('accountId', '=', account.id).orderBy('id').execute();
    expect(ledger).toEqual([
      { kind: 'grant', amount: 25_000_000, reason: 'initial credits' },
      { kind: 'debit', amount: 5_000_000, reason: 'cli debit' },
      { kind: 'grant', amount: 2_500_000, reason: 'cli grant' },
    ]);
  });

  it('accounts update sets and clears an account\'s own media retention', async () => {
    const account = await json<{ id: string }>('accounts', 'create', '--name', 'cli-retention');
    const set = await json<{ output_retention_days: number | null; input_retention_days: number | null }>(
      'accounts', 'update', 'cli-retention', '--output-retention-days', '90', '--input-retention-days', '2',
    );
    expect(set).toMatchObject({ output_retention_days: 90, input_retention_days: 2 });
    const cleared = await json<{ output_retention_days: number | null; input_retention_days: number | null }>('accounts', 'update', account.id, '--output-retention-days', 'default');
    expect(cleared).toMatchObject({ output_retention_days: null, input_retention_days: 2 });
    const bad = await admin('accounts', 'update', account.id, '--output-retention-days', '0');
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('--output-retention-days');
  });

  it('fails with a clear message and a non-zero exit for an unknown account', async () => {
    const run = await admin('accounts', 'credit', 'acct_doesNotExist', '--amount', '1', '--reason', 'x');
    expect(run.code).toBe(1);
    expect(run.stdout).toBe('');
    expect(run.stderr.trim()).toBe("error: No account has the id or name 'acct_doesNotExist'. (account_not_found)");
  });

  it('refuses a debit beyond the balance with insufficient_balance', async () => {
    await json('accounts', 'create', '--name', 'cli-poor', '--initial-credits', '1');
    const run = await admin('accounts', 'credit', 'cli-poor', '--amount', '-1.5', '--reason', 'too much');
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('(insufficient_balance)');
  });

  it('rejects unknown commands and flags with exit code 2', async () => {
    for (const args of [['accounts', 'explode'], ['accounts', 'list', '--bogus', '1'], ['nothing']]) {
      const run = await admin(...args);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain("Run 'npm run admin -- --help' for usage.");
    }
  });

  it('adds a member with encrypted credentials that are never printed, and manages models and switches', async () => {
    const secret = 'sk-cli-SECRET-never-printed';
    const member = await admin('members', 'add', '--group', 'default', '--name', 'openai-main', '--provider', 'openai', '--models', 'local-image-1,local-image-pro', '--credential', `api_key=${secret}`);
    expect(member.code).toBe(0);
    expect(member.stdout).toMatch(/has_credentials\s+true/);
    expect(member.stdout + member.stderr).not.toContain(secret);
    const row = await t.db.selectFrom('groupMembers').select('credentialsCiphertext').where('name', '=', 'openai-main').executeTakeFirstOrThrow();
    expect(JSON.parse(decryptSecret(secretKey, row.credentialsCiphertext!))).toEqual({ api_key: secret });

    const mapped = await admin('members', 'update', 'openai-main', '--group', 'default', '--model-map', 'local-image-pro=gpt-image-1.5');
    expect(mapped.code).toBe(0);
    expect(mapped.stdout).toContain('"local-image-pro":"gpt-image-1.5"');
    const listed = await admin('members', 'list', '--group', 'default');
    expect(listed.stdout).toMatch(/in_flight\s+state\s+ok\/fail/);
    expect(listed.stdout).toMatch(/openai-main .* 0\s+ok\s+0\/0 .*local-image-pro=gpt-image-1\.5/);
    const stray = await admin('members', 'update', 'openai-main', '--group', 'default', '--model-map', 'local-video-1=sora-2');
    expect(stray.code).toBe(1);
    expect(stray.stderr).toContain('--model-map names models the member does not serve');
    const retired = await admin('members', 'add', '--group', 'default', '--name', 'retired', '--provider', 'openai', '--models', 'local-image-1', '--credential', 'api_key=x');
    expect(retired.code).toBe(0);
    const stillOn = await admin('members', 'delete', 'retired', '--group', 'default');
    expect([stillOn.code, stillOn.stderr]).toEqual([1, expect.stringContaining('set enabled: false first')]);
    expect((await admin('members', 'update', 'retired', '--group', 'default', '--enabled', 'false')).code).toBe(0);
    const deleted = await admin('members', 'delete', 'retired', '--group', 'default');
    expect([deleted.code, deleted.stdout]).toEqual([0, expect.stringMatching(/^deleted member retired \(mem_[0-9A-Za-z]+\)/)]);
    expect(await t.db.selectFrom('groupMembers').select('id').where('name', '=', 'retired').executeTakeFirst()).toBeUndefined();
    const gone = await admin('members', 'delete', 'retired', '--group', 'default');
    expect([gone.code, gone.stderr]).toEqual([1, expect.stringContaining('member_not_found')]);

    // Every provider the admin API takes is a --provider the CLI passes on (it once knew only the first five).
    for (const provider of PROVIDER_KINDS) {
      const run = await admin('members', 'add', '--group', 'default', '--name', `any-${provider}`, '--provider', provider, '--models', 'local-image-1', ...(provider === 'local' ? [] : ['--credential', 'api_key=x', '--credential', 'access_key=x', '--credential', 'secret_key=x', '--credential', 'api_token=x']));
      expect([provider, run.stderr]).not.toEqual([provider, expect.stringContaining('--provider must be one of')]);
      expect([provider, run.code]).not.toEqual([provider, 2]);
    }

    const price = await json<{ pricing: { resolution: string; unit_price: number }[] }>('models', 'set-price', 'local-video-lite', '--resolution', '360p', '--price', '0.03');
    expect(price.pricing).toEqual([{ resolution: '360p', quality: null, mode: 'per_second', unit_price: 0.03 }]);
    const limit = await admin('models', 'set-reference-limit', 'local-video-lite', '--count', '1');
    expect(limit.code).toBe(1);
    expect(limit.stderr).toContain('invalid_request');
    const off = await json<{ enabled: boolean }>('switches', 'set', 'video_generation', 'off');
    expect(off.enabled).toBe(false);
    const disabled = await json<{ enabled: boolean }>('models', 'disable', 'local-image-1');
    expect(disabled.enabled).toBe(false);
  });
});
