/**
 * The admin CLI's errors speak in its flags: what the admin services and the contract check name by
 * body field (`group_id`, `credentials`, `name`) the CLI names by the flag that sets it (`--group`,
 * `--credential`, `--name`), in the message and the param; a value typed on the command line that
 * happens to be a field's name stays as typed. A `--credential` whose value is empty (an unset
 * environment variable) says so, instead of asking for the name=value it has.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedCatalog } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { adminCli, type CliRun } from '../support/admin-cli.ts';

const secretKey = randomBytes(32);
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
});
afterAll(() => t?.destroy());

function admin(...args: string[]): Promise<CliRun> {
  return adminCli(args, { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: secretKey.toString('hex') });
}

const USAGE_HINT = "Run 'npm run admin -- --help' for usage.\n";

describe('admin CLI errors', { timeout: 90_000 }, () => {
  // The database has no group named 'default' (nothing here creates one).
  it('keys create without a default group asks for --group, not group_id', async () => {
    expect((await admin('accounts', 'create', '--name', 'errs-acct')).code).toBe(0);
    const run = await admin('keys', 'create', '--account', 'errs-acct', '--name', 'k1');
    expect(run).toEqual({
      code: 1,
      stdout: '',
      stderr: "error: No group is named 'default': pass --group to choose the key's backend group. (invalid_request, --group)\n",
    });
    expect((await admin('groups', 'create', '--name', 'errs')).code).toBe(0);
    expect((await admin('keys', 'create', '--account', 'errs-acct', '--name', 'k1', '--group', 'errs')).code).toBe(0);
  });

  it('names the flags in the contract check and the services\' refusals', async () => {
    const badName = await admin('groups', 'create', '--name', 'Bad Name!');
    expect(badName).toEqual({ code: 2, stdout: '', stderr: 'error: Invalid --name: must match pattern "^[a-z0-9][a-z0-9_-]*$". (invalid_request, --name)\n' });
    const noCredentials = await admin('members', 'add', '--group', 'errs', '--name', 'm-openai', '--provider', 'openai', '--models', 'local-image-1');
    expect(noCredentials.code).toBe(1);
    expect(noCredentials.stderr).toBe("error: Provider 'openai' needs --credential (api_key). (invalid_request, --credential)\n");
    const limit = await admin('keys', 'create', '--account', 'errs-acct', '--name', 'k2', '--group', 'errs', '--credit-limit', '-1');
    expect(limit).toEqual({ code: 2, stdout: '', stderr: 'error: Invalid --credit-limit: must be >= 0. (invalid_request, --credit-limit)\n' });
  });

  it('leaves a quoted field alone where it is a value typed on the command line', async () => {
    expect((await admin('accounts', 'create', '--name', 'name')).code).toBe(0);
    const again = await admin('accounts', 'create', '--name', 'name');
    expect(again).toEqual({ code: 1, stdout: '', stderr: "error: An account named 'name' already exists. (conflict, name)\n" });
    const other = await admin('accounts', 'create', '--name', 'errs-acct');
    expect(other.stderr).toBe("error: An account named 'errs-acct' already exists. (conflict, --name)\n");
  });

  it('says a --credential value is empty (an unset variable), not that it lacks name=value', async () => {
    const add = ['members', 'add', '--group', 'errs', '--name', 'm-empty', '--provider', 'openai', '--models', 'local-image-1'];
    const empty = await admin(...add, '--credential', 'api_key=');
    expect(empty).toEqual({ code: 2, stdout: '', stderr: `error: --credential api_key=: the value of api_key is empty\n${USAGE_HINT}` });
    const shapeless = await admin(...add, '--credential', 'sk-123');
    expect(shapeless.stderr).toBe(`error: --credential must look like name=value (e.g. api_key=sk-...)\n${USAGE_HINT}`);
    const members = await t.db.selectFrom('groupMembers').select('name').where('name', '=', 'm-empty').execute();
    expect(members).toEqual([]);
  });
});
