/**
 * The embedded PostgreSQL launcher on the machines operators really have: as root (containers,
 * fresh VMs) with the checkout or the data directory inside a private (0700) folder, after a
 * server was killed, and when something is broken: each failure is one clear log line and a
 * non-zero exit, never an unhandled 'error' event or a bare stack.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startEmbeddedPostgres, EmbeddedPostgresError, classifyPostgresOutput, findFreePort } from '../../server/db/embedded.ts';
import { platformBinaries } from '../../server/db/embedded-layout.ts';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';

const isRoot = process.getuid?.() === 0;
const cleanup: string[] = [];
const running: ServerProcess[] = [];
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGKILL')));
  for (const dir of cleanup) rmSync(dir, { recursive: true, force: true });
});

/** A 0700 folder, like /root or a `mktemp -d` folder; inside the checkout so hard links work. */
function privateFolder(): string {
  const dir = join(repoRoot, '.test-data', `private-${randomBytes(4).toString('hex')}`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  cleanup.push(dir);
  return dir;
}

/** Where root keeps relocated clusters and binaries in these tests (instead of /var/lib/mediagate). */
function pgRootDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-pgroot-'));
  chmodSync(dir, 0o755);
  cleanup.push(dir);
  return dir;
}

const quiet = { info: () => undefined, warn: () => undefined };

const sleepers: ChildProcess[] = [];
afterAll(() => {
  for (const child of sleepers) child.kill('SIGKILL');
});

/** A live process that is neither PostgreSQL nor Mediagate, killed after the tests. */
function liveProcess(): ChildProcess {
  const child = spawn('sleep', ['600'], { stdio: 'ignore' });
  sleepers.push(child);
  return child;
}

async function readyz(url: string): Promise<number> {
  return (await fetch(`${url}/readyz`)).status;
}

async function start(env: Record<string, string>, cwd?: string): Promise<ServerProcess> {
  const p = await spawnServer({ env: { LOG_LEVEL: 'info', ...env }, ...(cwd && { cwd }), timeoutMs: 90_000 });
  running.push(p);
  return p;
}

/** Runs the server expecting it to fail at start; returns its exit code and log lines. */
function failingStart(env: Record<string, string>): { status: number | null; lines: Record<string, unknown>[]; stderr: string } {
  const r = spawnSync(process.execPath, [SERVER_ENTRY], {
    cwd: repoRoot,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    encoding: 'utf8',
    timeout: 60_000,
  });
  const lines = r.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { status: r.status, lines, stderr: r.stderr };
}

function expectOneClearFatalLine(result: ReturnType<typeof failingStart>, pattern: RegExp) {
  expect(result.status).toBe(1);
  const fatal = result.lines.filter((l) => l.level === 60);
  expect(fatal).toHaveLength(1);
  expect(fatal[0]!.msg).toMatch(pattern);
  expect(fatal[0]).not.toHaveProperty('err'); // no stack: the line says what failed and what to do
  expect(result.stderr).not.toMatch(/Unhandled|Emitted 'error' event|\n\s+at /);
}

describe('as root with a private home directory', () => {
  // Not as root, vitest reports this one skipped under its title: only the data-directory case runs.
  it.runIf(isRoot)('starts from a checkout inside a 0700 folder (needs root; skipped otherwise): binaries the postgres user cannot reach are copied, and /readyz answers', async () => {
    const home = privateFolder();
    const checkout = join(home, 'mediagate');
    mkdirSync(checkout);
    // A checkout of its own (hard links: instant), so the binaries really sit below the 0700 folder.
    const copy = spawnSync('cp', ['-al', 'node_modules', 'dist', 'server', 'generated', 'package.json', 'tsconfig.json', checkout], { cwd: repoRoot });
    expect(copy.status).toBe(0);
    const root = pgRootDir();
    const server = await start({ MEDIAGATE_DATA_DIR: join(checkout, '.mediagate'), MEDIAGATE_PG_ROOT_DIR: root }, checkout);
    expect(await readyz(server.url)).toBe(200);
    expect(server.stdout()).toContain(`PostgreSQL binaries in ${join(root, 'runtime')}`);
    expect(server.stdout()).toMatch(/lives in .*clusters/);
    expect(existsSync(join(root, 'runtime'))).toBe(true);
    await server.kill('SIGTERM');
    expect((await server.exited).code).toBe(0);
  }, 180_000);

  it('starts with MEDIAGATE_DATA_DIR below a 0700 folder, and keeps using the same cluster on restart', async () => {
    const dataDir = join(privateFolder(), 'data');
    const root = pgRootDir();
    const env = { MEDIAGATE_DATA_DIR: dataDir, MEDIAGATE_PG_ROOT_DIR: root };
    const first = await start(env);
    expect(await readyz(first.url)).toBe(200);
    expect(first.stdout()).toMatch(/Demo API key/);
    if (isRoot) {
      // The postgres user cannot enter the folder: the cluster lives under the root dir, recorded in pg-location.
      const clusterDir = readFileSync(join(dataDir, 'pg-location'), 'utf8').trim();
      expect(clusterDir.startsWith(join(root, 'clusters'))).toBe(true);
      expect(first.stdout()).toContain(`lives in ${clusterDir}`);
      const owner = statSync(clusterDir).uid;
      expect(owner).not.toBe(0);
    } else {
      expect(existsSync(join(dataDir, 'pg', 'PG_VERSION'))).toBe(true);
    }
    await first.kill('SIGTERM');
    const second = await start(env);
    expect(await readyz(second.url)).toBe(200);
    expect(second.stdout()).not.toMatch(/Demo API key/); // same data: nothing seeded twice
    await second.kill('SIGTERM');
  }, 180_000);
});

describe('left-overs of a killed server', () => {
  it('recovers the PostgreSQL that a SIGKILLed server left running', async () => {
    const env = { MEDIAGATE_DATA_DIR: join(privateFolder(), 'data'), MEDIAGATE_PG_ROOT_DIR: pgRootDir() };
    const killed = await start(env);
    await killed.kill('SIGKILL');
    // Its PostgreSQL outlived it: the next start must not trip over it.
    const next = await start(env);
    expect(await readyz(next.url)).toBe(200);
    expect(next.stdout()).toMatch(/left running by a killed Mediagate process/);
    await next.kill('SIGTERM');
  }, 180_000);

  it('refuses to share the cluster with a live server, in one clear line', async () => {
    const env = { MEDIAGATE_DATA_DIR: join(privateFolder(), 'data'), MEDIAGATE_PG_ROOT_DIR: pgRootDir() };
    const owner = await start(env);
    const second = failingStart(env);
    expectOneClearFatalLine(second, new RegExp(`another Mediagate process \\(pid ${owner.child.pid}\\) runs the embedded PostgreSQL.*Stop that process first`));
    expect(await readyz(owner.url)).toBe(200);
    await owner.kill('SIGTERM');
  }, 180_000);

  it('removes a stale postmaster.pid whose pid now belongs to another process', async () => {
    const dataDir = join(privateFolder(), 'data');
    const rootDir = pgRootDir();
    const warnings: string[] = [];
    const log = { info: () => undefined, warn: (m: string) => warnings.push(m) };
    const first = await startEmbeddedPostgres({ dataDir, log, rootDir });
    const pidFile = join(first.clusterDir, 'postmaster.pid');
    const lines = readFileSync(pidFile, 'utf8').split('\n');
    await first.stop();
    // As after a crash: the file is back, naming a pid that is now a live, unrelated process (us).
    lines[0] = String(process.pid);
    writeFileSync(pidFile, lines.join('\n'));
    const second = await startEmbeddedPostgres({ dataDir, log, rootDir });
    expect(warnings.some((w) => w.includes('removing stale') && w.includes(pidFile))).toBe(true);
    await second.stop();
  }, 120_000);

  it('leaves alone a postmaster.pid with the negative pid of a live process (initdb, a single-user backend), and says another process owns the cluster', async () => {
    const dataDir = join(privateFolder(), 'data');
    const rootDir = pgRootDir();
    const first = await startEmbeddedPostgres({ dataDir, log: quiet, rootDir });
    const pidFile = join(first.clusterDir, 'postmaster.pid');
    const lines = readFileSync(pidFile, 'utf8').split('\n');
    await first.stop();
    // PostgreSQL marks a backend running without a postmaster with its pid negated; its command
    // line need not name the cluster (initdb passes it in PGDATA).
    const other = liveProcess();
    lines[0] = String(-other.pid!);
    writeFileSync(pidFile, lines.join('\n'));
    const refused = await startEmbeddedPostgres({ dataDir, log: quiet, rootDir }).then(
      () => 'started',
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(EmbeddedPostgresError);
    expect((refused as Error).message).toMatch(new RegExp(`another process \\(pid ${other.pid}\\) runs PostgreSQL without a postmaster on ${first.clusterDir}.*Wait for it to finish, or stop it`));
    expect((refused as Error).message).not.toMatch(/remove/);
    expect(readFileSync(pidFile, 'utf8')).toBe(lines.join('\n'));

    // Once that process is gone, the file is a left-over like any other.
    other.kill('SIGKILL');
    await once(other, 'exit');
    const warnings: string[] = [];
    const next = await startEmbeddedPostgres({ dataDir, log: { info: () => undefined, warn: (m) => warnings.push(m) }, rootDir });
    expect(warnings.some((w) => w.includes('removing stale') && w.includes(pidFile))).toBe(true);
    await next.stop();
  }, 120_000);
});

describe('one process at a time starts the cluster of a data directory', () => {
  it('refuses to start while a live process holds the start lock, touching nothing, and takes over the lock of a process that is gone', async () => {
    const dataDir = join(privateFolder(), 'data');
    mkdirSync(dataDir);
    const rootDir = pgRootDir();
    const lock = join(dataDir, 'pg-start.lock');
    const holder = liveProcess();
    writeFileSync(lock, `${holder.pid}\n`);
    await expect(startEmbeddedPostgres({ dataDir, log: quiet, rootDir })).rejects.toThrow(
      new RegExp(`another Mediagate process \\(pid ${holder.pid}\\) is starting the embedded PostgreSQL of ${dataDir}\\. Stop that process first`),
    );
    expect(readFileSync(lock, 'utf8')).toBe(`${holder.pid}\n`);
    expect(existsSync(join(dataDir, 'pg-password'))).toBe(false); // nothing of the cluster was looked at or made

    holder.kill('SIGKILL');
    await once(holder, 'exit');
    const warnings: string[] = [];
    const handle = await startEmbeddedPostgres({ dataDir, log: { info: () => undefined, warn: (m) => warnings.push(m) }, rootDir });
    expect(warnings).toContain(`taking over ${lock}, left by process ${holder.pid}, which is gone`);
    expect(existsSync(lock)).toBe(false); // held only while starting
    await handle.stop();
  }, 120_000);

  it('two starts at once in one process: one starts, the other is refused', async () => {
    const dataDir = join(privateFolder(), 'data');
    const rootDir = pgRootDir();
    const [a, b] = await Promise.allSettled([startEmbeddedPostgres({ dataDir, log: quiet, rootDir }), startEmbeddedPostgres({ dataDir, log: quiet, rootDir })]);
    const started = [a, b].filter((r) => r.status === 'fulfilled');
    const refused = [a, b].filter((r) => r.status === 'rejected');
    expect(started).toHaveLength(1);
    expect(refused).toHaveLength(1);
    expect(String(refused[0]!.reason)).toMatch(new RegExp(`another Mediagate process \\(pid ${process.pid}\\) is starting the embedded PostgreSQL`));
    await started[0]!.value.stop();
  }, 120_000);

  it('two servers started at once on a fresh data directory: one runs, the other stops in one line without advice to remove the cluster', async () => {
    const env = { MEDIAGATE_DATA_DIR: join(privateFolder(), 'data'), MEDIAGATE_PG_ROOT_DIR: pgRootDir() };
    const results = await Promise.allSettled([start(env), start(env)]);
    const up = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    const down = results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []));
    expect(up).toHaveLength(1);
    expect(down).toHaveLength(1);
    expect(down[0]).toMatch(/server exited \(code 1, signal null\) before listening/);
    const fatal = down[0]!.split('\n').filter((l) => l.includes('"level":60'));
    expect(fatal).toHaveLength(1);
    expect(fatal[0]).toMatch(/another Mediagate process \(pid \d+\) (is starting|runs) the embedded PostgreSQL/);
    expect(down[0]).not.toMatch(/to start empty|"stack"/);
    // The cluster the first one built is whole: it serves, and stops cleanly.
    expect(await readyz(up[0]!.url)).toBe(200);
    expect(up[0]!.stdout()).toMatch(/Demo API key/);
    expect((await up[0]!.kill('SIGTERM')).code).toBe(0);
  }, 180_000);
});

describe('failures end in one clear log line and a non-zero exit', () => {
  it('a data directory that is a file', () => {
    const file = join(privateFolder(), 'not-a-folder');
    writeFileSync(file, 'x');
    expectOneClearFatalLine(failingStart({ MEDIAGATE_DATA_DIR: file, MEDIAGATE_PG_ROOT_DIR: pgRootDir() }), /is not a folder.*Set MEDIAGATE_DATA_DIR/);
  }, 60_000);

  it('a cluster created by a newer PostgreSQL major version', () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'mediagate-newer-'));
    cleanup.push(dataDir);
    mkdirSync(join(dataDir, 'pg'), { recursive: true });
    writeFileSync(join(dataDir, 'pg', 'PG_VERSION'), '99\n');
    writeFileSync(join(dataDir, 'pg-password'), 'secret\n');
    expectOneClearFatalLine(failingStart({ MEDIAGATE_DATA_DIR: dataDir, MEDIAGATE_PG_ROOT_DIR: pgRootDir() }), /created by a newer PostgreSQL \(99\) than this build ships \(\d+\).*Use the Mediagate release that created it/);
  }, 60_000);

  it('binaries that cannot be spawned (missing, not executable) are errors, not crashes', async () => {
    const real = await platformBinaries();
    const folder = privateFolder();
    // Binaries in a folder everyone can reach: one missing, one without the execute bit.
    const dir = mkdtempSync(join(tmpdir(), 'mediagate-bin-'));
    cleanup.push(dir);
    chmodSync(dir, 0o755);
    const missing = startEmbeddedPostgres({ dataDir: join(folder, 'a'), log: quiet, rootDir: pgRootDir(), binaries: { ...real, initdb: join(dir, 'no-such-initdb') } });
    await expect(missing).rejects.toThrow(EmbeddedPostgresError);
    await expect(missing).rejects.toThrow(/cannot run .*no-such-initdb.*it does not exist.*npm ci/);

    const notExecutable = join(dir, 'initdb');
    writeFileSync(notExecutable, '#!/bin/sh\nexit 0\n', { mode: 0o644 });
    const denied = startEmbeddedPostgres({ dataDir: join(folder, 'b'), log: quiet, rootDir: pgRootDir(), binaries: { ...real, initdb: notExecutable } });
    await expect(denied).rejects.toThrow(/cannot run .*initdb.*permission denied/);
  }, 60_000);

  it('initdb failing on a full disk names the disk and says to free space', async () => {
    const real = await platformBinaries();
    const dir = mkdtempSync(join(tmpdir(), 'mediagate-bin-'));
    cleanup.push(dir);
    chmodSync(dir, 0o755);
    // Simulated: initdb's own message when the filesystem fills up mid-initialisation.
    const initdb = join(dir, 'initdb');
    writeFileSync(initdb, '#!/bin/sh\necho \'initdb: error: could not write to file "pg_wal/xlogtemp.123": No space left on device\' >&2\nexit 1\n', { mode: 0o755 });
    const dataDir = join(privateFolder(), 'data');
    const full = startEmbeddedPostgres({ dataDir, log: quiet, rootDir: pgRootDir(), binaries: { ...real, initdb } });
    await expect(full).rejects.toThrow(/the disk is full .*No space left on device.*Free some disk space/);
  }, 60_000);

  it('ports taken by someone else: retried, then a clear error', async () => {
    const servers: Server[] = [];
    const occupied = async () => {
      const port = await findFreePort();
      const s = createServer();
      await new Promise<void>((r) => s.listen(port, '127.0.0.1', r));
      servers.push(s);
      return port;
    };
    try {
      const dataDir = join(privateFolder(), 'data');
      const warnings: string[] = [];
      const taken = startEmbeddedPostgres({ dataDir, log: { info: () => undefined, warn: (m) => warnings.push(m) }, rootDir: pgRootDir(), pickPort: occupied });
      await expect(taken).rejects.toThrow(/no free port: 3 loopback ports were taken/);
      expect(warnings.filter((w) => /port \d+ was taken/.test(w))).toHaveLength(2);

      // Taken once, then free: it simply starts.
      let calls = 0;
      const handle = await startEmbeddedPostgres({ dataDir, log: quiet, rootDir: pgRootDir(), pickPort: () => (calls++ === 0 ? occupied() : findFreePort()) });
      expect(calls).toBe(2);
      await handle.stop();
    } finally {
      for (const s of servers) s.close();
    }
  }, 120_000);

  it('classifies PostgreSQL output into causes with what to do', () => {
    const dir = '/data/pg';
    expect(classifyPostgresOutput('FATAL:  could not write lock file "postmaster.pid": No space left on device', dir)?.message).toMatch(/disk is full.*Free some disk space on the filesystem of \/data\/pg/);
    expect(classifyPostgresOutput('FATAL:  database files are incompatible with server\nDETAIL:  The data directory was initialized by PostgreSQL version 19', dir)?.message).toMatch(/incompatible with this PostgreSQL/);
    expect(classifyPostgresOutput('FATAL:  lock file "postmaster.pid" already exists', dir)?.message).toMatch(/another PostgreSQL already uses/);
    // What a postmaster started on a cluster another one (or initdb) holds says; nothing to remove.
    const sharedMemory = classifyPostgresOutput('FATAL:  pre-existing shared memory block (key 1234, ID 5) is still in use', dir)?.message;
    expect(sharedMemory).toMatch(/another PostgreSQL already uses \/data\/pg\. Stop the other Mediagate/);
    expect(sharedMemory).not.toMatch(/remove/);
    expect(classifyPostgresOutput('FATAL:  could not open directory "/data/pg": Permission denied', dir)?.message).toMatch(/permission denied/);
    expect(classifyPostgresOutput('LOG:  starting PostgreSQL 18', dir)).toBeUndefined();
  });
});
