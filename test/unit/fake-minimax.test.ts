/**
 * The MiniMax fake against upstream-apis.md §10.4 and the vendor sources its header names, spoken
 * to with plain fetch (never through the adapter): errors at HTTP 200 in `base_resp` (v2: in the
 * envelope of MiniMax's v2 pages, the code at the end of the message), the v1
 * state machine and its file lookup, result links on another origin that expire, per-model
 * validation, image URLs really fetched, the accounts' balance and plan, and the v2 (H3) shapes.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMiniMaxFake, type MiniMaxFake } from '../fakes/minimax.ts';
import { until } from '../support/tasks.ts';

let fake: MiniMaxFake;
let images: Server;
let imagesUrl: string;
let frame: string;
let png: Buffer;

beforeAll(async () => {
  // Phases long enough that a poll every 25 ms sees each one on a loaded machine (Queueing is the
  // second half of queueMs, Processing the rest of jobDurationMs: at 60 / 200 ms Queueing was a
  // 30 ms window a busy CI worker could poll across).
  fake = await startMiniMaxFake({ apiKeys: ['mm-a', 'mm-b'], queueMs: 600, jobDurationMs: 1200 });
  png = await sharp({ create: { width: 640, height: 360, channels: 3, background: '#336699' } }).png().toBuffer();
  frame = `data:image/png;base64,${png.toString('base64')}`;
  // Where a URL input lives (a Mediagate signed URL in production).
  images = createServer((req, res) => {
    if (req.url === '/frame.png') {
      res.writeHead(200, { 'content-type': 'image/png' });
      res.end(png);
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise<void>((resolve) => images.listen(0, '127.0.0.1', resolve));
  imagesUrl = `http://127.0.0.1:${(images.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await fake?.close();
  await new Promise((resolve) => images?.close(resolve));
});

type Json = Record<string, any>;

async function call(path: string, init: { method?: string; key?: string | null; body?: unknown } = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (init.key !== null) headers.authorization = `Bearer ${init.key ?? 'mm-a'}`;
  const res = await fetch(`${fake.url}${path}`, { method: init.method ?? (init.body === undefined ? 'GET' : 'POST'), headers, ...(init.body !== undefined && { body: JSON.stringify(init.body) }) });
  const text = await res.text();
  let json: Json = {};
  try {
    json = JSON.parse(text) as Json;
  } catch {
    // a page
  }
  return { status: res.status, json, text, headers: res.headers };
}

const v1 = (body: Record<string, unknown>, key?: string) => call('/v1/video_generation', { body: { model: 'MiniMax-Hailuo-2.3', prompt: 'a paper boat', ...body }, ...(key && { key }) });
const v2 = (body: Record<string, unknown>) => call('/v2/video_generation', { body: { model: 'MiniMax-H3', content: [{ type: 'text', text: 'a paper boat' }], resolution: '768P', duration: 5, ratio: '16:9', ...body } });
/** The code and message of either envelope: base_resp, or v2's `error`, whose code ends its message (see the fake's header). */
const code = (res: { json: Json }) => {
  if (res.json.base_resp) return [res.json.base_resp.status_code, res.json.base_resp.status_msg];
  const end = /\((\d+)\)$/.exec(res.json.error?.message ?? '');
  return [end ? Number(end[1]) : undefined, res.json.error?.message];
};

describe('MiniMax fake: auth, envelope and accounts', () => {
  it('answers a missing key 1004 and an unknown one 2049, at HTTP 200 with a Trace-Id', async () => {
    const missing = await call('/v1/video_generation', { key: null, body: { model: 'MiniMax-Hailuo-2.3', prompt: 'x' } });
    expect([missing.status, ...code(missing)]).toEqual([200, 1004, expect.stringContaining('login fail')]);
    const unknown = await v1({}, 'sk-unknown');
    expect([unknown.status, ...code(unknown)]).toEqual([200, 2049, 'invalid api key']);
    expect(unknown.headers.get('trace-id')).toMatch(/^[0-9a-f]{32}$/);
  });

  it('refuses an unknown model as invalid params naming it, and a model outside the account\'s plan with 2061', async () => {
    expect(code(await v1({ model: 'MiniMax-Hailuo-9' }))).toEqual([2013, "invalid params, unknown model 'MiniMax-Hailuo-9'"]);
    expect(code(await call('/v2/video_generation', { body: { model: 'MiniMax-Hailuo-2.3', content: [{ type: 'text', text: 'x' }] } }))[0]).toBe(2013);
    fake.permitModels('mm-b', ['MiniMax-Hailuo-02']);
    try {
      expect(code(await v1({}, 'mm-b'))[0]).toBe(2061);
      expect(code(await v1({ model: 'MiniMax-Hailuo-02' }, 'mm-b'))[0]).toBe(0);
    } finally {
      fake.permitModels('mm-b', undefined);
    }
  });

  it('answers every create 1008 while the balance is empty, and keeps answering queries', async () => {
    const created = await v1({});
    fake.setBalance('mm-a', 'empty');
    try {
      expect(code(await v1({}))).toEqual([1008, 'insufficient balance']);
      expect((await v1({})).json.task_id).toBe('');
      expect(code(await call(`/v1/query/video_generation?task_id=${created.json.task_id}`))[0]).toBe(0);
    } finally {
      fake.setBalance('mm-a', 'ok');
    }
  });

  it('rate-limits as 1002 at HTTP 200, or as HTTP 429 with Retry-After when seconds are given; a proxy fails with a 502 page', async () => {
    fake.rateLimitNext('submit');
    const limited = await v1({});
    expect([limited.status, ...code(limited)]).toEqual([200, 1002, 'rate limit']);
    fake.rateLimitNext('poll', 7);
    const late = await call('/v1/query/video_generation?task_id=1');
    expect([late.status, late.headers.get('retry-after'), code(late)[0]]).toEqual([429, '7', 1002]);
    fake.serverErrorNext('submit');
    expect((await v1({})).status).toBe(502);
    expect((await call('/v1/no_such_path')).status).toBe(404);
  });
});

describe('MiniMax fake: v1 tasks', () => {
  it('runs Preparing → Queueing → Processing → Success, then the file lookup gives an int64 file_id and a link on another origin', async () => {
    const created = await v1({ duration: 10, resolution: '768P' });
    expect(code(created)).toEqual([0, 'success']);
    expect(created.json.task_id).toMatch(/^\d+$/);
    const seen = new Set<string>();
    const done = await until(async () => {
      const q = await call(`/v1/query/video_generation?task_id=${created.json.task_id}`);
      seen.add(q.json.status);
      return q.json.status === 'Success' && q.json;
    }, 5000);
    expect([...seen]).toEqual(expect.arrayContaining(['Queueing', 'Processing', 'Success']));
    expect(done).toMatchObject({ file_id: expect.stringMatching(/^\d+$/), video_width: 1366, video_height: 768 });
    const file = await call(`/v1/files/retrieve?file_id=${done.file_id}`);
    expect(file.json.file).toMatchObject({ file_id: Number(done.file_id), filename: 'output.mp4', purpose: 'video_generation' });
    const url = new URL(file.json.file.download_url);
    expect(url.origin).toBe(fake.cdnUrl);
    const video = await fetch(url);
    expect([video.status, video.headers.get('content-type')]).toEqual([200, 'video/mp4']);
    expect(Buffer.from(await video.arrayBuffer()).subarray(4, 8).toString('latin1')).toBe('ftyp');
    // Another account does not see the file.
    expect(code(await call(`/v1/files/retrieve?file_id=${done.file_id}`, { key: 'mm-b' }))[0]).toBe(2013);
  });

  it('makes every link expire: 403 AccessDenied from the object storage', async () => {
    const created = await v1({});
    const id = created.json.task_id as string;
    await until(() => fake.statusOf(id) === 'Success', 5000);
    const fileId = fake.tasks.get(id)!.fileId!;
    fake.urlTtlMs = 0;
    try {
      const link = (await call(`/v1/files/retrieve?file_id=${fileId}`)).json.file.download_url as string;
      const res = await fetch(link);
      expect([res.status, await res.text()]).toEqual([403, expect.stringContaining('<Code>AccessDenied</Code>')]);
    } finally {
      fake.urlTtlMs = 9 * 3_600_000;
    }
    const fresh = (await call(`/v1/files/retrieve?file_id=${fileId}`)).json.file.download_url as string;
    expect((await fetch(fresh)).status).toBe(200);
    fake.expire(id);
    expect((await fetch(fresh)).status).toBe(403);
  });

  it('fails a task refused after submit with 1027 in base_resp, a plain failure with base_resp 0, and says Failed when asked to', async () => {
    const refused = await v1({ prompt: 'x [minimax:sensitive-output]' });
    const plain = await v1({ prompt: 'x [minimax:fail]' });
    await until(() => fake.statusOf(plain.json.task_id) === 'Fail', 5000);
    expect((await call(`/v1/query/video_generation?task_id=${refused.json.task_id}`)).json).toMatchObject({ status: 'Fail', base_resp: { status_code: 1027, status_msg: 'output new_sensitive' } });
    expect((await call(`/v1/query/video_generation?task_id=${plain.json.task_id}`)).json).toMatchObject({ status: 'Fail', base_resp: { status_code: 0 } });
    fake.failWord = 'Failed';
    try {
      expect((await call(`/v1/query/video_generation?task_id=${plain.json.task_id}`)).json.status).toBe('Failed');
    } finally {
      fake.failWord = 'Fail';
    }
    expect(code(await v1({ prompt: 'x [minimax:sensitive]' }))).toEqual([1026, 'input new_sensitive']);
  });

  it('validates each model as MiniMax documents it', async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ resolution: '1080P', duration: 10 }, /at 1080P supports durations of 6 seconds/],
      [{ resolution: '720P' }, /resolution of MiniMax-Hailuo-2.3 must be one of 768P, 1080P/],
      [{ duration: '6' }, /duration must be an integer/],
      [{ model: 'MiniMax-Hailuo-2.3-Fast' }, /requires first_frame_image/],
      [{ model: 'MiniMax-Hailuo-02', resolution: '512P' }, /512P of MiniMax-Hailuo-02 requires first_frame_image/],
      [{ model: 'MiniMax-Hailuo-02', resolution: '512P', first_frame_image: frame, last_frame_image: frame }, /does not support 512P/],
      [{ last_frame_image: frame, first_frame_image: frame }, /does not take last_frame_image/],
      [{ model: 'MiniMax-Hailuo-02', last_frame_image: frame }, /requires first_frame_image/],
      [{ model: 'T2V-01', first_frame_image: frame }, /does not take first_frame_image/],
      [{ model: 'S2V-01' }, /requires subject_reference/],
      [{ model: 'S2V-01', subject_reference: [{ type: 'character', image: [frame, frame] }] }, /one \{"type": "character"/],
      [{ prompt: 'x'.repeat(2001) }, /2000 characters/],
      [{ prompt_optimizer: 'no' }, /prompt_optimizer must be a boolean/],
      [{ first_frame_image: frame.replace('image/png', 'image/gif') }, /data URL/],
    ];
    for (const [body, message] of cases) {
      const res = await v1(body);
      expect(code(res), JSON.stringify(body).slice(0, 120)).toEqual([2013, expect.stringMatching(message)]);
    }
    const small = `data:image/png;base64,${(await sharp({ create: { width: 300, height: 300, channels: 3, background: '#000' } }).png().toBuffer()).toString('base64')}`;
    expect(code(await v1({ first_frame_image: small }))[1]).toMatch(/greater than 300 px/);
    const thin = `data:image/png;base64,${(await sharp({ create: { width: 1200, height: 400, channels: 3, background: '#000' } }).png().toBuffer()).toString('base64')}`;
    expect(code(await v1({ first_frame_image: thin }))[1]).toMatch(/between 2:5 and 5:2/);
  });

  it('takes first and last frames, and a subject, as data URLs or URLs it really downloads', async () => {
    const both = await v1({ model: 'MiniMax-Hailuo-02', first_frame_image: frame, last_frame_image: `${imagesUrl}/frame.png` });
    expect(code(both)[0]).toBe(0);
    expect(fake.tasks.get(both.json.task_id)!.images.map((i) => `${i.role} ${i.form} ${i.mimeType} ${i.width}x${i.height}`)).toEqual(['first_frame data image/png 640x360', 'last_frame url image/png 640x360']);
    const subject = await v1({ model: 'S2V-01', subject_reference: [{ type: 'character', image: [frame] }] });
    expect(fake.tasks.get(subject.json.task_id)!).toMatchObject({ resolution: '720P', duration: 6, images: [{ role: 'subject' }] });
    expect(code(await v1({ first_frame_image: `${imagesUrl}/missing.png` }))).toEqual([2013, expect.stringMatching(/could not be downloaded/)]);
  });
});

describe('MiniMax fake: v2 (MiniMax-H3)', () => {
  it('creates from content[] and answers the task object: queued → running → succeeded with content.url and usage', async () => {
    const created = await v2({ content: [{ type: 'text', text: 'a boat' }, { type: 'image_url', image_url: { url: frame }, role: 'first_frame' }], ratio: 'adaptive', resolution: '2K', duration: 15 });
    expect(created.json).toEqual({ task_id: expect.stringMatching(/^\d+$/) });
    const seen = new Set<string>();
    const done = await until(async () => {
      const q = await call(`/v2/query/video_generation/${created.json.task_id}`);
      seen.add(q.json.task.status);
      return q.json.task.status === 'succeeded' && q.json.task;
    }, 5000);
    expect([...seen]).toEqual(expect.arrayContaining(['queued', 'running', 'succeeded']));
    expect(done).toMatchObject({ id: created.json.task_id, model: 'MiniMax-H3', resolution: '2K', duration: 15, content: { url: expect.stringContaining(fake.cdnUrl) }, usage: { output_seconds: 15, input_image_count: 1 } });
    expect((await fetch(done.content.url)).status).toBe(200);
  });

  it('validates content, ratio, resolution and duration', async () => {
    const image = (role: string) => ({ type: 'image_url', image_url: { url: frame }, role });
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ ratio: undefined }, /ratio is required for text to video/],
      [{ ratio: 'adaptive' }, /adaptive is not supported for text to video/],
      [{ resolution: '1080P' }, /resolution must be one of 768P, 2K/],
      [{ duration: 16 }, /between 4 and 15/],
      [{ content: [{ type: 'text', text: 'x' }, image('last_frame')] }, /last_frame requires first_frame/],
      [{ content: [{ type: 'text', text: 'x' }, image('first_frame'), image('reference_image')] }, /cannot be used together/],
      [{ content: [{ type: 'text', text: 'x' }, ...Array.from({ length: 10 }, () => image('reference_image'))] }, /at most 9 reference images/],
      [{ content: [image('first_frame')] }, /needs a text item/],
    ];
    for (const [body, message] of cases) expect(code(await v2(body)), JSON.stringify(body).slice(0, 100)).toEqual([2013, expect.stringMatching(message)]);
  });

  it('refuses in the v2 envelope of MiniMax\'s v2 pages at the status it names, its code only in the message; or in base_resp at 200', async () => {
    const invalid = await v2({ duration: 16 });
    expect([invalid.status, invalid.json]).toEqual([400, { type: 'error', error: { type: 'bad_request_error', message: 'invalid params, duration must be between 4 and 15 seconds (2013)', http_code: '400' }, request_id: expect.stringMatching(/^[0-9a-f]{32}$/) }]);
    expect(invalid.json.base_resp).toBeUndefined();
    const sensitive = await v2({ content: [{ type: 'text', text: 'x [minimax:sensitive]' }] });
    expect([sensitive.status, sensitive.json.error]).toEqual([422, { type: 'unprocessable_entity_error', message: 'video description contains sensitive content (1026)', http_code: '422' }]);
    const anonymous = await call('/v2/video_generation', { key: null, body: {} });
    expect([anonymous.status, anonymous.json.error?.type, ...code(anonymous)]).toEqual([401, 'authorized_error', 1004, expect.stringMatching(/^login fail: .* \(1004\)$/)]);
    fake.setBalance('mm-a', 'empty');
    try {
      const broke = await v2({});
      expect([broke.status, broke.json.error]).toEqual([402, { type: 'insufficient_balance_error', message: 'insufficient balance (1008)', http_code: '402' }]);
      fake.v2Errors = 'base_resp';
      const old = await v2({});
      expect([old.status, ...code(old)]).toEqual([200, 1008, expect.any(String)]);
    } finally {
      fake.setBalance('mm-a', 'ok');
      fake.v2Errors = 'error';
    }
  });

  it('answers an injected refusal of a v2 route in the v2 envelope, at the status its code goes with or at the one the test gave', async () => {
    fake.errorNext('submit', 2061);
    const plan = await v2({});
    expect([plan.status, plan.json.error]).toEqual([400, { type: 'bad_request_error', message: 'your current token plan does not support this model (2061)', http_code: '400' }]);
    fake.errorNext('submit', 1008, { status: 200 });
    const at200 = await v2({});
    expect([at200.status, at200.json.type, at200.json.error]).toEqual([200, 'error', { type: 'insufficient_balance_error', message: 'insufficient balance (1008)', http_code: '402' }]);
    fake.rateLimitNext('submit', 3);
    const limited = await v2({});
    expect([limited.status, limited.headers.get('retry-after'), limited.json.error?.type, ...code(limited)]).toEqual([429, '3', 'rate_limit_error', 1002, 'rate limit (1002)']);
    // v1 keeps base_resp.
    fake.errorNext('submit', 2061);
    expect(code(await v1({}))).toEqual([2061, 'your current token plan does not support this model']);
  });

  it('signs a fresh result link at each query of a finished v2 task', async () => {
    const created = await v2({});
    const query = async () => (await call(`/v2/query/video_generation/${created.json.task_id}`)).json.task;
    const first = await until(async () => {
      const task = await query();
      return task.status === 'succeeded' && task;
    }, 5000);
    // `Expires` counts seconds.
    await new Promise((r) => setTimeout(r, 1100));
    const second = await query();
    expect(new URL(second.content.url).searchParams.get('Expires')).not.toBe(new URL(first.content.url).searchParams.get('Expires'));
    expect((await fetch(second.content.url)).status).toBe(200);
  });

  it('ends a task as `expired` (MiniMax\'s CLI counts it a failure)', async () => {
    const created = await v2({ content: [{ type: 'text', text: 'x [minimax:expired]' }] });
    await until(() => fake.statusOf(created.json.task_id) === 'expired', 5000);
    expect((await call(`/v2/query/video_generation/${created.json.task_id}`)).json.task).toMatchObject({ status: 'expired' });
  });

  it('fails a task with error.code as a string', async () => {
    const created = await v2({ content: [{ type: 'text', text: 'x [minimax:sensitive-output]' }] });
    await until(() => fake.statusOf(created.json.task_id) === 'failed', 5000);
    expect((await call(`/v2/query/video_generation/${created.json.task_id}`)).json.task).toMatchObject({ status: 'failed', error: { code: '1027', message: 'output new_sensitive' } });
  });
});
