/**
 * The fake DashScope (test/fakes/dashscope.ts) spoken to with plain fetch, as DashScope's own
 * references describe the wire: what it answers a request without the async header or a key, the
 * legacy and new bodies each refusing the other's fields, `W*H` sizes, media as URLs only, the
 * keyframe endpoint, an input the data inspection cannot read (its format, no image), the task's states with its result on another origin that expires, the cancel
 * of PENDING tasks only and a failed task's error in `output` (Alibaba's examples) or at the top.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDashScopeFake, type DashScopeFake } from '../fakes/dashscope.ts';
import { startFakeServer } from '../fakes/fake-http.ts';
import { until } from '../support/tasks.ts';

let fake: DashScopeFake;
let png: string;
const KEY = 'sk-fidelity';

beforeAll(async () => {
  fake = await startDashScopeFake({ accounts: { [KEY]: {} }, pendingMs: 40, runningMs: 40 });
  png = `data:image/png;base64,${(await sharp({ create: { width: 640, height: 480, channels: 3, background: '#336699' } }).png().toBuffer()).toString('base64')}`;
});
afterAll(async () => fake?.close());

type Json = Record<string, any>;

async function call(path: string, body?: unknown, headers: Record<string, string> = { Authorization: `Bearer ${KEY}`, 'X-DashScope-Async': 'enable' }) {
  const res = await fetch(`${fake.url}${path}`, { method: body === undefined ? 'GET' : 'POST', headers: { ...headers, ...(body !== undefined && { 'Content-Type': 'application/json' }) }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json };
}
const SYNTHESIS = '/api/v1/services/aigc/video-generation/video-synthesis';

describe('fake dashscope', () => {
  it('refuses a submit without the async header or a key as DashScope does', async () => {
    const body = { model: 'wan2.7-t2v', input: { prompt: 'x' } };
    expect(await call(SYNTHESIS, body, { Authorization: `Bearer ${KEY}` })).toEqual({ status: 403, body: { request_id: expect.any(String), code: 'AccessDenied', message: 'current user api does not support synchronous calls' } });
    expect(await call(SYNTHESIS, body, { 'X-DashScope-Async': 'enable' })).toMatchObject({ status: 401, body: { code: 'InvalidApiKey', message: 'No API-key provided.' } });
    expect(await call(SYNTHESIS, { ...body, model: 'wan9-t2v' })).toMatchObject({ status: 400, body: { code: 'InvalidParameter', message: 'Model not exist.' } });
  });

  it("holds each body to its own fields: W*H sizes, img_url on legacy models, media URLs on the new ones, kf2v at image2video", async () => {
    expect((await call(SYNTHESIS, { model: 'wan2.5-t2v-preview', input: { prompt: 'x' }, parameters: { size: '1280x720' } })).body.message).toMatch(/^The size is not match/);
    expect((await call(SYNTHESIS, { model: 'wan2.5-t2v-preview', input: { prompt: 'x' }, parameters: { size: '1280*720', duration: 10 } })).status).toBe(200);
    expect((await call(SYNTHESIS, { model: 'wan2.7-i2v', input: { prompt: 'x', img_url: png } })).body.message).toBe('The model wan2.7-i2v takes input.media; img_url is not supported.');
    expect((await call(SYNTHESIS, { model: 'wan2.7-i2v', input: { prompt: 'x', media: [{ type: 'first_frame', url: png }] } })).body.message).toMatch(/^url error/);
    expect((await call(SYNTHESIS, { model: 'wan2.7-i2v', input: { prompt: 'x' } })).body.message).toBe('image-to-video model wan2.7-i2v must provide an image');
    expect((await call(SYNTHESIS, { model: 'wan2.2-i2v-plus', input: { prompt: 'x', img_url: png }, parameters: { resolution: '480P' } })).status).toBe(200);
    expect((await call(SYNTHESIS, { model: 'wan2.2-kf2v-flash', input: { first_frame_url: png } })).body.message).toMatch(/does not support this API/);
    expect((await call('/api/v1/services/aigc/image2video/video-synthesis', { model: 'wan2.2-kf2v-flash', input: { first_frame_url: png, last_frame_url: png } })).status).toBe(200);
    const unreachable = await call(SYNTHESIS, { model: 'wan2.7-i2v', input: { prompt: 'x', media: [{ type: 'first_frame', url: 'http://127.0.0.1:9/frame.png' }] } });
    expect(unreachable).toMatchObject({ status: 400, body: { code: 'InvalidParameter.DataInspection', message: 'Unable to download the media resource during the data inspection process.' } });
  });

  it("refuses an input Wan cannot read as the data inspection does: the table's format message for a GIF, the decode message for no image", async () => {
    const gif = (await sharp({ create: { width: 640, height: 480, channels: 3, background: '#336699' } }).gif().toBuffer()).toString('base64');
    const format = { status: 400, body: { request_id: expect.any(String), code: 'InvalidParameter.DataInspection', message: 'The media format is not supported or incorrect for the data inspection.' } };
    expect(await call(SYNTHESIS, { model: 'wan2.2-i2v-plus', input: { prompt: 'x', img_url: `data:image/gif;base64,${gif}` }, parameters: { resolution: '480P' } })).toEqual(format);
    // Fetched from a URL alike, whatever type the URL's answer claims.
    const served = await startFakeServer((_req, res) => {
      const bytes = Buffer.from(gif, 'base64');
      res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(bytes.length) });
      res.end(bytes);
    });
    try {
      expect(await call(SYNTHESIS, { model: 'wan2.7-i2v', input: { prompt: 'x', media: [{ type: 'first_frame', url: `${served.url}/frame.png` }] } })).toEqual(format);
    } finally {
      await served.close();
    }
    const noImage = await call(SYNTHESIS, { model: 'wan2.2-i2v-plus', input: { prompt: 'x', img_url: `data:image/png;base64,${Buffer.from('not an image').toString('base64')}` }, parameters: { resolution: '480P' } });
    expect(noImage).toMatchObject({ status: 400, body: { code: 'InvalidParameter.DataInspection', message: 'Failed to decode the image during the data inspection.' } });
  });

  it('runs a task PENDING → RUNNING → SUCCEEDED with a result link on another origin that expires, and cancels PENDING tasks only', async () => {
    const created = await call(SYNTHESIS, { model: 'wan2.7-t2v', input: { prompt: 'a harbour' }, parameters: { resolution: '720P', ratio: '16:9', duration: 3 } });
    expect(created.body).toEqual({ output: { task_status: 'PENDING', task_id: expect.stringMatching(/^[0-9a-f-]{36}$/) }, request_id: expect.any(String) });
    const id = created.body.output.task_id as string;
    const seen = new Set<string>();
    const done = await until(async () => {
      const { body } = await call(`/api/v1/tasks/${id}`);
      seen.add(body.output.task_status);
      return body.output.task_status === 'SUCCEEDED' && body;
    }, 5000, 'success');
    expect([...seen]).toEqual(expect.arrayContaining(['SUCCEEDED']));
    expect(done).toMatchObject({ output: { task_id: id, video_url: expect.stringContaining(fake.ossUrl), submit_time: expect.stringMatching(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$/) }, usage: { duration: 3, video_count: 1, SR: 720, audio: true } });
    expect((await fetch(done.output.video_url)).status).toBe(200);
    fake.expireResult(id);
    const gone = await fetch(done.output.video_url);
    expect([gone.status, await gone.text()]).toEqual([403, expect.stringContaining('<Code>AccessDenied</Code>')]);
    expect(await call(`/api/v1/tasks/${id}/cancel`, {})).toMatchObject({ status: 400, body: { code: 'UnsupportedOperation', message: 'Failed to cancel the task, please confirm if the task is in PENDING status.' } });
    const queued = (await call(SYNTHESIS, { model: 'wan2.7-t2v', input: { prompt: 'x [ds:stay-pending]' } })).body.output.task_id as string;
    expect(await call(`/api/v1/tasks/${queued}/cancel`, {})).toEqual({ status: 200, body: { request_id: expect.any(String) } });
    expect((await call(`/api/v1/tasks/${queued}`)).body.output.task_status).toBe('CANCELED');
    expect((await call('/api/v1/tasks/00000000-0000-4000-8000-000000000000')).body).toEqual({ request_id: expect.any(String), output: { task_id: '00000000-0000-4000-8000-000000000000', task_status: 'UNKNOWN' } });
  });

  it("puts a failed task's error in output, or at the top level when asked", async () => {
    for (const where of ['output', 'top'] as const) {
      fake.failedErrorIn = where;
      const id = (await call(SYNTHESIS, { model: 'wan2.7-t2v', input: { prompt: 'x [ds:unsafe]' } })).body.output.task_id as string;
      const failed = await until(async () => {
        const { body } = await call(`/api/v1/tasks/${id}`);
        return body.output.task_status === 'FAILED' && body;
      }, 5000, 'failure');
      const error = { code: 'DataInspectionFailed', message: 'Output data may contain inappropriate content.' };
      if (where === 'output') expect(failed.output).toMatchObject(error);
      else expect(failed).toMatchObject(error);
    }
    fake.failedErrorIn = 'output';
  });
});
