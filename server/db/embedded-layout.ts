/**
 * Where the embedded PostgreSQL's binaries and data live, and as whom it runs.
 *
 * PostgreSQL refuses to run as root, so a root process runs it as the unprivileged `postgres` user
 * (created when missing). That user must be able to reach the binaries and the data directory. A
 * checkout in `/root` (mode 0700) or a data directory below any private folder is out of its reach,
 * so as root:
 *   - binaries the `postgres` user cannot execute are copied once, per PostgreSQL build, to
 *     `<root dir>/runtime/<version>-<platform>-<arch>/` (world-readable);
 *   - a data directory the `postgres` user cannot enter gets its cluster in
 *     `<root dir>/clusters/<name>-<hash of the data directory>/`, owned by `postgres`, and
 *     `<data dir>/pg-location` records where, so every later start (and the admin CLI) finds it.
 * `<root dir>` is MEDIAGATE_PG_ROOT_DIR, default `/var/lib/mediagate/embedded-postgres`.
 * Everything else (password, secret key, media) stays in the data directory, readable by root only.
 */
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, cpSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';

export const DEFAULT_ROOT_DIR = '/var/lib/mediagate/embedded-postgres';
const POSTGRES_USER = 'postgres';

/** A failure of the embedded PostgreSQL, with what the operator should do about it. */
export class EmbeddedPostgresError extends Error {
  constructor(
    readonly what: string,
    readonly hint: string,
  ) {
    super(`embedded PostgreSQL: ${what}. ${hint}`);
    this.name = 'EmbeddedPostgresError';
  }
}

export interface PostgresBinaries {
  initdb: string;
  postgres: string;
  /** The `native/` folder holding bin/, lib/ and share/. */
  nativeDir: string;
  /** Full version of the binary package, e.g. `18.4.0-beta.17`. */
  version: string;
  /** Major PostgreSQL version, e.g. 18. */
  major: number;
}

export interface RunAs {
  uid: number;
  gid: number;
}

export interface EmbeddedLayout {
  binaries: PostgresBinaries;
  /** The cluster (PGDATA). */
  clusterDir: string;
  /** True when the cluster lives outside the data directory (see the module comment). */
  relocated: boolean;
  /** The unprivileged user PostgreSQL runs as when this process is root. */
  runAs: RunAs | undefined;
  /** True when the binaries were copied where that user can reach them. */
  binariesCopied: boolean;
}

export const isRoot = (): boolean => process.getuid?.() === 0;

/** The PostgreSQL binaries of this platform's `@embedded-postgres/*` package. */
export async function platformBinaries(): Promise<PostgresBinaries> {
  const name = `@embedded-postgres/${process.platform}-${process.arch}`;
  let mod: { initdb: string; postgres: string };
  try {
    mod = (await import(name)) as { initdb: string; postgres: string };
  } catch {
    throw new EmbeddedPostgresError(
      `no PostgreSQL binaries for ${process.platform}-${process.arch} (package ${name} is not installed)`,
      'Run `npm ci` on this machine (the binaries are an optional dependency per platform), or set DATABASE_URL to use your own PostgreSQL.',
    );
  }
  const nativeDir = dirname(dirname(mod.initdb));
  let version = '0';
  try {
    version = (JSON.parse(readFileSync(join(dirname(nativeDir), 'package.json'), 'utf8')) as { version: string }).version;
  } catch {
    // Unknown version: the major-version check is skipped.
  }
  return { initdb: mod.initdb, postgres: mod.postgres, nativeDir, version, major: Number.parseInt(version, 10) || 0 };
}

function run(command: string, args: string[]): { ok: boolean; output: string } {
  const r = spawnSync(command, args, { encoding: 'utf8' });
  return { ok: r.status === 0, output: `${r.stdout ?? ''}${r.stderr ?? ''}${r.error ? String(r.error) : ''}`.trim() };
}

/** The `postgres` user's ids, creating the user (a system account without login) when missing. */
export function ensurePostgresUser(): RunAs {
  const ids = () => {
    const uid = run('id', ['-u', POSTGRES_USER]);
    const gid = run('id', ['-g', POSTGRES_USER]);
    return uid.ok && gid.ok ? { uid: Number(uid.output), gid: Number(gid.output) } : undefined;
  };
  const found = ids();
  if (found) return found;
  const attempts: [string, string[]][][] = [
    [
      ['groupadd', ['--system', POSTGRES_USER]],
      ['useradd', ['--system', '--gid', POSTGRES_USER, '--no-create-home', '--shell', '/usr/sbin/nologin', POSTGRES_USER]],
    ],
    // BusyBox (Alpine)
    [
      ['addgroup', ['-S', POSTGRES_USER]],
      ['adduser', ['-S', '-D', '-H', '-G', POSTGRES_USER, POSTGRES_USER]],
    ],
  ];
  const errors: string[] = [];
  for (const steps of attempts) {
    for (const [command, args] of steps) {
      const r = run(command, args);
      if (!r.ok && !/already exists/.test(r.output)) errors.push(`${command}: ${r.output}`);
    }
    const created = ids();
    if (created) return created;
  }
  throw new EmbeddedPostgresError(
    `running as root, and the unprivileged '${POSTGRES_USER}' user PostgreSQL needs could not be created (${errors.join('; ').slice(0, 300)})`,
    `Create it (useradd --system ${POSTGRES_USER}), run Mediagate as a non-root user, or set DATABASE_URL.`,
  );
}

/** Whether `user` can `test` `flag` on `path` (path traversal included): asks the kernel, as that user. */
export function accessibleAs(user: RunAs, path: string, flag: '-x' | '-r' | '-w'): boolean {
  const r = spawnSync('/bin/sh', ['-c', `test ${flag} "$1"`, 'sh', path], { uid: user.uid, gid: user.gid, cwd: '/', stdio: 'ignore' });
  return r.status === 0;
}

/**
 * Binaries the `postgres` user can execute: the package's own, or a one-time copy under the root
 * dir (written to a temporary folder and renamed into place, so a half copy is never used).
 */
function reachableBinaries(binaries: PostgresBinaries, user: RunAs, rootDir: string): PostgresBinaries {
  const probe = join(binaries.nativeDir, 'share', 'postgresql', 'postgres.bki');
  if (accessibleAs(user, binaries.initdb, '-x') && accessibleAs(user, existsSync(probe) ? probe : binaries.nativeDir, '-r')) return binaries;
  const target = join(rootDir, 'runtime', `${binaries.version}-${process.platform}-${process.arch}`);
  if (!existsSync(join(target, '.complete'))) {
    mkdirSync(dirname(target), { recursive: true, mode: 0o755 });
    makeTraversable(rootDir, dirname(target));
    const tmp = `${target}.${randomBytes(4).toString('hex')}.tmp`;
    try {
      cpSync(binaries.nativeDir, tmp, { recursive: true, verbatimSymlinks: true });
      chmodSync(tmp, 0o755);
      writeFileSync(join(tmp, '.complete'), `${binaries.version}\n`);
      rmSync(target, { recursive: true, force: true });
      renameSync(tmp, target);
    } catch (err) {
      rmSync(tmp, { recursive: true, force: true });
      if (!existsSync(join(target, '.complete'))) throw err; // another process finished it meanwhile otherwise
    }
  }
  return { ...binaries, nativeDir: target, initdb: join(target, 'bin', 'initdb'), postgres: join(target, 'bin', 'postgres') };
}

/** Adds search permission for others on `dir` and its ancestors up to `top` (folders we created). */
function makeTraversable(top: string, dir: string): void {
  for (let d = resolve(dir); ; d = dirname(d)) {
    const mode = statSync(d).mode & 0o777;
    if ((mode & 0o001) === 0) chmodSync(d, mode | 0o005);
    if (d === resolve(top) || d === dirname(d)) break;
  }
}

/** `<data dir>/pg-location`: where a relocated cluster lives. */
export const locationFile = (dataDir: string) => join(resolve(dataDir), 'pg-location');

/** The cluster of a data directory as recorded so far, without creating anything (readers: admin CLI, migrate). */
export function recordedClusterDir(dataDir: string): string {
  try {
    const recorded = readFileSync(locationFile(dataDir), 'utf8').trim();
    if (recorded) return recorded;
  } catch {
    // not relocated
  }
  return join(resolve(dataDir), 'pg');
}

/** Creates the cluster folder owned by `user` (initdb then fills it; it insists on mode 0700). */
function prepareClusterDir(dir: string, user: RunAs | undefined): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  if (user) chownSync(dir, user.uid, user.gid);
}

/**
 * Decides (and prepares) where the binaries and the cluster of `dataDir` live, per the module
 * comment. The data directory is created when missing. Given `binaries` are used as they are.
 */
export async function resolveLayout(
  dataDir: string,
  rootDir: string = process.env.MEDIAGATE_PG_ROOT_DIR || DEFAULT_ROOT_DIR,
  binaries?: PostgresBinaries,
): Promise<EmbeddedLayout> {
  const dir = resolve(dataDir);
  mkdirSync(dir, { recursive: true });
  const given = binaries !== undefined;
  binaries ??= await platformBinaries();
  if (!isRoot()) return { binaries, clusterDir: join(dir, 'pg'), relocated: false, runAs: undefined, binariesCopied: false };

  const user = ensurePostgresUser();
  const layout = chooseRootLayout(dir, binaries, user, rootDir, !given);
  for (const [path, what] of [
    [dirname(layout.binaries.initdb), 'the PostgreSQL binaries'],
    [dirname(layout.clusterDir), 'the folder of the PostgreSQL data'],
  ] as const) {
    if (!accessibleAs(user, path, '-x')) {
      throw new EmbeddedPostgresError(
        `running as root, PostgreSQL runs as the '${POSTGRES_USER}' user, which cannot reach ${what} (${path})`,
        `Give that user search permission on every folder above it, or set MEDIAGATE_PG_ROOT_DIR to a folder it can reach (default ${DEFAULT_ROOT_DIR}).`,
      );
    }
  }
  return layout;
}

function chooseRootLayout(dir: string, binaries: PostgresBinaries, user: RunAs, rootDir: string, copyBinaries: boolean): EmbeddedLayout {
  const reachable = copyBinaries ? reachableBinaries(binaries, user, rootDir) : binaries;
  const common = { binaries: reachable, runAs: user, binariesCopied: reachable !== binaries };
  const recorded = recordedClusterDir(dir);
  const inPlace = join(dir, 'pg');
  if (recorded !== inPlace) {
    prepareClusterDir(recorded, user);
    return { ...common, clusterDir: recorded, relocated: true };
  }
  // Our own data directory: let others through it (they still cannot list or read it).
  const mode = statSync(dir).mode & 0o777;
  if ((mode & 0o001) === 0) chmodSync(dir, mode | 0o001);
  if (existsSync(join(inPlace, 'PG_VERSION')) || accessibleAs(user, dir, '-x')) {
    prepareClusterDir(inPlace, user);
    return { ...common, clusterDir: inPlace, relocated: false };
  }
  const hash = createHash('sha256').update(dir).digest('hex').slice(0, 12);
  const clusterDir = join(rootDir, 'clusters', `${basename(dir).replace(/[^A-Za-z0-9._-]/g, '_')}-${hash}`);
  mkdirSync(dirname(clusterDir), { recursive: true, mode: 0o755 });
  makeTraversable(rootDir, dirname(clusterDir));
  prepareClusterDir(clusterDir, user);
  writeFileSync(locationFile(dir), `${clusterDir}\n`, { mode: 0o600 });
  return { ...common, clusterDir, relocated: true };
}
