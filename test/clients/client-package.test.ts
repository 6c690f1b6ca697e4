/**
 * The TypeScript client as its users get it: `npm pack` of clients/typescript (its `prepack` builds
 * dist/ with tsc), the tarball installed with npm into a scratch project outside the repository,
 * then plain `node` (no tsx) runs an ESM script that creates a local video on a real server and
 * waits for it, and tsc type-checks a consumer file against the installed declarations.
 *
 * The package is packed from a copy in a temp directory, so that this test never deletes or rewrites
 * the checkout's clients/typescript/dist (which other work may be reading); the copy's
 * node_modules links to the repository's for the build's tsc and the dependencies' types. A copy
 * also proves the package builds from its own directory alone.
 */
import { execFile, spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative, resolve, sep } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { repoRoot } from '../support/server-process.ts';
import { holdOf } from '../support/tasks.ts';

const packageSource = join(repoRoot, 'clients/typescript');
const PACKAGE = '@mediagate/client';

let work: string;
let app: string;
let installed: string;

/** Runs npm in `cwd` with the caller's npm configuration (registry, cache, proxy) and throws on failure. */
function npm(args: string[], cwd: string): string {
  const r = spawnSync('npm', args, { cwd, env: { ...process.env, npm_config_update_notifier: 'false' }, encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`npm ${args.join(' ')} failed (${r.status ?? r.signal}):\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(dir, join(entry.parentPath, entry.name)))
    .sort();
}

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'mediagate-client-package-'));
  const copy = join(work, 'client');
  cpSync(packageSource, copy, {
    recursive: true,
    // Whatever a developer built or packed in the checkout must not reach the tarball.
    filter: (path) => !['dist', 'node_modules'].includes(basename(path)) && !path.endsWith('.tgz'),
  });
  symlinkSync(join(repoRoot, 'node_modules'), join(copy, 'node_modules'), 'junction');
  const packs = join(work, 'packs');
  mkdirSync(packs);
  npm(['pack', '--pack-destination', packs], copy);
  const tarballs = readdirSync(packs);
  expect(tarballs).toEqual([expect.stringMatching(/^mediagate-client-\d+\.\d+\.\d+\.tgz$/)]);

  app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true, type: 'module' }));
  // --prefer-offline: after `npm ci` npm's cache holds the dependencies' tarballs; only metadata it
  // has never seen is fetched from the registry.
  npm(['install', '--no-audit', '--no-fund', '--prefer-offline', join(packs, tarballs[0]!)], app);
  installed = join(app, 'node_modules', PACKAGE);
}, 180_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the packed client package', () => {
  it('holds built JavaScript and declarations with the API types, no sources and no repository paths', () => {
    const files = filesUnder(installed);
    expect(files).toEqual(expect.arrayContaining(['README.md', 'package.json', 'dist/index.js', 'dist/index.d.ts', 'dist/generated/api.d.ts']));
    expect(files.filter((f) => !['README.md', 'package.json'].includes(f) && !/^dist\/.+\.(js|d\.ts)$/.test(f))).toEqual([]);

    const manifest = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')) as Record<string, any>;
    expect(manifest).toMatchObject({ name: PACKAGE, type: 'module', exports: { '.': { types: './dist/index.d.ts', default: './dist/index.js' } } });
    expect(Object.keys(manifest.dependencies).sort()).toEqual(['eventsource-parser', 'openapi-fetch', 'standardwebhooks']);

    // Every import of the JavaScript and the declarations stays inside the package or names one of
    // its dependencies: nothing reaches back into the repository (generated/, server/, tsx).
    const specifiers = new Set<string>();
    for (const file of files.filter((f) => f.startsWith('dist/'))) {
      // Comments left out: the contract's descriptions and examples hold words like `"from": "…"`.
      const text = readFileSync(join(installed, file), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
      for (const [, specifier] of text.matchAll(/(?:\bfrom|\bimport)\s*\(?\s*['"]([^'"]+)['"]/g)) {
        if (!specifier!.startsWith('.')) specifiers.add(specifier!);
        else expect(resolve(dirname(join(installed, file)), specifier!).startsWith(join(installed, 'dist') + sep), `${file}: ${specifier}`).toBe(true);
      }
    }
    expect([...specifiers].sort()).toEqual(['eventsource-parser', 'openapi-fetch', 'standardwebhooks']);
    // npm installed the dependencies with it, and nothing of the repository's tooling.
    const scratchModules = readdirSync(join(app, 'node_modules'));
    expect(scratchModules).toEqual(expect.arrayContaining(['@mediagate', 'eventsource-parser', 'openapi-fetch', 'standardwebhooks']));
    expect(scratchModules.filter((name) => ['tsx', 'typescript', '@types'].includes(name))).toEqual([]);
  });

  describe('against a real server', () => {
    let server: TestServer;
    beforeAll(async () => {
      server = await startTestServer({ workers: true });
      await seedCatalog(server.db);
    });
    afterAll(async () => server?.close());

    it('creates a video, waits for it and downloads the MP4 from plain node', async () => {
      const customer = await createCustomer(server.db, { balance: 10 });
      writeFileSync(
        join(app, 'video.mjs'),
        `import { createMediagateClient, MediagateError } from '${PACKAGE}';
const [baseUrl, apiKey] = process.argv.slice(2);
const mg = createMediagateClient({ baseUrl, apiKey });

const created = await mg.createVideo({ prompt: 'a paper boat on a rainy street', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' });
if (created.error) throw created.error;
const task = await mg.waitForVideo(created.data.id, { intervalMs: 100, timeoutMs: 60_000 });
const video = new Uint8Array(await (await fetch(task.video_url)).arrayBuffer());

const missing = await mg.createVideo({ prompt: 'x', model: 'no-such-model', seconds: 2, aspectRatio: '16:9', resolution: '360p' });
const e = missing.error;
console.log(JSON.stringify({
  created: { id: created.data.id, status: created.data.status },
  finished: { id: task.id, status: task.status, error: task.error ?? null },
  mp4Box: new TextDecoder().decode(video.subarray(4, 8)),
  missing: { isMediagateError: e instanceof MediagateError, status: e?.status, code: e?.code, param: e?.param, hasRequestId: typeof e?.requestId === 'string' },
}));
`,
      );
      // Plain node, from the scratch project: nothing of the repository's loaders or paths. Not
      // spawnSync: the server runs in this process and must keep answering meanwhile.
      const run = await promisify(execFile)(process.execPath, ['video.mjs', server.baseUrl, customer.key], { cwd: app, encoding: 'utf8', timeout: 90_000 });
      expect(run.stderr).toBe('');
      const out = JSON.parse(run.stdout) as Record<string, any>;

      expect(out.created).toEqual({ id: expect.stringMatching(/^vid_/), status: 'queued' });
      expect(out.finished).toEqual({ id: out.created.id, status: 'completed', error: null });
      expect(out.mp4Box).toBe('ftyp');
      expect(out.missing).toEqual({ isMediagateError: true, status: 404, code: 'model_not_found', param: 'model', hasRequestId: true });
      // The server ran it for this customer: the quote was captured once.
      expect(await holdOf(server.db, out.created.id)).toMatchObject({ status: 'captured', captured: 100_000 });
    }, 120_000);
  });

  it("type-checks the README's examples against the installed declarations", () => {
    // Each ```ts block of the package's README that needs nothing but the package, in order: the
    // first (which makes `mg`) at the top level, each of the others in a block of its own. Their
    // imports, and those a continuing example names in a comment (`// (import { … } from '…';)`),
    // become one import line.
    const readme = readFileSync(join(packageSource, 'README.md'), 'utf8');
    const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!).filter((b) => ![...b.matchAll(/from '([^']+)'/g)].some((m) => m[1] !== PACKAGE));
    expect(blocks.length).toBeGreaterThanOrEqual(4);
    const names = new Set<string>();
    for (const b of blocks) for (const m of b.matchAll(/import \{([^}]+)\} from '@mediagate\/client'/g)) for (const n of m[1]!.split(',')) names.add(n.trim());
    const bodies = blocks.map((b) => b.split('\n').filter((line) => !line.startsWith('import ')).join('\n'));
    writeFileSync(
      join(app, 'readme.ts'),
      [
        `import { ${[...names].filter(Boolean).join(', ')} } from '${PACKAGE}';`,
        // What the examples leave to the reader's own code.
        'declare function showPreview(b64: string): void;',
        'declare function save(image: string | undefined): void;',
        'declare function retryLater(): void;',
        bodies[0], ...bodies.slice(1).map((b) => `{\n${b}\n}`), 'export {};'].join('\n'),
    );
    writeFileSync(
      join(app, 'tsconfig.readme.json'),
      JSON.stringify({
        compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, types: ['node'], typeRoots: [join(repoRoot, 'node_modules/@types')] },
        files: ['readme.ts'],
      }),
    );
    const tsc = spawnSync(process.execPath, [join(repoRoot, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.readme.json'], { cwd: app, encoding: 'utf8', timeout: 120_000 });
    expect(tsc.stdout + tsc.stderr).toBe('');
    expect(tsc.status).toBe(0);
  }, 120_000);

  it('type-checks a consumer against the installed declarations', () => {
    writeFileSync(
      join(app, 'consumer.ts'),
      `import { createMediagateClient, verifyWebhook, type FinishedVideoTask, type VideoCreateRequest } from '${PACKAGE}';

const mg = createMediagateClient({ baseUrl: 'http://localhost:8080', apiKey: 'mg_example' });
const body: VideoCreateRequest = { prompt: 'a lighthouse', model: 'local-video-1', seconds: 2, resolution: '360p' };

export async function run(): Promise<string | null | undefined> {
  const created = await mg.createVideo(body);
  if (created.error) return created.error.code;
  const task: FinishedVideoTask = await mg.waitForVideo(created.data.id);
  const models = await mg.api.GET('/v1/models');
  const firstId: string | undefined = models.data?.data[0]?.id;
  // @ts-expect-error the contract's model id is a string: the generated types reached the consumer
  const wrong: VideoCreateRequest = { ...body, model: 42 };
  void wrong;
  // @ts-expect-error openapi-fetch knows the contract's paths
  await mg.api.GET('/v1/no-such-path');
  return task.video_url ?? firstId;
}

export function onWebhook(raw: Uint8Array, headers: Headers): string {
  return verifyWebhook(raw, headers, 'whsec_c2VjcmV0').id;
}
`,
    );
    writeFileSync(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          // Check the package's own declarations too, not only their use.
          skipLibCheck: false,
          // The scratch project installs only the package; the repository's @types/node stands in
          // for the one a Node project has.
          types: ['node'],
          typeRoots: [join(repoRoot, 'node_modules/@types')],
        },
        files: ['consumer.ts'],
      }),
    );
    const tsc = spawnSync(process.execPath, [join(repoRoot, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], { cwd: app, encoding: 'utf8', timeout: 120_000 });
    expect(tsc.stdout + tsc.stderr).toBe('');
    expect(tsc.status).toBe(0);
  }, 120_000);
});
