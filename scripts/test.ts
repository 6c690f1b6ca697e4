/**
 * `npm test`: every check CI runs, in order, each reported; exits 1 when any fails.
 *   drift      generated/ matches what `npm run generate` would write
 *   lint       redocly lint: zero errors and zero warnings
 *   typecheck  tsc --noEmit over server, clients, scripts and tests; as `npm run build` compiles;
 *              over the console (clients/console): the three at once
 *   vitest     unit, db, http, process, clients and console tests
 *   contract   the http test files of test/contract-lane.json again, every request through
 *              `prism proxy --errors`; fails unless every operation of the contract (and each
 *              operation and status the list names) went through Prism (scripts/contract-lane.ts)
 *
 * Usage: tsx scripts/test.ts [step ...]   (default: all steps)
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { checkLane, readManifest } from './contract-lane.ts';

const root = resolve(import.meta.dirname, '..');
const bin = (name: string) => join(root, 'node_modules/.bin', name);
const env = { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' };

type Step = { name: string; run: () => boolean | Promise<boolean> };

function exec(cmd: string, args: string[], extraEnv: Record<string, string> = {}): boolean {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env: { ...env, ...extraEnv } });
  return r.status === 0;
}

/** Runs the commands at once; each one's output is printed whole, in order, once all have ended. */
async function execAll(commands: [string, string[]][]): Promise<boolean> {
  const results = await Promise.all(
    commands.map(
      ([cmd, args]) =>
        new Promise<{ ok: boolean; out: Buffer[] }>((done) => {
          const child = spawn(cmd, args, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] });
          const out: Buffer[] = [];
          child.stdout.on('data', (d: Buffer) => out.push(d));
          child.stderr.on('data', (d: Buffer) => out.push(d));
          child.on('error', (err) => done({ ok: false, out: [...out, Buffer.from(`${cmd}: ${err.message}\n`)] }));
          child.on('close', (code) => done({ ok: code === 0, out }));
        }),
    ),
  );
  for (const { out } of results) process.stdout.write(Buffer.concat(out));
  return results.every((r) => r.ok);
}

interface VitestJson {
  numPassedTests: number;
  numFailedTests: number;
  numPendingTests: number;
  numTotalTests: number;
  success: boolean;
}

const totals = { passed: 0, failed: 0, skipped: 0 };

/** Runs vitest with a JSON report next to the normal output, and adds its counts to the totals. */
function vitest(args: string[], extraEnv: Record<string, string> = {}): boolean {
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-vitest-'));
  try {
    const report = join(dir, 'report.json');
    const ok = exec(bin('vitest'), ['run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...args], extraEnv);
    try {
      const json = JSON.parse(readFileSync(report, 'utf8')) as VitestJson;
      totals.passed += json.numPassedTests;
      totals.failed += json.numFailedTests;
      totals.skipped += json.numPendingTests;
      // A run that executed nothing is a failure: it proves nothing.
      return ok && json.success && json.numTotalTests > 0;
    } catch {
      totals.failed += 1;
      return false;
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The contract lane over its files, recording what goes through Prism, then the check that it covered the contract. */
function contract(): boolean {
  const manifest = readManifest();
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-lane-'));
  try {
    const ok = vitest(manifest.files, { MEDIAGATE_CONTRACT_LANE: '1', MEDIAGATE_CONTRACT_RECORD: dir });
    return checkLane(dir, manifest) && ok;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function lint(): boolean {
  const r = spawnSync(bin('redocly'), ['lint', '--format=json'], { cwd: root, env, encoding: 'utf8', maxBuffer: 64 << 20 });
  let report: { totals?: { errors: number; warnings: number } } = {};
  try {
    report = JSON.parse(r.stdout);
  } catch {
    console.error(r.stdout, r.stderr);
    return false;
  }
  const t = report.totals ?? { errors: 1, warnings: 0 };
  if (t.errors > 0 || t.warnings > 0) {
    exec(bin('redocly'), ['lint', '--format=stylish']);
    console.error(`lint: ${t.errors} errors, ${t.warnings} warnings (both must be 0)`);
    return false;
  }
  console.log('lint: 0 errors, 0 warnings');
  return true;
}

const steps: Step[] = [
  { name: 'drift', run: () => exec(process.execPath, ['--import', 'tsx', 'scripts/generate.ts', '--check']) },
  { name: 'lint', run: lint },
  // The console (clients/console) has its own tsconfig (DOM, JSX); both check against the generated contract types.
  // The build (tsconfig.build.json: what `npm run build` compiles, scripts and the test helpers they import) too: a file may pass one and fail the other.
  // The three at once: 43–48 s on a 2-core machine, 58 s one after the other.
  { name: 'typecheck', run: () => execAll(['tsconfig.json', 'tsconfig.build.json', 'clients/console/tsconfig.json'].map((p) => [bin('tsc'), ['-p', p, '--noEmit']])) },
  { name: 'vitest', run: () => vitest([]) },
  { name: 'contract', run: contract },
];

const wanted = process.argv.slice(2);
const unknown = wanted.filter((w) => !steps.some((s) => s.name === w));
if (unknown.length > 0) {
  console.error(`usage: tsx scripts/test.ts [${steps.map((s) => s.name).join('|')} ...]; unknown: ${unknown.join(', ')}`);
  process.exit(2);
}

const failedSteps: string[] = [];
for (const step of steps) {
  if (wanted.length > 0 && !wanted.includes(step.name)) continue;
  console.log(`\n=== ${step.name} ===`);
  const started = Date.now();
  const ok = await step.run();
  console.log(`=== ${step.name}: ${ok ? 'ok' : 'FAILED'} (${((Date.now() - started) / 1000).toFixed(1)} s) ===`);
  if (!ok) failedSteps.push(step.name);
}

console.log(failedSteps.length ? `\nfailed steps: ${failedSteps.join(', ')}` : '\nall steps passed');
console.log(`tests: ${totals.passed} passed, ${totals.failed} failed` + (totals.skipped ? `, ${totals.skipped} skipped` : ''));
process.exit(failedSteps.length ? 1 : 0);
