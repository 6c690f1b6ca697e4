/**
 * The built console the browser tests load (clients/console/dist, gitignored, built by
 * `npm run build:console` and by `npm install`). A checkout without one gets one here; a build older
 * than the console's sources is refused, since the tests would pass or fail on code that is gone.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../support/server-process.ts';

const CONSOLE = join(repoRoot, 'clients/console');

function newestSource(path: string): number {
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  return Math.max(0, ...readdirSync(path).map((name) => newestSource(join(path, name))));
}

export function ensureConsoleBuild(): void {
  const built = join(CONSOLE, 'dist/index.html');
  if (!existsSync(built)) {
    const build = spawnSync('npm', ['run', 'build:console', '--silent'], { cwd: repoRoot, encoding: 'utf8' });
    if (build.status !== 0) throw new Error(`npm run build:console failed:\n${build.stdout}\n${build.stderr}`);
    return;
  }
  const sources = Math.max(...['src', 'index.html', 'vite.config.ts'].map((p) => newestSource(join(CONSOLE, p))));
  if (sources > statSync(built).mtimeMs) throw new Error('clients/console/dist is older than the console sources: run `npm run build:console`.');
}
