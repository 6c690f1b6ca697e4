/**
 * How a bench starts the server process: (`--built`, the default) from dist/, as `npm start` and a
 * production deployment run it (`node dist/server/main.js`), or (`--tsx`) from the TypeScript
 * sources through tsx.
 */
import { spawnSync } from 'node:child_process';
import { repoRoot } from '../../test/support/server-process.ts';

export interface ServerCommandOptions {
  built?: boolean;
  /** Write a V8 CPU profile of the server here when it exits. */
  cpuProfDir?: string;
}

/** The command for spawnServer, or undefined for its default (tsx, no profiler). */
export function serverCommand(o: ServerCommandOptions): [string, ...string[]] | undefined {
  // Experiments: Node/V8 flags for the server (BENCH_SERVER_NODE_FLAGS="--no-memory-reducer …"),
  // including those NODE_OPTIONS refuses.
  const flags = (process.env.BENCH_SERVER_NODE_FLAGS ?? '').split(/\s+/).filter(Boolean);
  const profile = [...flags, ...(o.cpuProfDir ? ['--cpu-prof', `--cpu-prof-dir=${o.cpuProfDir}`] : [])];
  if (o.built) return [process.execPath, ...profile, 'dist/server/main.js'];
  return profile.length > 0 ? [process.execPath, ...profile, '--import', 'tsx', 'server/main.ts'] : undefined;
}

/**
 * Brings dist/ up to date as `npm start` does (scripts/start.mjs: the changed files compiled, no
 * type check), with the bench's own processes (scripts/bench); throws with its output when it fails.
 */
export function buildServer(): void {
  const r = spawnSync(process.execPath, ['scripts/start.mjs', 'scripts/bench'], { cwd: repoRoot, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`building dist/ failed:\n${r.stdout}\n${r.stderr}`);
}
