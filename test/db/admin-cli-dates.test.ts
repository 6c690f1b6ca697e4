/**
 * The admin CLI's time flags (`--after` / `--before` of `tasks`, `ledger` and `webhooks list`,
 * `--from` / `--to` of `usage`) take a date and time that exist, as the API's validator does: Feb 31
 * is a usage error (exit code 2) naming the flag, not PostgreSQL's message, and `usage` does not
 * report from Mar 2 for a `--from` of Feb 30 (JavaScript's Date rolls it over).
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../server/errors.ts';
import { UsageService } from '../../server/services/admin/usage.service.ts';
import type { UsageRepository } from '../../server/repositories/usage.repository.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { adminCli, type CliRun } from '../support/admin-cli.ts';

const secretKey = randomBytes(32);
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

/** `npm run admin -- …` on this file's database, in this process (test/support/admin-cli.ts). */
function admin(...args: string[]): Promise<CliRun> {
  return adminCli(args, { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: secretKey.toString('hex') });
}

const usageError = (flag: string, value: string) => ({
  code: 2,
  stdout: '',
  stderr: `error: --${flag} takes an RFC 3339 time such as 2026-01-15T00:00:00Z (a date and time that exist), not '${value}'\nRun 'npm run admin -- --help' for usage.\n`,
});

describe('admin CLI: time flags', { timeout: 90_000 }, () => {
  it('an impossible date or time is a usage error naming the flag (exit code 2)', async () => {
    const cases: [string[], string, string][] = [
      [['tasks', 'list', '--after', '2026-02-31T00:00:00Z'], 'after', '2026-02-31T00:00:00Z'],
      [['tasks', 'list', '--before', '2026-13-01T00:00:00Z'], 'before', '2026-13-01T00:00:00Z'],
      [['ledger', 'list', '--after', '2026-01-01T29:00:00Z'], 'after', '2026-01-01T29:00:00Z'],
      [['webhooks', 'list', '--before', '2026-04-31T00:00:00+01:00'], 'before', '2026-04-31T00:00:00+01:00'],
      [['tasks', 'list', '--after', '2026-01-01T00:00:00+99:99'], 'after', '2026-01-01T00:00:00+99:99'],
      [['usage', '--from', '2026-02-30T00:00:00Z', '--to', '2026-03-05T00:00:00Z'], 'from', '2026-02-30T00:00:00Z'],
      [['usage', '--from', '2026-02-01T00:00:00Z', '--to', '2026-02-29T00:00:00Z'], 'to', '2026-02-29T00:00:00Z'],
    ];
    const runs = await Promise.all(cases.map(([args]) => admin(...args)));
    for (const [i, [args, flag, value]] of cases.entries()) expect([args, runs[i]]).toEqual([args, usageError(flag, value)]);
  });

  it('times that exist pass: a leap day, a leap second, an offset', async () => {
    const runs = await Promise.all([
      admin('tasks', 'list', '--after', '2024-02-29T00:00:00Z', '--json'),
      admin('ledger', 'list', '--before', '2026-12-31T23:59:60Z', '--json'),
      admin('usage', '--from', '2024-02-29T00:00:00+01:00', '--to', '2024-03-01T00:00:00Z', '--json'),
    ]);
    for (const run of runs) expect([run.code, run.stderr]).toEqual([0, '']);
    expect(JSON.parse(runs[0]!.stdout)).toEqual({ data: [], next_cursor: null });
    expect(JSON.parse(runs[2]!.stdout)).toMatchObject({ from: '2024-02-28T23:00:00.000Z', to: '2024-03-01T00:00:00.000Z', rows: [] });
  });

  it("the usage service itself refuses Feb 30 (its callers need not have checked), before any query", async () => {
    const repository = {
      report: () => {
        throw new Error('the report must not run');
      },
    } as unknown as UsageRepository;
    const usage = new UsageService(repository);
    for (const [params, param] of [
      [{ from: '2026-02-30T00:00:00Z', to: '2026-03-05T00:00:00Z' }, 'from'],
      [{ from: '2026-02-01T00:00:00Z', to: '2026-02-29T00:00:00Z' }, 'to'],
    ] as const) {
      const err = await usage.report(params).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ApiError);
      expect(err).toMatchObject({ status: 400, code: 'invalid_request', param });
    }
  });
});
