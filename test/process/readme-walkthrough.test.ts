/**
 * The README's operator walkthrough runs as written. Every ```sh block marked
 * `<!-- operator-walkthrough -->` is run, in order, by one bash with `set -euo pipefail` in the
 * repository (so `npm run admin -- …` is the real CLI), against a fresh server with the demo data
 * of a first `npm start`. The upstream accounts are fakes reached through the variables the README
 * names: OPENAI_BASE_URL serves the fake OpenAI Images and Videos upstreams under one base URL (as
 * OpenAI does), GEMINI_BASE_URL the fake Gemini API. Every command must exit 0, and the
 * generations the walkthrough runs must work: the images it prints links to, and the video.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { repoRoot, spawnServer, type ServerProcess } from '../support/server-process.ts';
import { until } from '../support/tasks.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const MARKER = '<!-- operator-walkthrough -->';
const BLOCK_END = '@@walkthrough-block-end@@';

/** The marked blocks, in README order. */
function walkthroughBlocks(readme: string): string[] {
  return [...readme.matchAll(/<!-- operator-walkthrough -->\n```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/** The JSON documents `| jq .` printed in a block's output (each starts at a line's first column). */
function jsonDocs(output: string): { data?: { url: string }[]; id?: string; status?: string; error?: unknown }[] {
  return output
    .split(/^(?=\{)/m)
    .filter((chunk) => chunk.startsWith('{'))
    .map((chunk) => JSON.parse(chunk));
}

let t: TestDatabase;
let server: ServerProcess;
let images: OpenAIImagesFake;
let videos: OpenAIVideosFake;
let gemini: GeminiFake;
let openaiFront: Server;
let openaiBaseUrl: string;
let dataDir: string;
const secretKey = randomBytes(32).toString('hex');

beforeAll(async () => {
  t = await createTestDatabase();
  images = await startOpenAIImagesFake({ apiKeys: ['sk-walkthrough'] });
  videos = await startOpenAIVideosFake({ apiKeys: ['sk-walkthrough'], jobDurationMs: 300, contentBytes: 4096 });
  gemini = await startGeminiFake({ apiKeys: ['gm-walkthrough-1', 'gm-walkthrough-2'] });
  // One base URL for both OpenAI APIs, as api.openai.com/v1 is.
  openaiFront = createServer((req, res) => {
    const target = req.url!.startsWith('/v1/videos') ? videos.url : images.url;
    const forward = request(`${target}${req.url}`, { method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode!, answer.headers);
      answer.pipe(res);
    });
    forward.on('error', () => res.destroy());
    req.pipe(forward);
  });
  await new Promise<void>((resolve) => openaiFront.listen(0, '127.0.0.1', resolve));
  openaiBaseUrl = `http://127.0.0.1:${(openaiFront.address() as AddressInfo).port}/v1`;
  dataDir = mkdtempSync(join(tmpdir(), 'mediagate-walkthrough-'));
  server = await spawnServer({
    env: {
      DATABASE_URL: t.url,
      MEDIAGATE_SECRET_KEY: secretKey,
      MEDIAGATE_DATA_DIR: dataDir,
      // What a first `npm start` makes: the demo account, the `default` group with local members.
      DEMO_DATA: '1',
      VIDEO_POLL_INTERVAL_MS: '200',
      TASK_POLL_MS: '200',
    },
  });
}, 120_000);

afterAll(async () => {
  await server?.kill('SIGTERM');
  await new Promise<void>((resolve) => (openaiFront ? openaiFront.close(() => resolve()) : resolve()));
  await Promise.all([images?.close(), videos?.close(), gemini?.close()]);
  await t?.destroy();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** Runs the blocks in one bash; each block's stdout ends with a marker line. */
function runWalkthrough(blocks: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const script = [
    'set -euo pipefail',
    `trap 'echo "walkthrough: this command exited $?: $BASH_COMMAND" >&2' ERR`,
    ...blocks.map((block) => `${block}\necho '${BLOCK_END}'`),
    // Not part of the README: the key the walkthrough created, for the test's own checks.
    'echo "@@key $KEY"',
  ].join('\n');
  return new Promise((resolve) => {
    const child = spawn('bash', ['-c', script], {
      cwd: repoRoot,
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '/tmp',
        npm_config_update_notifier: 'false',
        DATABASE_URL: t.url,
        MEDIAGATE_SECRET_KEY: secretKey,
        MG: server.url,
        OPENAI_API_KEY: 'sk-walkthrough',
        OPENAI_BASE_URL: openaiBaseUrl,
        GEMINI_API_KEY_1: 'gm-walkthrough-1',
        GEMINI_API_KEY_2: 'gm-walkthrough-2',
        GEMINI_BASE_URL: `${gemini.url}/v1beta`,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

async function imageSize(url: string): Promise<{ width?: number; height?: number; format?: string }> {
  const res = await fetch(url);
  expect(res.status).toBe(200);
  const { width, height, format } = await sharp(Buffer.from(await res.arrayBuffer())).metadata();
  return { width, height, format };
}

describe('the README operator walkthrough', () => {
  it('runs as written, command after command, and its generations work', async () => {
    const blocks = walkthroughBlocks(readFileSync(join(repoRoot, 'README.md'), 'utf8'));
    // Accounts and key; definitions; OpenAI models and member; OpenAI generations; Gemini models; Gemini members and image.
    expect(blocks.length).toBeGreaterThanOrEqual(6);
    expect(blocks.join('\n')).toContain('npm run admin -- models create --from');

    const run = await runWalkthrough(blocks);
    expect(run.stderr).not.toContain('walkthrough: this command exited');
    expect(run.code, `stdout:\n${run.stdout}\nstderr:\n${run.stderr}`).toBe(0);
    const outputs = run.stdout.split(`${BLOCK_END}\n`);
    expect(outputs).toHaveLength(blocks.length + 1);
    const key = /@@key (mg_\w+)/.exec(outputs.at(-1)!)![1]!;

    // What the CLI made, seen by the server's database.
    const models = await t.db.selectFrom('modelPrices').select(['modelId', 'resolution', 'quality', 'unitPrice']).where('modelId', 'in', ['image-pro', 'sora-2', 'nano-banana-pro', 'veo-3.1']).execute();
    expect(new Set(models.map((m) => m.modelId))).toEqual(new Set(['image-pro', 'sora-2', 'nano-banana-pro', 'veo-3.1']));
    expect(models).toContainEqual({ modelId: 'image-pro', resolution: '1K', quality: 'low', unitPrice: 20_000 });
    expect(models).toContainEqual({ modelId: 'sora-2', resolution: '720p', quality: '', unitPrice: 150_000 });
    const members = await t.db.selectFrom('groupMembers').select(['name', 'provider', 'models', 'priority']).where('provider', '!=', 'local').orderBy('name').execute();
    expect(members).toEqual([
      { name: 'google-1', provider: 'gemini', models: ['nano-banana-pro', 'veo-3.1'], priority: 10 },
      { name: 'google-2', provider: 'gemini', models: ['nano-banana-pro', 'veo-3.1'], priority: 0 },
      { name: 'openai-main', provider: 'openai', models: ['image-pro', 'sora-2'], priority: 10 },
    ]);

    // The OpenAI generations: an image of gpt-image-1.5 sold as image-pro, and a Sora video.
    const openaiBlock = outputs.findIndex((out, i) => blocks[i]!.includes('"model":"image-pro"'));
    const [image, video] = jsonDocs(outputs[openaiBlock]!);
    expect(image!.error).toBeUndefined();
    expect(await imageSize(image!.data![0]!.url)).toEqual({ width: 1248, height: 1248, format: 'png' });
    expect(images.requests.find((r) => r.path === '/v1/images/generations')?.json).toMatchObject({ model: 'gpt-image-1.5', quality: 'low' });
    expect(video).toMatchObject({ object: 'video.task', status: 'queued', model: 'sora-2' });
    const done = await until(async () => {
      const res = await fetch(`${server.url}/v1/videos/${video!.id}`, { headers: { authorization: `Bearer ${key}` } });
      const body = (await res.json()) as { status: string; video_url?: string };
      return body.status === 'completed' || body.status === 'failed' ? body : undefined;
    }, 30_000, 'the sora-2 task to finish');
    expect(done.status).toBe('completed');
    expect((await fetch(done.video_url!)).status).toBe(200);
    expect([...videos.jobs.values()].map((j) => j.model)).toEqual(['sora-2']);

    // The walkthrough's final generation: Nano Banana Pro through the first Google account.
    const [final] = jsonDocs(outputs[blocks.length - 1]!);
    expect(final!.error).toBeUndefined();
    expect(await imageSize(final!.data![0]!.url)).toEqual({ width: 1376, height: 768, format: 'png' });
    expect(gemini.calls.map((c) => [c.model, c.apiKey])).toEqual([['gemini-3-pro-image-preview', 'gm-walkthrough-1']]);
  }, 300_000);
});
