// `npm start`: production runs built JavaScript (`node dist/server/main.js`), not tsx. This brings
// dist/ up to date first, cheaply: each TypeScript file of server/ and generated/ whose output is
// missing or older than the source is compiled with TypeScript's own emitter (transpileModule, the
// project's compiler options: `.ts` imports rewritten to `.js`), without type checking — that is
// `npm run typecheck`'s and CI's job, as it was when `npm start` ran the sources through tsx.
// Nothing changed: nothing is compiled (a few milliseconds of stat calls). A full `npm run build`
// (tsc with type checking) writes the same files, so either can come before `node dist/server/main.js`.
// Plain JavaScript on purpose: it runs before anything is built. The npm script then `exec`s node,
// so signals reach the server itself. `npm run admin` and `npm run migrate` run it with their own
// files added (`scripts/admin scripts/admin.ts`, `scripts/migrate.ts`), and so does the tests'
// global setup (the admin CLI's) before they start servers.
import { mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const outDir = join(root, 'dist');
/** server/ and generated/, and folders or files named on the command line (the benches add scripts/bench, `npm run admin` the admin CLI). */
const SOURCES = ['server', 'generated', ...process.argv.slice(2)];

function* tsFiles(dir) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* tsFiles(path);
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts') && !entry.name.endsWith('.test.ts')) yield path;
  }
}

const mtime = (path) => {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return -1;
  }
};

const started = performance.now();
const configFile = join(root, 'tsconfig.build.json');
// A changed compiler configuration (or this script) rebuilds everything.
const configTime = Math.max(mtime(configFile), mtime(join(root, 'tsconfig.json')), mtime(fileURLToPath(import.meta.url)));
/** TypeScript, loaded only when a file needs compiling (loading it takes most of a second). */
let compiler;
async function typescript() {
  if (!compiler) {
    const ts = (
      await import('typescript').catch(() => {
        console.error('dist/ is missing or older than the sources, and TypeScript (a devDependency) is not installed: run `npm ci` (with devDependencies) or `npm run build` first.');
        process.exit(1);
      })
    ).default;
    const parsed = ts.parseJsonConfigFileContent(ts.readConfigFile(configFile, ts.sys.readFile).config, ts.sys, root);
    // ESNext modules: transpileModule cannot see package.json's "type": "module" that NodeNext reads.
    compiler = { ts, compilerOptions: { ...parsed.options, module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler, noEmit: false, declaration: false, sourceMap: true } };
  }
  return compiler;
}

let compiled = 0;
for (const base of SOURCES) {
  for (const src of base.endsWith('.ts') ? [join(root, base)] : tsFiles(join(root, base))) {
    const rel = relative(root, src);
    const out = join(outDir, rel.replace(/\.ts$/, '.js'));
    const outTime = mtime(out);
    if (outTime >= mtime(src) && outTime >= configTime) continue;
    const { ts, compilerOptions } = await typescript();
    const result = ts.transpileModule(readFileSync(src, 'utf8'), { compilerOptions, fileName: src, reportDiagnostics: true });
    const errors = (result.diagnostics ?? []).filter((d) => d.category === ts.DiagnosticCategory.Error);
    if (errors.length > 0) {
      console.error(`${rel}: ${errors.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('; ')}`);
      process.exit(1);
    }
    mkdirSync(dirname(out), { recursive: true });
    // Written to a temporary name of this process's first: a start interrupted mid-write leaves no
    // half file, and two commands compiling the same file at once (`npm start` beside `npm run
    // admin` after an update) each rename a whole one into place.
    const tmp = `${out}.${process.pid}.tmp`;
    writeFileSync(tmp, result.outputText.replace(/\/\/# sourceMappingURL=.*$/m, `//# sourceMappingURL=${relative(dirname(out), `${out}.map`)}`));
    if (result.sourceMapText) {
      writeFileSync(`${tmp}.map`, result.sourceMapText);
      renameSync(`${tmp}.map`, `${out}.map`);
    }
    renameSync(tmp, out);
    compiled++;
  }
}
if (compiled > 0) console.error(`compiled ${compiled} changed file(s) into dist/ in ${Math.round(performance.now() - started)} ms`);
