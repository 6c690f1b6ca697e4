/**
 * Phone photos (stored sideways, tagged EXIF orientation 6 or 8) are measured upright, so every
 * upstream must receive them upright, also the adapters handed the stored file (fal and Replicate
 * fetch it by URL, MiniMax is sent the video's frames): they get an upright copy without the tag,
 * a JPEG as a JPEG and anything else as a PNG, made once and reused by every later task, and
 * deleted with the upload. Which inputs need it is recorded on the file's row when it is inspected;
 * a row stored before that was recorded is read once when first needed.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startMiniMaxFake, type MiniMaxFake } from '../fakes/minimax.ts';
import { startReplicateFake, type ReplicateFake } from '../fakes/replicate.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { waitVideoFinished } from '../support/tasks.ts';

type Json = Record<string, any>;

let server: TestServer;
let fal: FalFake;
let replicate: ReplicateFake;
let minimax: MiniMaxFake;
let seq = 0;

beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret'], queueMs: 20, jobDurationMs: 50 });
  replicate = await startReplicateFake({ tokens: ['r8_a'], queueMs: 20, jobDurationMs: 50 });
  minimax = await startMiniMaxFake({ apiKeys: ['mm-a'], queueMs: 20, jobDurationMs: 50 });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  for (const id of ['fal/kling-v2.1-pro-fal', 'replicate/kling-v2.1-replicate', 'minimax/minimax-hailuo-2.3']) {
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(id)!.model });
    expect(response.status, id).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await Promise.all([fal?.close(), replicate?.close(), minimax?.close()]);
});

/** A customer whose group has a fal, a Replicate and a MiniMax member, each for its model. */
async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const members: { name: string; provider: 'fal' | 'replicate' | 'minimax'; base_url: string; credentials: Record<string, string>; models: string[] }[] = [
    { name: 'fal', provider: 'fal', base_url: fal.url, credentials: { api_key: 'fal-a:secret' }, models: ['kling-v2.1-pro-fal'] },
    { name: 'replicate', provider: 'replicate', base_url: replicate.baseUrl, credentials: { api_token: 'r8_a' }, models: ['kling-v2.1-replicate'] },
    { name: 'minimax', provider: 'minimax', base_url: minimax.url, credentials: { api_key: 'mm-a' }, models: ['minimax-hailuo-2.3'] },
  ];
  for (const body of members) {
    const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } }, body });
    expect(response.status).toBe(201);
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, key: key.key };
}

/**
 * An image stored 640x360 (its left half red, its right half blue) tagged with `orientation`:
 * shown 360x640. Turned upright, 6 (90° clockwise) puts the red half on top, 8 the blue one.
 */
function turned(format: 'jpeg' | 'png', orientation: number): Promise<Buffer> {
  const image = sharp({ create: { width: 640, height: 360, channels: 3, background: '#cc2020' } }).composite([
    { input: { create: { width: 320, height: 360, channels: 3, background: '#2020cc' } }, left: 320, top: 0 },
  ]);
  return (format === 'jpeg' ? image.jpeg({ quality: 95 }) : image.png()).withMetadata({ orientation }).toBuffer();
}

/** What an upstream decodes of these bytes when it ignores EXIF: format, size, tag, and the colour on top and at the bottom. */
async function asDecoded(bytes: Buffer) {
  const meta = await sharp(bytes).metadata();
  const { data, info } = await sharp(bytes).raw().toBuffer({ resolveWithObject: true });
  const colour = (y: number) => {
    const at = (y * info.width + Math.floor(info.width / 2)) * info.channels;
    return data[at]! > 150 && data[at + 2]! < 100 ? 'red' : data[at + 2]! > 150 && data[at]! < 100 ? 'blue' : 'other';
  };
  return { format: meta.format, width: meta.width, height: meta.height, orientation: meta.orientation ?? 1, top: colour(Math.floor(info.height / 4)), bottom: colour(Math.floor((info.height * 3) / 4)) };
}

async function upload(key: string, bytes: Buffer, name: string): Promise<Json> {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([bytes], { type: 'image/jpeg' }), name);
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(res.status).toBe(201);
  return (await res.json()) as Json;
}

async function createVideo(key: string, body: Json): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `upright-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', aspectRatio: '9:16', ...body }),
  });
  const created = (await res.json()) as Json;
  expect(res.status, JSON.stringify(created)).toBe(202);
  const { task } = await waitVideoFinished(server, key, created.id);
  expect(task.status, JSON.stringify(task)).toBe('completed');
  return created.id;
}

const upstreamJobId = async (taskId: string) => (await server.db.selectFrom('videoTasks').select('upstreamJobId').where('id', '=', taskId).executeTakeFirstOrThrow()).upstreamJobId!;
const falJob = async (taskId: string) => fal.jobs.get((await upstreamJobId(taskId)).split('/').at(-1)!)!;
const download = async (url: unknown) => Buffer.from(await (await fetch(String(url))).arrayBuffer());
const orientationOf = async (id: string) => (await server.db.selectFrom('files').select('orientation').where('id', '=', id).executeTakeFirstOrThrow()).orientation;
const copiesOf = (id: string) => server.db.selectFrom('files').select(['id', 'contentType', 'width', 'height', 'orientation']).where('id', 'like', `${id}%`).where('id', '<>', id).execute();

describe('inputs stored turned (EXIF orientation)', () => {
  it('go to fal, Replicate and MiniMax upright without the tag, from one stored copy deleted with the upload', async () => {
    const c = await customer();
    // Every input's orientation is recorded when it is stored (the upload, the inline frame): no
    // task step reads a header to find it out.
    const lateReads = vi.spyOn(server.ctx.services.files as unknown as { recordOrientation(): Promise<number> }, 'recordOrientation');
    const photo = await turned('jpeg', 6);
    const up = await upload(c.key, photo, 'IMG_0001.jpg');
    expect([up.content_type, up.width, up.height]).toEqual(['image/jpeg', 360, 640]);
    expect(await orientationOf(up.id)).toBe(6);

    // fal: the upload as the first frame, a turned PNG sent inline as the last one.
    const last = await turned('png', 8);
    const falTask = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', seconds: 5, firstFrame: up.id, lastFrame: `data:image/png;base64,${last.toString('base64')}` });
    const job = await falJob(falTask);
    expect(job.media.map((m) => `${m.field} ${m.form} ${m.mimeType} ${m.width}x${m.height}`)).toEqual(['image_url url image/jpeg 360x640', 'tail_image_url url image/png 360x640']);
    expect(await asDecoded(await download(job.input.image_url))).toEqual({ format: 'jpeg', width: 360, height: 640, orientation: 1, top: 'red', bottom: 'blue' });
    expect(await asDecoded(await download(job.input.tail_image_url))).toEqual({ format: 'png', width: 360, height: 640, orientation: 1, top: 'blue', bottom: 'red' });

    // Replicate and MiniMax: later tasks naming the same upload get the same copy.
    const replicateTask = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '1080p', seconds: 5, firstFrame: up.id });
    const prediction = replicate.predictions.get(await upstreamJobId(replicateTask))!;
    expect(prediction.media.map((m) => `${m.field} ${m.form} ${m.mimeType} ${m.width}x${m.height}`)).toEqual(['start_image url image/jpeg 360x640']);
    expect(await asDecoded(await download(prediction.input.start_image))).toMatchObject({ width: 360, height: 640, orientation: 1, top: 'red' });
    const minimaxTask = await createVideo(c.key, { model: 'minimax-hailuo-2.3', resolution: '768p', seconds: 6, aspectRatio: '16:9', firstFrame: up.id });
    const sent = minimax.tasks.get((await upstreamJobId(minimaxTask)).replace(/^v[12]\//, ''))!;
    expect(sent.images.map((i) => `${i.role} ${i.mimeType} ${i.width}x${i.height}`)).toEqual(['first_frame image/jpeg 360x640']);

    expect(lateReads).not.toHaveBeenCalled();
    lateReads.mockRestore();

    const copies = await copiesOf(up.id);
    expect(copies).toEqual([{ id: expect.stringMatching(new RegExp(`^${up.id}jpg`)), contentType: 'image/jpeg', width: 360, height: 640, orientation: 1 }]);
    // The client's file is what it uploaded.
    const own = await fetch(`${server.directUrl}/v1/files/${up.id}/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(Buffer.from(await own.arrayBuffer()).equals(photo)).toBe(true);

    // Deleting the upload deletes its copy.
    const deleted = await server.client(c.key).DELETE('/v1/files/{file_id}', { params: { path: { file_id: up.id } } });
    expect(deleted.response.status).toBe(200);
    expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${up.id}%`).execute()).toEqual([]);
  });

  it('an upright input is handed over as stored, with no copy', async () => {
    const c = await customer();
    const photo = await turned('jpeg', 1);
    const up = await upload(c.key, photo, 'scan.jpg');
    expect([up.width, up.height, await orientationOf(up.id)]).toEqual([640, 360, 1]);
    const job = await falJob(await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', seconds: 5, firstFrame: up.id }));
    expect((await download(job.input.image_url)).equals(photo)).toBe(true);
    expect(await copiesOf(up.id)).toEqual([]);
  });

  it('a row stored before orientations were recorded is read once when first sent, and the orientation recorded', async () => {
    const c = await customer();
    const up = await upload(c.key, await turned('jpeg', 6), 'IMG_0002.jpg');
    // As a row written before the column existed (or by a writer that does not record it).
    await server.db.updateTable('files').set({ orientation: null }).where('id', '=', up.id).execute();
    const [input] = await server.ctx.services.files.mediaInputs([up.id]);
    expect([input!.contentType, input!.width, input!.height]).toEqual(['image/jpeg', 360, 640]);
    expect(await orientationOf(up.id)).toBe(6);
    const chunks: Buffer[] = [];
    for await (const chunk of input!.open()) chunks.push(chunk as Buffer);
    expect(await asDecoded(Buffer.concat(chunks))).toMatchObject({ width: 360, height: 640, orientation: 1, top: 'red' });
    expect(await copiesOf(up.id)).toHaveLength(1);
  });
});
