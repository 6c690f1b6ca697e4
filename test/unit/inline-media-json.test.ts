/**
 * readJsonWithMedia (upstream-http.ts): an aggregator's result or prediction read with its data
 * URLs decoded as they arrive, wherever they are, each replaced by a token the output mapping finds
 * in its place; bounded like a media answer, and an answer over its bounds (or with a data URL that
 * is not base64) fails as final (`failed`), not as a body to read again. A video's adapter, which
 * hands the runner a link to download later, refuses a video that came inline.
 */
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FalVideoProvider } from '../../server/providers/fal/fal-video.provider.ts';
import { mappedOutputs } from '../../server/providers/kit/mapping.ts';
import type { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { MAX_TEXT_BYTES, UpstreamResponse, readJsonWithMedia, type JsonWithMedia } from '../../server/providers/upstream-http.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { until } from '../support/tasks.ts';
import { videoJob } from '../support/video-job.ts';

/** A 200 answer whose body arrives in `size`-byte chunks. */
function answer(body: string | Buffer, size = 64 * 1024, status = 200): UpstreamResponse {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const chunks: Buffer[] = [];
  for (let i = 0; i < bytes.length; i += size) chunks.push(bytes.subarray(i, i + size));
  return new UpstreamResponse(status, {}, Readable.from(chunks));
}

const failure = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => e as ProviderError,
  );

/** The answer with each token put back as the data URL it stood for (what JSON.parse of the whole text would give). */
function restored(read: JsonWithMedia): unknown {
  return JSON.parse(JSON.stringify(read.body), (_k, v: unknown) => {
    const media = typeof v === 'string' ? read.media.get(v) : undefined;
    return media ? `data:${media.mimeType};base64,${media.bytes.toString('base64')}` : v;
  });
}

describe('readJsonWithMedia', () => {
  const png = randomBytes(3000);
  const jpeg = randomBytes(4001);
  const result = {
    images: [
      { url: `data:image/png;base64,${png.toString('base64')}`, content_type: 'image/png', width: 10 },
      { url: `data:image/jpeg;base64,${jpeg.toString('base64')}`, file_name: 'a "quoted" \\ name, data:' },
    ],
    video: { url: 'https://v3.fal.media/files/out.mp4' },
    prompt: 'data: not a data URL, "quoted" \\ and \u00e9',
    nested: [[`data:image/webp;base64,${Buffer.from('webp!').toString('base64')}`]],
    seed: 42,
    ok: true,
    none: null,
  };
  const text = JSON.stringify(result);

  it('decodes every data URL wherever it is, whatever the chunks, and keeps every other string as it was', async () => {
    for (const size of [1, 2, 3, 7, 64, 1000, 1 << 20]) {
      const read = await readJsonWithMedia(answer(text, size), 'image result');
      expect([...read.media.values()].map((m) => [m.mimeType, m.bytes.toString('hex')]), `chunks of ${size}`).toEqual([
        ['image/png', png.toString('hex')],
        ['image/jpeg', jpeg.toString('hex')],
        ['image/webp', Buffer.from('webp!').toString('hex')],
      ]);
      expect(restored(read), `chunks of ${size}`).toEqual(result);
    }
  });

  it('hands the output mapping a token in each data URL\'s place, which names its media', async () => {
    const read = await readJsonWithMedia(answer(text), 'image result');
    const outputs = await mappedOutputs({ endpoint: 'fal-ai/x', input: '{}', output: 'images.url' }, read.body);
    expect(outputs.map((o) => read.media.get(o)?.bytes.toString('hex'))).toEqual([png.toString('hex'), jpeg.toString('hex')]);
    expect(outputs.every((o) => o.length < 100)).toBe(true);
  });

  it('reads a data URL with escaped slashes, unpadded base64, and a type with parameters', async () => {
    const bytes = Buffer.from([0xff, 0xfe, 0xfd, 0xfc, 0xfb]);
    const b64 = bytes.toString('base64');
    expect(b64).toContain('/');
    const escaped = `{"a":"data:image\\/png;base64,${b64.replace(/\//g, '\\/')}","b":"data:image/png;name=x.png;base64,${b64.replace(/=+$/, '')}"}`;
    const read = await readJsonWithMedia(answer(escaped, 3), 'result');
    expect([...read.media.values()].map((m) => [m.mimeType, m.bytes.equals(bytes)])).toEqual([
      ['image/png', true],
      ['image/png', true],
    ]);
  });

  it('reads a data URL of 12 MB (a 2048x2048 image) without its text counting against the JSON around it', async () => {
    const big = randomBytes(12 * 1024 * 1024);
    const read = await readJsonWithMedia(answer(`{"images":[{"url":"data:image/png;base64,${big.toString('base64')}"}]}`), 'image result');
    expect([...read.media.values()][0]!.bytes.equals(big)).toBe(true);
  });

  it('answers undefined for what is not JSON, as readJson does', async () => {
    for (const body of ['<html><body>OK</body></html>', '{"a": "unterminated', '']) expect((await readJsonWithMedia(answer(body), 'result')).body).toBeUndefined();
  });

  it('fails as final an answer over its limits, of media or of the rest, and a data URL that is not base64', async () => {
    const limits = { maxBytes: 10_000, maxMediaBytes: 2_000, maxOtherBytes: 500 };
    const cases: [string, string, RegExp, typeof limits][] = [
      ['too much in all', `{"a":"data:image/png;base64,${'A'.repeat(20_000)}"}`, /more than 10000 bytes$/, { ...limits, maxMediaBytes: 100_000 }],
      ['too much media', `{"a":"data:image/png;base64,${'A'.repeat(4_000)}"}`, /more than 2000 bytes of media$/, limits],
      ['too much besides the media', `{"logs":"${'x'.repeat(600)}"}`, /more than 500 bytes besides its media$/, limits],
      ['not base64', '{"a":"data:image/png;base64,AAAA!!!!"}', /not valid base64$/, limits],
      ['data after the padding', '{"a":"data:image/png;base64,AA==AAAA"}', /not valid base64$/, limits],
      ['an escape that is no slash', '{"a":"data:image/png;base64,AA\\nAA"}', /not valid base64$/, limits],
    ];
    for (const [what, body, message, bounds] of cases) {
      const err = await failure(readJsonWithMedia(answer(body, 1000), 'image result', bounds));
      expect([err?.kind, err?.maybeAccepted, err?.message], what).toEqual(['failed', false, expect.stringMatching(message)]);
    }
  });

  it('keeps the JSON besides the media to what a short answer may hold, by default', async () => {
    expect((await readJsonWithMedia(answer(`{"logs":"${'x'.repeat(MAX_TEXT_BYTES - 20)}"}`), 'prediction')).body).toMatchObject({ logs: expect.any(String) });
    const err = await failure(readJsonWithMedia(answer(`{"logs":"${'x'.repeat(MAX_TEXT_BYTES)}"}`), 'prediction'));
    expect(err?.kind).toBe('failed');
  });

  it('fails a 2xx answer that breaks off as maybe accepted, as readJson does', async () => {
    const body = new Readable({
      read() {
        this.push('{"images":[{"url":"data:image/png;base64,AAAA');
        this.destroy(new Error('socket hang up'));
      },
    });
    const err = await failure(readJsonWithMedia(new UpstreamResponse(200, {}, body), 'image result'));
    expect([err?.kind, err?.maybeAccepted]).toEqual(['retryable', true]);
  });
});

describe('a fal video that came inside its result (sync_mode)', () => {
  let fal: FalFake;
  beforeAll(async () => {
    fal = await startFalFake({ apiKeys: ['fal-v:secret'], queueMs: 10, jobDurationMs: 30 });
  });
  afterAll(async () => fal?.close());

  it('fails the task as the mapping\'s fault: the runner keeps a link to download, and a data URL is none', async () => {
    const provider = new FalVideoProvider(20);
    const account: UpstreamAccount = { memberId: 'mem_v', provider: 'fal', baseUrl: fal.url, credentials: { api_key: 'fal-v:secret' }, modelMap: {} };
    const job = videoJob({ model: 'wan', mapping: { endpoint: 'fal-ai/wan-25-preview/text-to-video', input: '{"prompt": prompt, "sync_mode": true}', output: 'video.url' } });
    const jobId = await provider.submit(account, job, new AbortController().signal);
    const submitted = fal.jobs.get(jobId.slice(jobId.lastIndexOf('/') + 1))!;
    await until(() => Date.now() - submitted.createdAt > 50, 5000, 'the fal request to end');
    fal.faults.push('result', { status: 200, body: { video: { url: `data:video/mp4;base64,${randomBytes(5 * 1024 * 1024).toString('base64')}` }, seed: 1 } });
    const status = await provider.poll(account, jobId, job, new AbortController().signal);
    expect(status.state).toBe('failed');
    const error = (status as { error: ProviderError }).error;
    expect([error.kind, error.message]).toEqual(['misconfigured', expect.stringContaining('the mapping must not ask for sync_mode')]);
  });
});
