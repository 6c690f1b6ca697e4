/**
 * The client's declarations as a project without Node's types sees them: a browser or edge app
 * (`lib: DOM`, `types: []`) that checks its libraries' declarations (`skipLibCheck: false`). The
 * package's own tsconfig builds them into a temp directory (never the checkout's dist/), whose
 * node_modules links to the repository's for the dependencies' declarations.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../support/server-process.ts';

const tsc = join(repoRoot, 'node_modules/typescript/bin/tsc');
let work: string;

function run(args: string[], cwd: string): { status: number | null; output: string } {
  const r = spawnSync(process.execPath, [tsc, ...args], { cwd, encoding: 'utf8', timeout: 120_000 });
  return { status: r.status, output: r.stdout + r.stderr };
}

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'mediagate-client-declarations-'));
  symlinkSync(join(repoRoot, 'node_modules'), join(work, 'node_modules'), 'junction');
  const build = run(['-p', join(repoRoot, 'clients/typescript/tsconfig.json'), '--emitDeclarationOnly', '--outDir', join(work, 'dist')], repoRoot);
  expect(build.output).toBe('');
  expect(build.status).toBe(0);
}, 120_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the client declarations', () => {
  it('type-check in a project without Node types, webhook verification included', () => {
    writeFileSync(join(work, 'package.json'), JSON.stringify({ name: 'browser-app', private: true, type: 'module' }));
    writeFileSync(
      join(work, 'consumer.ts'),
      `import { createMediagateClient, MediagateNetworkError, verifyWebhook, WebhookVerificationError } from './dist/index.js';

const mg = createMediagateClient({ baseUrl: 'https://mediagate.example', apiKey: 'mg_example' });

export async function firstImage(): Promise<string | undefined> {
  try {
    for await (const event of mg.streamImage({ prompt: 'a lighthouse', model: 'local-image-1' })) {
      if (event.type === 'image_generation.completed') return event.b64_json ?? event.url ?? undefined;
    }
  } catch (err) {
    if (err instanceof MediagateNetworkError) return undefined;
    throw err;
  }
  return undefined;
}

export function onWebhook(raw: Uint8Array, headers: Headers, secret: string): string | null {
  try {
    return verifyWebhook(raw, headers, secret).id;
  } catch (err) {
    if (err instanceof WebhookVerificationError) return null;
    throw err;
  }
}
`,
    );
    writeFileSync(
      join(work, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          lib: ['ES2023', 'DOM'],
          types: [],
          strict: true,
          noEmit: true,
          skipLibCheck: false,
        },
        files: ['consumer.ts'],
      }),
    );

    const check = run(['-p', 'tsconfig.json'], work);

    expect(check.output).toBe('');
    expect(check.status).toBe(0);
  }, 120_000);
});
