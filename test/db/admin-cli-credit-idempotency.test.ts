/**
 * `accounts credit … --idempotency-key KEY`: the same command run again (after an error that left the
 * outcome unknown) applies the adjustment once and prints the original ledger entry; the same key with
 * another amount is refused in the CLI's own terms (exit code 1); the help names the flag.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { adminCli, type CliRun } from '../support/admin-cli.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

function admin(...args: string[]): Promise<CliRun> {
  return adminCli(args, { DATABASE_URL: t.url });
}

interface Adjusted {
  account: { id: string; balance: number; total_earned: number };
  entry: { id: string; kind: string; amount: number; reason: string };
  replayed: boolean;
}

async function json<T>(...args: string[]): Promise<T> {
  const run = await admin(...args, '--json');
  expect(run.stderr).toBe('');
  expect(run.code).toBe(0);
  return JSON.parse(run.stdout) as T;
}

const ledgerOf = (accountId: string) => t.db.selectFrom('ledgerEntries').select(['kind', 'amount', 'reason']).where('accountId', '=', accountId).orderBy('id').execute();

describe('admin CLI: accounts credit --idempotency-key', { timeout: 60_000 }, () => {
  it('run twice with the same key: one grant, both print the original entry, the second saying nothing changed', async () => {
    const account = await json<{ id: string }>('accounts', 'create', '--name', 'cli-idem');
    const args = ['accounts', 'credit', 'cli-idem', '--amount', '40', '--reason', 'invoice 42', '--idempotency-key', 'invoice-42'];
    const first = await json<Adjusted>(...args);
    const again = await json<Adjusted>(...args);
    expect([first.replayed, again.replayed]).toEqual([false, true]);
    expect(again.entry).toEqual(first.entry);
    expect(again.account).toMatchObject({ balance: 40, total_earned: 40 });
    const text = await admin(...args);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain(first.entry.id);
    expect(text.stdout.split('\n')[0]).toBe(`already applied under this idempotency key (ledger entry ${first.entry.id}): nothing changed now`);
    expect(await ledgerOf(account.id)).toEqual([{ kind: 'grant', amount: 40_000_000, reason: 'invoice 42' }]);
    const fresh = await admin('accounts', 'credit', 'cli-idem', '--amount', '1', '--reason', 'another', '--idempotency-key', 'invoice-43');
    expect([fresh.code, fresh.stdout.includes('already applied')]).toEqual([0, false]);
  });

  it('the same key with another amount: exit code 1, idempotency_conflict named as the flag, nothing applied', async () => {
    const account = await json<{ id: string }>('accounts', 'create', '--name', 'cli-idem-409');
    const first = await json<Adjusted>('accounts', 'credit', account.id, '--amount', '10', '--reason', 'top-up', '--idempotency-key', 'k1');
    const run = await admin('accounts', 'credit', account.id, '--amount', '-10', '--reason', 'top-up', '--idempotency-key', 'k1');
    expect(run).toEqual({
      code: 1,
      stdout: '',
      stderr: `error: This --idempotency-key was already used on this account for an adjustment with another amount or reason (ledger entry ${first.entry.id}, 10 credits); nothing was changed. Send a new --idempotency-key for a new adjustment. (idempotency_conflict, --idempotency-key)\n`,
    });
    expect(await ledgerOf(account.id)).toEqual([{ kind: 'grant', amount: 10_000_000, reason: 'top-up' }]);
  });

  it('an empty key is refused as the API refuses it (exit code 2)', async () => {
    await json('accounts', 'create', '--name', 'cli-idem-empty');
    const run = await admin('accounts', 'credit', 'cli-idem-empty', '--amount', '1', '--reason', 'x', '--idempotency-key', '');
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('--idempotency-key');
  });

  it('the help names the flag', async () => {
    const run = await admin('--help');
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('accounts credit <account id|name> --amount N --reason TEXT [--idempotency-key KEY]');
  });
});
