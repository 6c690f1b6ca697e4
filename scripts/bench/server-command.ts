/**
 * How a bench starts the server process: from the TypeScript sources through tsx, as `npm start`
 * does, or (`--built`) from the tsc build, as a production deployment runs it (`npm run build`,
 * then `node dist/server/main.js`): no loader in the process, no source-mapped stack traces.
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
  const profile = o.cpuProfDir ? ['--cpu-prof', `--cpu-prof-dir=${o.cpuProfDir}`] : [];
  if (o.built) return [process.execPath, ...profile, 'dist/server/main.js'];
  return profile.length > 0 ? [process.execPath, ...profile, '--import', 'tsx', 'server/main.ts'] : undefined;
}

/** `npm run build` (tsc into dist/); throws with its output when it fails. */
export function buildServer(): void {
  const r = spawnSync('npm', ['run', '-s', 'build'], { cwd: repoRoot, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`npm run build failed:\n${r.stdout}\n${r.stderr}`);
}
