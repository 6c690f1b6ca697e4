/**
 * What the server does about the Node.js that runs it. Node 20 reached its end of life on
 * 2026-04-30, and under the proxy bench its V8 (Node 20.20.2) killed the server with a SIGSEGV now
 * and then: in code TurboFan had compiled, an inline allocation whose bump went past the end of its
 * page (docs/BENCHMARKS.md, "A crash found by the bench"), which Node 22 and 24 did not do in the
 * same soak. With TurboFan's allocation folding off (several allocations of a function merged into
 * one, checked once against the page's limit) the Node 20 server lived through the soak, so on
 * Node 20 the server turns it off for itself at start (`applyV8Workarounds`), and says so.
 */
import { setFlagsFromString } from 'node:v8';

const majorOf = (version: string) => Number(version.split('.')[0]);

/** The flags `applyV8Workarounds` set in this process. */
let applied: readonly string[] = [];

/** The V8 flags the server sets on itself on this Node.js version. */
export function v8WorkaroundFlags(version: string = process.versions.node): string[] {
  return majorOf(version) === 20 ? ['--no-turbo-allocation-folding'] : [];
}

/**
 * Sets `v8WorkaroundFlags` on the running process. Called first thing at start: TurboFan reads the
 * flag for each function it compiles, and it has compiled nothing of the server's yet.
 */
export function applyV8Workarounds(version: string = process.versions.node): string[] {
  const flags = v8WorkaroundFlags(version);
  for (const flag of flags) setFlagsFromString(flag);
  applied = flags;
  return flags;
}

/**
 * The one line an operator gets about the Node.js that runs the server (none on 22 and later),
 * naming the workaround flags this process runs with.
 */
export function nodeRuntimeWarning(version: string = process.versions.node, flags: readonly string[] = applied): string | undefined {
  const major = majorOf(version);
  if (!Number.isInteger(major) || major >= 22) return undefined;
  return (
    `Node.js ${version} is past its end of life, and on Node 20 the server has died of SIGSEGV inside V8 under load ` +
    `(docs/BENCHMARKS.md)${flags.length > 0 ? `; it runs with ${flags.join(' ')}, which kept it alive in the same soak` : ''}; run it on Node.js 22 or 24`
  );
}
