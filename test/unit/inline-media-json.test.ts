/**
 * readJsonWithMedia (upstream-http.ts): an aggregator's result or prediction read with its data
 * URLs decoded as they arrive, wherever they are, each replaced by a token the output mapping finds
 * in its place; a string that only starts like one (a prompt echoed back) stays the string it was;
 * bounded like a media answer, and an answer over its bounds fails as final (`failed`), not as a
 * body to read again. A Replicate create answer that cannot be read whole still gives its
 * prediction's id when that much came. A video's adapter, which hands the runner a link to
 * download later, refuses a video that came inline.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FalVideoProvider } from '../../server/providers/fal/fal-video.provider.ts';
import { mappedOutputs } from '../../server/providers/kit/mapping.ts';
import type { ProviderError } from '../../server/providers/provider-error.ts';
import { createPrediction, outcomeOf } from '../../server/providers/replicate/replicate-api.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { MAX_TEXT_BYTES, UpstreamResponse, readJsonWithMedia, topLevelString, type JsonWithMedia } from '../../server/providers/upstream-http.ts';
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

  it('fails as final an answer over its limits, of media or of the rest, and a data URL too long to keep as text that is not base64', async () => {
    const limits = { maxBytes: 10_000, maxMediaBytes: 2_000, maxOtherBytes: 500 };
    const cases: [string, string, RegExp, typeof limits][] = [
      ['too much in all', `{"a":"data:image/png;base64,${'A'.repeat(20_000)}"}`, /more than 10000 bytes$/, { ...limits, maxMediaBytes: 100_000 }],
      ['too much media', `{"a":"data:image/png;base64,${'A'.repeat(4_000)}"}`, /more than 2000 bytes of media$/, limits],
      ['too much besides the media', `{"logs":"${'x'.repeat(600)}"}`, /more than 500 bytes besides its media$/, limits],
      ['not base64, past what the rest may hold', `{"a":"data:image/png;base64,${'A'.repeat(1_000)}!"}`, /not valid base64 \(too long to keep as text\)$/, { ...limits, maxMediaBytes: 100_000 }],
    ];
    for (const [what, body, message, bounds] of cases) {
      const err = await failure(readJsonWithMedia(answer(body, 1000), 'image result', bounds));
      expect([err?.kind, err?.maybeAccepted, err?.message], what).toEqual(['failed', false, expect.stringMatching(message)]);
    }
  });

  it('keeps a string that only starts like a data URL as the string it was, wherever the chunks split it, and still decodes the data URLs', async () => {
    const bytes = Buffer.from([0xff, 0xfe, 0xfd, 0xfc, 0xfb]);
    const b64 = bytes.toString('base64');
    expect(b64).toContain('/');
    const echoes = [
      'data:text/plain;base64,a fox',
      'data:image/png;base64,A',
      'data:image/png;base64,AAAA AAAA',
      'data:image/png;base64,AAAA\nAAAA',
      'data:image/png;base64,AAAA"AAAA',
      'data:image/png;base64,AA==AAAA',
      'data:image/png;base64,AAA=A',
      'data:image/png;base64,AA=',
      'data:image/png;base64,AAAA\u00e9',
    ];
    // As an upstream may write them: escaped slashes, then no base64; an escape base64 has no use for.
    const raw = ['"data:image\\/png;base64,AB\\/A\\/!"', '"data:image/png;base64,AAAA\\u0041AAA"', '"data:image/png;base64,AAAA\\\\"'];
    const text = `{"prompt":${JSON.stringify(echoes)},"raw":[${raw.join(',')}],"images":[{"url":"data:image/png;base64,${b64}"},{"url":"data:image\\/png;base64,${b64.replace(/\//g, '\\/')}"}],"seed":1}`;
    const parsed = JSON.parse(text) as { prompt: string[]; raw: string[] };
    expect(parsed.raw).toEqual(['data:image/png;base64,AB/A/!', 'data:image/png;base64,AAAAAAAA', 'data:image/png;base64,AAAA\\']);
    const whole = Buffer.from(text);
    const splits = [...Array(whole.length + 1).keys()].map((k) => [whole.subarray(0, k), whole.subarray(k)]);
    for (const chunks of [...splits, ...[1, 2, 3].map((size) => [...Array(Math.ceil(whole.length / size)).keys()].map((i) => whole.subarray(i * size, (i + 1) * size)))]) {
      const read = await readJsonWithMedia(new UpstreamResponse(200, {}, Readable.from(chunks)), 'image result');
      const where = `chunks of ${chunks.map((c) => c.length).join(',')}`;
      expect(read.body, where).toMatchObject({ prompt: parsed.prompt, raw: parsed.raw, seed: 1 });
      expect([...read.media.values()].map((m) => [m.mimeType, m.bytes.equals(bytes)]), where).toEqual([
        ['image/png', true],
        ['image/png', true],
      ]);
      expect(restored(read), where).toEqual(parsed);
    }
  });

  it('keeps as it was a long string that starts like a data URL and turns out not to be one at its end', async () => {
    const prompt = `data:image/png;base64,${'QUJD'.repeat(100_000)}!`;
    for (const size of [1000, 64 * 1024]) {
      const read = await readJsonWithMedia(answer(JSON.stringify({ input: { prompt }, status: 'starting' }), size), 'prediction');
      expect(read.body, `chunks of ${size}`).toEqual({ input: { prompt }, status: 'starting' });
      expect(read.media.size).toBe(0);
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

describe('topLevelString', () => {
  it('finds a string member of the top object in as much of it as came, and nothing nested or unfinished', () => {
    expect(topLevelString('{"input":{"id":"nested","a":[1,"id"]},"id":"p\\"1","logs":"', 'id')).toBe('p"1');
    expect(topLevelString('{"id":"p1","output":', 'id')).toBe('p1');
    for (const json of ['{"input":{"id":"nested"},"logs":"', '{"id":"p1', '{"id":', '["id","x"]', '{"x":"id","y":"z"}', '<html>"id":"x"</html>', '{"a":{}},{"id":"x"}']) expect(topLevelString(json, 'id'), json).toBeUndefined();
  });
});

describe('a Replicate create answer that cannot be read whole', () => {
  let server: Server;
  let answerWith: (res: import('node:http').ServerResponse) => void = () => undefined;
  let account: UpstreamAccount;
  const mapping = { endpoint: 'owner/model', input: '{}', output: 'output' };
  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => answerWith(res));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    account = { memberId: 'mem_r', provider: 'replicate', baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, credentials: { api_token: 'r8_x' }, modelMap: {} };
  });
  afterAll(async () => new Promise<void>((resolve) => server.close(() => resolve())));

  /** A 201 whose body is `head`, then (`breaks`) a lost connection instead of the rest. */
  const answering = (head: string, breaks: boolean) => {
    answerWith = (res) => {
      res.writeHead(201, { 'content-type': 'application/json' });
      res.write(head, () => {
        if (breaks) setTimeout(() => res.socket?.destroy(), 20);
        else res.end();
      });
    };
  };

  it('gives the prediction id it read, to be looked at again, whether it broke off or passed a limit, waited for or not', async () => {
    const cases: [string, string, boolean][] = [
      ['broke off', '{"id":"p1","model":"owner/model","input":{"prompt":"a fox"},"logs":"', true],
      ['too much besides the media', `{"id":"p1","input":{"prompt":"a fox"},"logs":"${'x'.repeat(MAX_TEXT_BYTES)}","status":"starting"}`, false],
      ['no JSON past the id', '{"id":"p1","input":{"prompt":"a fox"}}}', false],
    ];
    for (const [what, head, breaks] of cases) {
      for (const wait of [undefined, 10]) {
        answering(head, breaks);
        const created = await createPrediction(account, mapping, { prompt: 'a fox' }, new AbortController().signal, 'video submit', wait);
        expect([created.id, created.unread], `${what}, wait ${wait}`).toEqual(['p1', true]);
        expect(await outcomeOf(created, mapping)).toEqual({ state: 'running' });
      }
    }
  });

  it('may still have been accepted when no id of its own came before the answer broke off', async () => {
    for (const head of ['{"model":"owner/model","input":{"id":"nested","prompt":"a fox"},"logs":"', '{"id":"p1']) {
      answering(head, true);
      const err = await failure(createPrediction(account, mapping, { prompt: 'a fox' }, new AbortController().signal, 'video submit'));
      expect([err?.kind, err?.maybeAccepted], head).toEqual(['retryable', true]);
    }
  });
});
