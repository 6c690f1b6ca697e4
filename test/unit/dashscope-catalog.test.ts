/**
 * The shipped `dashscope` catalog definitions (server/catalog/definitions/dashscope/) against the
 * fake DashScope, which follows Alibaba's references: every combination a definition admits — each
 * resolution with its shortest and longest duration, each ratio, the inputs it takes — is accepted
 * upstream as the adapter sends it, so that what the catalog lets a client create, DashScope runs.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCatalogDefinitions } from '../../server/catalog/catalog-definitions.ts';
import { DashScopeVideoProvider } from '../../server/providers/dashscope/dashscope-video.provider.ts';
import type { MediaInput, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startDashScopeFake, type DashScopeFake } from '../fakes/dashscope.ts';
import { startFakeServer, type FakeServer } from '../fakes/fake-http.ts';
import { mediaInputOf } from '../support/video-adapter-conformance.ts';

const definitions = loadCatalogDefinitions().filter((d) => d.provider === 'dashscope');
const never = new AbortController().signal;
let fake: DashScopeFake;
let files: FakeServer;
let frame: MediaInput;

beforeAll(async () => {
  fake = await startDashScopeFake({ accounts: { 'sk-catalog': {} } });
  const png = await sharp({ create: { width: 800, height: 450, channels: 3, background: { r: 40, g: 90, b: 160 } } }).png().toBuffer();
  files = await startFakeServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(png.length) });
    res.end(png);
  });
  frame = { ...mediaInputOf(png, 'image/png', 800, 450), url: async () => `${files.url}/frame.png` };
});
afterAll(async () => {
  await fake?.close();
  await files?.close();
});

describe('shipped dashscope definitions', () => {
  it('cover Wan 2.2, 2.5, 2.6 and 2.7 and HappyHorse 1.1 on both bodies', () => {
    expect(definitions.map((d) => d.model.id).sort()).toEqual(
      ['happyhorse-1.1-i2v', 'happyhorse-1.1-r2v', 'happyhorse-1.1-t2v', 'wan2.2-i2v-flash', 'wan2.2-i2v-plus', 'wan2.2-kf2v-flash', 'wan2.5-i2v-preview', 'wan2.5-t2v-preview', 'wan2.6-i2v-flash', 'wan2.7-i2v', 'wan2.7-r2v', 'wan2.7-t2v'].sort(),
    );
    for (const def of definitions) expect(def.upstreamModel).toBe(def.model.id);
  });

  it.each(definitions.map((d) => [d.id, d] as const))('%s: every combination it admits is accepted upstream', async (_id, def) => {
    const caps = def.model.video!;
    const provider = new DashScopeVideoProvider();
    const account: UpstreamAccount = { memberId: 'mem_catalog', provider: 'dashscope', baseUrl: fake.url, credentials: { api_key: 'sk-catalog' }, modelMap: {} };
    // The inputs the model's task needs (the catalog admits text-only requests the adapter refuses itself).
    const needsFrame = /-(i2v|kf2v)/.test(def.upstreamModel);
    const references = caps.reference_images.max_count;
    const inputs: Partial<VideoJob>[] = [];
    if (references > 0) inputs.push({ referenceImages: [frame] }, { referenceImages: Array(references).fill(frame) });
    else if (caps.frames === 'none') inputs.push({});
    else {
      inputs.push({ firstFrame: frame });
      if (caps.frames === 'first-and-optional-last') inputs.push({ firstFrame: frame, lastFrame: frame });
    }
    if (!needsFrame && references === 0 && caps.frames !== 'none') inputs.push({});
    const durations = [caps.durations[0]!, caps.durations.at(-1)!];
    let submitted = 0;
    for (const resolution of caps.resolutions) {
      for (const durationSeconds of durations) {
        for (const aspectRatio of caps.aspect_ratios) {
          for (const input of inputs) {
            const job: VideoJob = { taskId: `vid_${submitted}`, model: def.upstreamModel, prompt: 'a lighthouse at dusk', negativePrompt: 'rain', durationSeconds, aspectRatio, resolution, generateAudio: caps.audio.default_enabled, referenceImages: [], referenceVideos: [], referenceAudios: [], ...input };
            await expect(provider.submit(account, job, never), `${resolution} ${durationSeconds}s ${aspectRatio} ${Object.keys(input).join('+') || 'text'}`).resolves.toEqual(expect.any(String));
            submitted++;
          }
        }
      }
    }
    expect(submitted).toBeGreaterThan(caps.resolutions.length);
  });
});
