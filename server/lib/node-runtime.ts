/**
 * The one line an operator gets about the Node.js that runs the server. Node 20 reached its end of
 * life on 2026-04-30, and under the proxy bench its V8 (Node 20.20.2) killed the server with a
 * SIGSEGV now and then, in compiled code after an idle spell (docs/BENCHMARKS.md, "A crash found
 * by the bench"), which Node 22 and 24 did not do in the same soak. The server still runs on it.
 */
export function nodeRuntimeWarning(version: string = process.versions.node): string | undefined {
  const major = Number(version.split('.')[0]);
  if (!Number.isInteger(major) || major >= 22) return undefined;
  return (
    `Node.js ${version} is past its end of life, and on Node 20 the server has died of SIGSEGV inside V8 under load ` +
    `(docs/BENCHMARKS.md); run it on Node.js 22 or 24`
  );
}
