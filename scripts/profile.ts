// Usage: npm run profile -- [proxy|inflight] [--out <dir>] [-- <bench options>]
//   The profiling recipe: runs a bench scenario with the server under V8's sampling profiler
//   (`node --cpu-prof`, written when the server exits), then prints where its CPU went: the
//   functions with the most self time, and the time under each of the server's own modules and
//   each package. Open the .cpuprofile in Chrome DevTools (Performance > Load profile) or
//   speedscope for the flame graph.
//
//   npm run profile -- proxy                           # 4 s per side, the built server
//   npm run profile -- proxy -- --duration 10 --keys 16
import { spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

const root = fileURLToPath(new URL('..', import.meta.url));

/** Self time per function and per module/package, in ms, from a V8 .cpuprofile. */
export function summarizeProfile(profile: CpuProfile): { totalMs: number; functions: [string, number][]; modules: [string, number][] } {
  const self = new Map<number, number>();
  for (let i = 0; i < profile.samples.length; i++) self.set(profile.samples[i]!, (self.get(profile.samples[i]!) ?? 0) + (profile.timeDeltas[i] ?? 0) / 1000);
  const byFunction = new Map<string, number>();
  const byModule = new Map<string, number>();
  for (const node of profile.nodes) {
    const ms = self.get(node.id) ?? 0;
    if (ms === 0) continue;
    const { functionName, url, lineNumber } = node.callFrame;
    const file = url.startsWith('file://') ? relative(root, fileURLToPath(url)) : url;
    const name = `${functionName || '(anonymous)'} ${file ? `${file}:${lineNumber + 1}` : ''}`.trim();
    byFunction.set(name, (byFunction.get(name) ?? 0) + ms);
    byModule.set(moduleOf(file, functionName), (byModule.get(moduleOf(file, functionName)) ?? 0) + ms);
  }
  const sorted = (m: Map<string, number>) => [...m].sort((a, b) => b[1] - a[1]);
  return { totalMs: (profile.endTime - profile.startTime) / 1000, functions: sorted(byFunction), modules: sorted(byModule) };
}

/** dist/server/http/x.js → server/http; node_modules/@a/b/… → @a/b; node:… and V8 internals as they are. */
function moduleOf(file: string, functionName: string): string {
  if (!file) return functionName.startsWith('(') ? functionName : '(native)';
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(file);
  if (pkg) return pkg[1]!;
  const own = /^(?:dist\/)?((?:server|generated|scripts)(?:\/[^/]+)?)\//.exec(file);
  if (own) return own[1]!;
  return file.startsWith('node:') ? file.split('/')[0]! : file;
}

function main(): number {
  const args = process.argv.slice(2);
  const dash = args.indexOf('--');
  const own = dash >= 0 ? args.slice(0, dash) : args;
  const benchArgs = dash >= 0 ? args.slice(dash + 1) : [];
  const scenario = own.find((a) => !a.startsWith('--')) ?? 'proxy';
  if (scenario !== 'proxy' && scenario !== 'inflight') {
    console.error(`profile: scenario must be proxy or inflight, got '${scenario}'`);
    return 2;
  }
  const outAt = own.indexOf('--out');
  const out = outAt >= 0 ? own[outAt + 1]! : join(tmpdir(), `mediagate-profile-${Date.now()}`);
  mkdirSync(out, { recursive: true });
  const defaults = scenario === 'proxy' && !benchArgs.includes('--duration') ? ['--duration', '4'] : [];
  const r = spawnSync(process.execPath, ['--import', 'tsx', 'scripts/bench.ts', scenario, ...defaults, ...benchArgs, '--cpu-prof', out], { cwd: root, stdio: 'inherit' });
  const profiles = readdirSync(out)
    .filter((f) => f.endsWith('.cpuprofile'))
    .map((f) => join(out, f))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  if (profiles.length === 0) {
    console.error(`profile: the bench wrote no .cpuprofile into ${out} (exit ${r.status})`);
    return 1;
  }
  const summary = summarizeProfile(JSON.parse(readFileSync(profiles[0]!, 'utf8')) as CpuProfile);
  const sampled = summary.functions.reduce((s, [, ms]) => s + ms, 0);
  const idle = summary.functions.filter(([name]) => name.startsWith('(idle)')).reduce((s, [, ms]) => s + ms, 0);
  console.log(`\n== server CPU profile ${profiles[0]} (${(summary.totalMs / 1000).toFixed(1)} s, ${((sampled - idle) / 1000).toFixed(1)} s on the main thread)`);
  console.log('  self time by module or package (ms, without idle):');
  for (const [name, ms] of summary.modules.filter(([n]) => n !== '(idle)').slice(0, 25)) console.log(`    ${ms.toFixed(0).padStart(8)}  ${name}`);
  console.log('  functions with the most self time (ms):');
  for (const [name, ms] of summary.functions.filter(([n]) => !n.startsWith('(idle)')).slice(0, 30)) console.log(`    ${ms.toFixed(0).padStart(8)}  ${name}`);
  return r.status ?? 1;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) process.exitCode = main();
