/**
 * `npm start` exactly as the README says, on a machine with no PostgreSQL configured: the server
 * starts an embedded PostgreSQL, creates demo data and prints the key once, serves the API, stops
 * cleanly on Ctrl-C, and a second start reuses the data and creates nothing. A start that fails for
 * a common reason (a wrong DATABASE_URL, a port in use, a damaged secret key file, an S3 bucket
 * that is not there) says so in one line naming the setting to change, and a fresh install's demo
 * key is not spent by it.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';
import { startTestS3 } from '../support/s3-server.ts';
import { spawnServer, repoRoot, type ServerProcess, SERVER_ENTRY, ADMIN_ENTRY } from '../support/server-process.ts';

const KEY_LINE = /Demo API key \(shown only this once; store it now\):\s+(mg_[0-9A-Za-z]+)/;
let dataDir: string;
let current: ServerProcess | undefined;

const scratchDirs: string[] = [];

afterAll(async () => {
  await current?.kill('SIGKILL');
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
  for (const dir of scratchDirs) await rm(dir, { recursive: true, force: true });
});

async function scratchDataDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'mediagate-start-fail-'));
  scratchDirs.push(dir);
  return dir;
}

/** Runs the server expecting it to fail at start: its exit code, stdout and the one fatal (level 60) log line. */
function failingStart(env: Record<string, string>): { status: number | null; stdout: string; fatal: Record<string, unknown>[]; stderr: string } {
  const r = spawnSync(process.execPath, [SERVER_ENTRY], {
    cwd: repoRoot,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    encoding: 'utf8',
    timeout: 90_000,
  });
  const fatal = r.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.level === 60);
  return { status: r.status, stdout: r.stdout, fatal, stderr: r.stderr };
}

/** Exit code 1 and one fatal line matching `pattern`, without a stack (it says what to change instead). */
function expectOneLine(result: ReturnType<typeof failingStart>, pattern: RegExp) {
  expect(result.status).toBe(1);
  expect(result.fatal).toHaveLength(1);
  expect(result.fatal[0]!.msg).toMatch(pattern);
  expect(result.fatal[0]).not.toHaveProperty('err');
  expect(result.stdout).not.toMatch(/"stack"/);
  expect(result.stderr).not.toMatch(/\n\s+at /);
}

async function npmStart(): Promise<ServerProcess> {
  current = await spawnServer({
    command: ['npm', 'start', '--silent'],
    group: true,
    // A long grace: the in-flight request below must finish however loaded the machine is.
    env: { MEDIAGATE_DATA_DIR: dataDir, LOG_LEVEL: 'info', npm_config_update_notifier: 'false', SHUTDOWN_GRACE_MS: '60000', ADMIN_TOKEN: 'server-start-admin-token-0123' },
    timeoutMs: 90_000,
  });
  return current;
}

/** npm exits by the signal itself; the server's own clean stop shows in its log and in PostgreSQL's pid file. */
async function expectCleanStop(p: ServerProcess) {
  const deadline = Date.now() + 20_000;
  while (existsSync(join(dataDir, 'pg', 'postmaster.pid')) || !/"msg":"stopped"/.test(p.stdout())) {
    if (Date.now() > deadline) throw new Error(`no clean stop:\n${p.stdout().slice(-2000)}\n${p.stderr().slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  expect(p.stdout()).not.toMatch(/"level":(50|60)/);
}

async function get(url: string, key: string) {
  const res = await fetch(url, { headers: { Authorization: `Bearer ${key}` } });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

describe('npm start on a fresh machine', () => {
  it('starts embedded PostgreSQL with demo data, stops gracefully, and reuses the data on restart', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'mediagate-start-'));
    const first = await npmStart();
    const key = KEY_LINE.exec(first.stdout())?.[1];
    expect(key).toBeDefined();

    const models = await get(`${first.url}/v1/models`, key!);
    expect(models.status).toBe(200);
    expect(models.body.data.map((m: { id: string }) => m.id)).toEqual(['local-image-1', 'local-image-pro', 'local-video-1', 'local-video-audio', 'local-video-lite']);
    const credits = await get(`${first.url}/v1/credits`, key!);
    expect(credits.body.account).toMatchObject({ balance: 1000, total_earned: 1000, status: 'active' });
    expect(credits.body.api_key.name).toBe('demo');
    // The built server finds the console's build (the page, not the one saying it is missing).
    const consolePage = await fetch(`${first.url}/console/`);
    expect(consolePage.status).toBe(200);
    expect(await consolePage.text()).toContain('<div id="root"');

    // On Node 20 the start says once that it should run on Node 22 or 24 (server/lib/node-runtime.ts).
    const runtimeWarnings = first.stdout().match(/"level":40[^\n]*past its end of life[^\n]*/g) ?? [];
    expect(runtimeWarnings.length).toBe(Number(process.versions.node.split('.')[0]) < 22 ? 1 : 0);
    // On Node 20 it also says that it runs with TurboFan's allocation folding off (applyV8Workarounds).
    if (Number(process.versions.node.split('.')[0]) === 20) expect(runtimeWarnings[0]).toContain('it runs with --no-turbo-allocation-folding');

    // The key was printed once on stdout and never logged.
    expect(first.stdout().split(key!).length - 1).toBe(1);
    expect(first.stderr()).not.toContain(key!);
    expect(existsSync(join(dataDir, 'pg', 'PG_VERSION'))).toBe(true);
    expect(existsSync(join(dataDir, 'pg', 'postmaster.pid'))).toBe(true);

    // The admin CLI works against the embedded database of the running server.
    const cli = spawnSync(process.execPath, [ADMIN_ENTRY, 'accounts', 'list', '--json'], {
      cwd: repoRoot,
      env: { PATH: process.env.PATH ?? '', MEDIAGATE_DATA_DIR: dataDir },
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(cli.status).toBe(0);
    expect(JSON.parse(cli.stdout).data.map((a: { name: string }) => a.name)).toEqual(['demo']);
    expect(existsSync(join(dataDir, 'pg', 'postmaster.pid'))).toBe(true);

    // Ctrl-C with a synchronous image request in flight: the whole process group gets SIGINT, as
    // in a terminal. The embedded PostgreSQL runs in a group of its own, so it outlives the drain:
    // the request finishes and is charged once, and only then does the server stop PostgreSQL.
    const before = credits.body.account.balance as number;
    const inFlight = fetch(`${first.url}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'local-image-pro', prompt: 'a lighthouse at dusk', n: 10, resolution: '2K', aspectRatio: '1:1' }),
    });
    await new Promise((r) => setTimeout(r, 300));
    await first.kill('SIGINT');
    const answer = await inFlight;
    expect(answer.status).toBe(200);
    expect(((await answer.json()) as { data: unknown[] }).data).toHaveLength(10);
    await expectCleanStop(first);
    // Nothing in the log of that stop is a stack trace (the cluster listener's connection ends as expected).
    expect(first.stdout()).not.toMatch(/"stack"/);

    const second = await npmStart();
    expect(second.stdout()).not.toMatch(/Demo API key/);
    const again = await get(`${second.url}/v1/credits`, key!);
    expect(again.status).toBe(200);
    // The ten images were charged (none held, none lost): the balance is what the answer cost less.
    const spent = again.body.account.total_spent as number;
    expect(spent).toBeGreaterThan(0);
    expect(again.body.account.balance).toBe(before - spent);
    await second.kill('SIGTERM');
    await expectCleanStop(second);
  }, 180_000);
});

describe('a start that fails for a common reason ends in one line naming the setting to change', () => {
  const secretKey = randomBytes(32).toString('hex');

  it('a DATABASE_URL nothing listens on, whose user is refused, or whose database does not exist', () => {
    const adminUrl = inject('pgAdminUrl');
    expectOneLine(
      failingStart({ DATABASE_URL: 'postgres://postgres@127.0.0.1:1/mediagate', MEDIAGATE_SECRET_KEY: secretKey }),
      /^cannot connect to the database of DATABASE_URL \(connect ECONNREFUSED 127\.0\.0\.1:1\)\. Check the host and port in DATABASE_URL/,
    );
    const noRole = new URL(adminUrl);
    noRole.username = 'mediagate_no_such_role';
    noRole.password = 'not-the-password';
    // Refused as an unknown role (28000), or as a failed password where PostgreSQL does not say which (28P01).
    expectOneLine(
      failingStart({ DATABASE_URL: noRole.toString(), MEDIAGATE_SECRET_KEY: secretKey }),
      /^the database refused the (user|password) of DATABASE_URL \(.*"mediagate_no_such_role".*\)\. Fix the user name/,
    );
    const name = `mediagate_missing_${randomBytes(4).toString('hex')}`;
    expectOneLine(
      failingStart({ DATABASE_URL: withDatabaseName(adminUrl, name), MEDIAGATE_SECRET_KEY: secretKey }),
      new RegExp(`^the database named in DATABASE_URL does not exist \\(database "${name}" does not exist\\)\\. Create it`),
    );
  }, 120_000);

  it('a PORT in use, on a fresh data directory: no demo key is printed (and spent), and the next start prints it', async () => {
    const dir = await scratchDataDir();
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
    const port = (busy.address() as { port: number }).port;
    try {
      const result = failingStart({ MEDIAGATE_DATA_DIR: dir, PORT: String(port) });
      expectOneLine(result, new RegExp(`^PORT=${port} is already in use on 127\\.0\\.0\\.1\\. Stop the program that uses it, or set PORT to a free port`));
      expect(result.stdout).not.toMatch(/Demo API key/);
    } finally {
      busy.close();
    }
    current = await spawnServer({ env: { MEDIAGATE_DATA_DIR: dir }, timeoutMs: 90_000 });
    expect(current.stdout()).toMatch(KEY_LINE);
    await current.kill('SIGTERM');
  }, 180_000);

  it('a damaged secret key file in the data directory', async () => {
    const dir = await scratchDataDir();
    writeFileSync(join(dir, 'secret.key'), 'not a key\n', { mode: 0o600 });
    expectOneLine(
      failingStart({ MEDIAGATE_DATA_DIR: dir }),
      new RegExp(`^the secret key file is damaged: ${join(dir, 'secret.key')} does not hold 64 hex characters\\. Restore it from a backup, or set MEDIAGATE_SECRET_KEY`),
    );
  }, 120_000);

  it('an S3 bucket that does not exist; an S3 store that cannot be reached starts, with a warning', async () => {
    const adminUrl = inject('pgAdminUrl');
    const database = scratchDatabaseName('mg_start_s3');
    await createScratchDatabase(adminUrl, database, inject('pgTemplate'));
    const s3 = await startTestS3();
    try {
      const env = { ...s3.env(), DATABASE_URL: withDatabaseName(adminUrl, database), MEDIAGATE_SECRET_KEY: secretKey };
      // Asynchronous: the S3 server answers from this process.
      expectOneLine(
        await startAsync({ ...env, S3_BUCKET: 'no-such-bucket' }),
        /^the S3 bucket 'no-such-bucket' does not exist\. Fix S3_BUCKET, S3_REGION or S3_ENDPOINT, or the credentials/,
      );
      // Started (listening, then stopped by the test's SIGTERM: exit 0), with a warning.
      const unreachable = await startAsync({ ...env, S3_ENDPOINT: 'http://127.0.0.1:9' }, /"msg":"listening"/);
      expect([unreachable.status, unreachable.fatal]).toEqual([0, []]);
      expect(unreachable.stdout).toMatch(/"bucket":"mediagate-test".*"the S3 bucket could not be checked at start; media writes fail with storage_unavailable until the store answers"/);
      expect(unreachable.stdout).toMatch(/"msg":"listening"/);
      const reachable = await startAsync({ ...env, S3_PREFIX: 'start/' }, /"msg":"listening"/);
      expect([reachable.status, reachable.fatal]).toEqual([0, []]);
      expect(reachable.stdout).toMatch(/"msg":"listening"/);
      expect(reachable.stdout).not.toMatch(/could not be checked/);
    } finally {
      await s3.close();
      await dropScratchDatabase(adminUrl, database);
    }
  }, 120_000);
});

/**
 * `failingStart` without blocking this process (a server the start talks to runs here): resolves
 * when the process exits, or once its output matches `until` (then it is stopped).
 */
function startAsync(env: Record<string, string>, until?: RegExp): Promise<ReturnType<typeof failingStart>> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [SERVER_ENTRY], {
      cwd: repoRoot,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
    let stopping = false;
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      // Once: a second signal would force the exit (exit 1).
      if (!stopping && until?.test(stdout)) {
        stopping = true;
        child.kill('SIGTERM');
      }
    });
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (status) => {
      clearTimeout(timer);
      const fatal = stdout
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .filter((l) => l.level === 60);
      resolve({ status, stdout, fatal, stderr });
    });
  });
}

