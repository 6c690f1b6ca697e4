/**
 * Media retention and the media sweeper (issue 29, requirement 4): outputs and inputs expire after
 * the operator's periods or their account's own, a task whose media expired still answers its
 * lookup without the URL fields, and the sweeper — one instance at a time — deletes expired files
 * (rows and bytes, detached from their tasks), rows whose bytes never landed, and objects no row
 * names.
 */
import { existsSync } from 'node:fs';
import { mkdir, symlink, utimes } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { createTransactor } from '../../server/db/transaction.ts';
import { StorageUnavailable, type MediaStore } from '../../server/storage/media-store.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { startTestS3, type TestS3 } from '../support/s3-server.ts';
import { until, waitVideoFinished } from '../support/tasks.ts';

const DAY = 86_400_000;
let server: TestServer;
let png: string;

beforeAll(async () => {
  server = await startTestServer({ workers: true, env: { OUTPUT_RETENTION_DAYS: '20', INPUT_RETENTION_DAYS: '3', TASK_MAX_LIFETIME_SECONDS: '3600' } });
  await seedCatalog(server.db);
  png = `data:image/png;base64,${(await sharp({ create: { width: 64, height: 36, channels: 3, background: '#3366aa' } }).png().toBuffer()).toString('base64')}`;
});
afterAll(async () => server?.close());

let seq = 0;
async function post(key: string, path: string, payload: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(payload),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

const videoBody = (extra: Record<string, unknown> = {}) => ({
  client_request_id: `retention-${++seq}`,
  prompt: 'a lighthouse in fog',
  model: 'local-video-1',
  seconds: 2,
  aspectRatio: '16:9',
  resolution: '360p',
  ...extra,
});

async function finishedVideo(key: string, extra: Record<string, unknown> = {}) {
  const created = await post(key, '/v1/videos/generations', videoBody(extra));
  expect(created.status).toBe(202);
  const { task } = await waitVideoFinished(server, key, created.body.id as string);
  expect(task.status).toBe('completed');
  return task;
}

const fileRow = (id: string) => server.db.selectFrom('files').selectAll().where('id', '=', id).executeTakeFirst();
const expireFile = (id: string) => server.db.updateTable('files').set({ expiresAt: new Date(Date.now() - 1000) }).where('id', '=', id).execute();
const near = (actual: Date | string | null | undefined, expected: number) => Math.abs(new Date(actual!).getTime() - expected) < 60_000;

describe('retention periods', () => {
  it('a video is kept for OUTPUT_RETENTION_DAYS, shown as media_expires_at; its input for the task lifetime, a day and INPUT_RETENTION_DAYS', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const task = await finishedVideo(c.key, { first_frame: png });
    expect(near(task.media_expires_at, Date.now() + 20 * DAY)).toBe(true);
    const row = await server.db.selectFrom('videoTasks').select(['outputFileId', 'inputFileIds']).where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(near((await fileRow(row.outputFileId!))!.expiresAt, Date.now() + 20 * DAY)).toBe(true);
    expect(row.inputFileIds).toHaveLength(1);
    expect(near((await fileRow(row.inputFileIds[0]!))!.expiresAt, Date.now() + 3600_000 + DAY + 3 * DAY)).toBe(true);
  });

  it("an account's own periods (admin API) override the operator's, and null returns to them", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const set = await server.admin().PATCH('/admin/v1/accounts/{account_id}', {
      params: { path: { account_id: c.accountId } },
      body: { output_retention_days: 90, input_retention_days: 1 },
    });
    expect(set.response.status).toBe(200);
    expect(set.data).toMatchObject({ output_retention_days: 90, input_retention_days: 1 });

    const task = await finishedVideo(c.key, { first_frame: png });
    expect(near(task.media_expires_at, Date.now() + 90 * DAY)).toBe(true);
    const row = await server.db.selectFrom('videoTasks').select(['inputFileIds']).where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(near((await fileRow(row.inputFileIds[0]!))!.expiresAt, Date.now() + 3600_000 + DAY + DAY)).toBe(true);

    const image = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a kite', response_format: 'url' });
    expect(image.status).toBe(200);
    const imageTask = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: await lastImageTask(c.accountId) } } });
    expect(near(imageTask.data!.media_expires_at, Date.now() + 90 * DAY)).toBe(true);

    const reset = await server.admin().PATCH('/admin/v1/accounts/{account_id}', {
      params: { path: { account_id: c.accountId } },
      body: { output_retention_days: null },
    });
    expect(reset.data).toMatchObject({ output_retention_days: null, input_retention_days: 1 });
    expect(near((await finishedVideo(c.key)).media_expires_at, Date.now() + 20 * DAY)).toBe(true);

    // Past Prism (whose own refusal is a 422): the gateway's answer.
    const bad = await server.direct(ADMIN_TOKEN).PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: c.accountId } }, body: { output_retention_days: 0 } });
    expect([bad.response.status, bad.error?.error.param]).toEqual([400, 'output_retention_days']);
  });
});

async function lastImageTask(accountId: string): Promise<string> {
  const row = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', accountId).orderBy('createdAt', 'desc').limit(1).executeTakeFirstOrThrow();
  return row.id;
}

describe('expired media', () => {
  it('a video past its retention answers completed without video_url, data and media_expires_at; the sweep deletes row and bytes and detaches the task', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const task = await finishedVideo(c.key);
    const oldUrl = task.video_url!;
    const { outputFileId } = await server.db.selectFrom('videoTasks').select('outputFileId').where('id', '=', task.id).executeTakeFirstOrThrow();
    const stored = join(server.config.mediaDir, (await fileRow(outputFileId!))!.storageKey);
    expect(existsSync(stored)).toBe(true);

    await expireFile(outputFileId!);
    const before = (await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: task.id } } })).data!;
    expect(before.status).toBe('completed');
    expect(before).not.toHaveProperty('video_url');
    expect(before).not.toHaveProperty('data');
    expect(before).not.toHaveProperty('media_expires_at');

    expect(await server.ctx.mediaSweeper.sweepExpired()).toBeGreaterThanOrEqual(1);
    expect(await fileRow(outputFileId!)).toBeUndefined();
    expect(existsSync(stored)).toBe(false);
    const after = await server.db.selectFrom('videoTasks').select(['outputFileId', 'status', 'actualCredits']).where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(after).toMatchObject({ outputFileId: null, status: 'completed' });
    expect(after.actualCredits).toBeGreaterThan(0);

    const looked = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: task.id } } });
    expect(looked.response.status).toBe(200);
    expect(looked.data).toMatchObject({ id: task.id, status: 'completed', billing: before.billing });
    expect(looked.data).not.toHaveProperty('video_url');
    const listed = await server.client(c.key).GET('/v1/videos', { params: { query: {} } });
    expect(listed.data!.data.find((t) => t.id === task.id)).not.toHaveProperty('video_url');
    expect((await fetch(oldUrl)).status).toBe(404);
  });

  it('an image task past its retention answers completed with an empty data; the sweep removes its images from result_file_ids', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    for (const format of ['url', 'b64_json'] as const) {
      const image = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a kite', n: 2, response_format: format });
      expect(image.status).toBe(200);
      const id = await lastImageTask(c.accountId);
      const { resultFileIds } = await server.db.selectFrom('imageTasks').select('resultFileIds').where('id', '=', id).executeTakeFirstOrThrow();
      expect(resultFileIds).toHaveLength(2);
      const kept = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
      expect(kept.data!.data).toHaveLength(2);
      expect(kept.data!.media_expires_at).toBeDefined();

      for (const file of resultFileIds) await expireFile(file);
      const expired = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
      expect(expired.data).toMatchObject({ status: 'completed', data: [] });
      expect(expired.data).not.toHaveProperty('media_expires_at');
      const listed = await server.client(c.key).GET('/v1/images', { params: { query: {} } });
      expect(listed.data!.data.find((t) => t.id === id)).toMatchObject({ status: 'completed', data: [] });

      await server.ctx.mediaSweeper.sweepExpired();
      expect((await server.db.selectFrom('imageTasks').select('resultFileIds').where('id', '=', id).executeTakeFirstOrThrow()).resultFileIds).toEqual([]);
      expect(await server.db.selectFrom('files').select('id').where('id', 'in', resultFileIds).execute()).toEqual([]);
      const swept = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
      expect(swept.data).toMatchObject({ status: 'completed', data: [] });
    }
  });
});

describe('the media sweeper', () => {
  const sweeperAt = (now: () => number = Date.now) =>
    new MediaSweeper({
      files: server.ctx.repositories.files,
      sweepers: new SweeperRepository(server.db),
      store: server.ctx.mediaStore,
      tx: createTransactor(server.db, server.ctx.log),
      log: server.ctx.log,
      now,
    });
  /** One run (after the workers' own sweeper, should it hold the lease right now). */
  const sweep = () => until(() => sweeperAt().run(), 10_000, 'the sweeper lease');

  it('runs on one instance at a time: a second sweeper finds the lease taken until the first releases it or its lease runs out', async () => {
    const sweepers = new SweeperRepository(server.db);
    await server.db.deleteFrom('sweepers').execute();
    expect(await sweepers.take('media', 'elsewhere', 60_000)).toEqual({ cursor: null });
    expect(await sweeperAt().run()).toBeUndefined();
    await server.db.updateTable('sweepers').set({ leaseUntil: new Date(Date.now() - 1) }).where('name', '=', 'media').execute();
    expect(await sweep()).toMatchObject({ expired: expect.any(Number) });
    const row = await server.db.selectFrom('sweepers').selectAll().where('name', '=', 'media').executeTakeFirstOrThrow();
    expect(row).toMatchObject({ owner: null, leaseUntil: null });
  });

  it('deletes objects no row names once they are an hour old, keeps younger ones and every object a row names', async () => {
    const store = server.ctx.mediaStore;
    const c = await createCustomer(server.db, { balance: 100 });
    const task = await finishedVideo(c.key);
    const { outputFileId } = await server.db.selectFrom('videoTasks').select('outputFileId').where('id', '=', task.id).executeTakeFirstOrThrow();
    const named = (await fileRow(outputFileId!))!.storageKey;
    await store.put('video_output/zz/file_zzOrphanOld', Buffer.from('left behind by a crash'), {});
    await store.put('video_output/zz/file_zzOrphanYoung', Buffer.from('a write in flight'), {});
    const hourAgo = new Date(Date.now() - 2 * 3600_000);
    await utimes(join(server.config.mediaDir, 'video_output/zz/file_zzOrphanOld'), hourAgo, hourAgo);
    await utimes(join(server.config.mediaDir, named), hourAgo, hourAgo);
    await server.db.deleteFrom('sweepers').execute();

    let orphans = 0;
    // A walk of several runs when the store holds more than a page.
    for (let i = 0; i < 5; i++) orphans += (await sweep()).orphans;
    expect(orphans).toBe(1);
    expect(await store.stat('video_output/zz/file_zzOrphanOld')).toBeUndefined();
    expect(await store.stat('video_output/zz/file_zzOrphanYoung')).toBeDefined();
    expect(await store.stat(named)).toBeDefined();
    expect(server.logs.some((l) => l.includes('removed stored media no file row names') && l.includes('file_zzOrphanOld'))).toBe(true);
    await store.delete('video_output/zz/file_zzOrphanYoung');
  });

  it('removes the rows of image outputs whose bytes never landed (10 minutes after they were written) and detaches them from their task', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const image = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a kite', n: 2, response_format: 'url' });
    expect(image.status).toBe(200);
    const id = await lastImageTask(c.accountId);
    const { resultFileIds } = await server.db.selectFrom('imageTasks').select('resultFileIds').where('id', '=', id).executeTakeFirstOrThrow();
    const [lost, landed] = resultFileIds as [string, string];
    const store = server.ctx.mediaStore;
    await store.delete((await fileRow(lost))!.storageKey);
    await server.db.updateTable('files').set({ createdAt: new Date(Date.now() - 20 * 60_000) }).where('id', 'in', resultFileIds).execute();
    await server.db.deleteFrom('sweepers').execute();

    expect((await sweep()).unlanded).toBe(1);
    expect(await fileRow(lost)).toBeUndefined();
    expect(await fileRow(landed)).toBeDefined();
    expect((await server.db.selectFrom('imageTasks').select('resultFileIds').where('id', '=', id).executeTakeFirstOrThrow()).resultFileIds).toEqual([landed]);
    // Checked once: the cursor moved past them.
    expect((await sweep()).unlanded).toBe(0);
  });
});

/**
 * A store failing, or holding what is not Mediagate's: the sweeper deletes only keys of its own
 * shape (another deployment's prefix, other data in a shared bucket or in MEDIA_DIR survive), a
 * file whose bytes cannot be deleted keeps its row without holding back the others, an object the
 * store cannot stat is not taken for missing, and one phase failing does not stop the others.
 */
describe('the media sweeper on a store it does not own alone, or that fails', () => {
  let own: TestServer;
  let s3: TestS3;
  beforeAll(async () => {
    own = await startTestServer();
    s3 = await startTestS3();
  });
  afterAll(async () => {
    await s3?.close();
    await own?.close();
  });

  /** One run with `store`, two hours from now (every object is old enough to be an orphan). */
  const runWith = async (store: MediaStore) => {
    await own.db.deleteFrom('sweepers').execute();
    const sweeper = new MediaSweeper({ files: own.ctx.repositories.files, sweepers: new SweeperRepository(own.db), store, tx: createTransactor(own.db, own.ctx.log), log: own.ctx.log, now: () => Date.now() + 2 * 3600_000 });
    return (await sweeper.run())!;
  };
  const insertFile = async (accountId: string, purpose: 'upload' | 'image_output', id: string, expiresAt: Date) => {
    const storageKey = `${purpose}/${id.slice(5, 7)}/${id}`;
    await own.ctx.repositories.files.insert({ id, accountId, purpose, contentType: 'image/png', bytes: 1, storageKey, width: 1, height: 1, taskId: null, expiresAt, filename: null });
    return storageKey;
  };

  it('in MEDIA_DIR, deletes orphans of its own key shape (temporary files and sendable copies too) and nothing else', async () => {
    const store = own.ctx.mediaStore;
    const ours = ['image_output/ab/file_abOrphan1', 'input/cd/file_cdSourcepngm3k2.0a1b2c3d', 'upload/ef/file_efHalfWritten.0123456789ab.tmp', 'video_output/gh/file_ghOld.mp4'];
    const foreign = ['photos/2026/holiday.jpg', 'backup.sql', 'image_output/ab/file_other', 'image_output/ab/file_ab_not_an_id', 'upload/ef/file_efX/notes.txt'];
    for (const key of [...ours, ...foreign]) await store.put(key, Buffer.from(key));
    expect((await runWith(store)).orphans).toBe(ours.length);
    for (const key of ours) expect(await store.stat(key)).toBeUndefined();
    for (const key of foreign) expect(await store.stat(key), key).toBeDefined();
  });

  it("on S3, a deployment under prefix 'prod' keeps the objects of 'prod2', and an empty prefix the other data of its bucket", async () => {
    const prod = s3.store('prod');
    const prod2 = s3.store('prod2');
    const bucket = s3.store('');
    await prod.put('image_output/ab/file_abOrphan', Buffer.from('left behind by a crash'));
    await prod2.put('image_output/ab/file_abTheirs', Buffer.from("another deployment's output"));
    await bucket.put('backups/db.dump', Buffer.from('not media at all'));
    // `prod` lists `prod2image_output/…` as `2image_output/…`: not a key of its shape.
    expect((await prod.list(undefined, 1000)).map((o) => o.key)).toContain('2image_output/ab/file_abTheirs');
    expect((await runWith(prod)).orphans).toBe(1);
    expect(await prod.stat('image_output/ab/file_abOrphan')).toBeUndefined();
    expect(await prod2.stat('image_output/ab/file_abTheirs')).toBeDefined();

    await bucket.put('image_output/cd/file_cdOrphan', Buffer.from('left behind by a crash'));
    expect((await runWith(bucket)).orphans).toBe(1);
    expect(await bucket.stat('image_output/cd/file_cdOrphan')).toBeUndefined();
    expect(await bucket.stat('backups/db.dump')).toBeDefined();
    expect(await prod2.stat('image_output/ab/file_abTheirs')).toBeDefined();
  });

  it('keeps the row of an expired file whose bytes the store refuses to delete, unchanged, and still expires the others and sweeps orphans', async () => {
    const c = await createCustomer(own.db, { balance: 100 });
    const store = own.ctx.mediaStore;
    const expired = new Date(Date.now() - 10_000);
    // The undeletable one expired first: it is the first of every batch.
    const locked = await insertFile(c.accountId, 'upload', 'file_loLocked', expired);
    const other = await insertFile(c.accountId, 'upload', 'file_otOther', new Date(Date.now() - 5_000));
    for (const key of [locked, other, 'image_output/or/file_orOrphan']) await store.put(key, Buffer.from('x'));
    const refusing: MediaStore = Object.assign(Object.create(store) as MediaStore, {
      delete: async (key: string) => {
        if (key === locked) throw new StorageUnavailable(key, Object.assign(new Error('EACCES: permission denied, unlink'), { code: 'EACCES', syscall: 'unlink' }));
        return store.delete(key);
      },
    });
    expect(await runWith(refusing)).toMatchObject({ expired: 1, orphans: 1 });
    expect(await own.ctx.repositories.files.find('file_otOther')).toBeUndefined();
    expect(await store.stat(other)).toBeUndefined();
    expect(await store.stat('image_output/or/file_orOrphan')).toBeUndefined();
    // Kept as it was (not shown again as unexpired), and tried again at the next run.
    expect((await own.ctx.repositories.files.find('file_loLocked'))?.expiresAt).toEqual(expired);
    expect(own.logs.some((l) => l.includes('could not delete the bytes of expired files') && l.includes('file_loLocked') && l.includes('EACCES'))).toBe(true);
    expect((await runWith(refusing)).expired).toBe(0);
    expect(await own.ctx.repositories.files.find('file_loLocked')).toBeDefined();
    // Once the store lets it go, it goes.
    expect((await runWith(store)).expired).toBe(1);
    expect(await own.ctx.repositories.files.find('file_loLocked')).toBeUndefined();
  });

  it('a store failing as a whole ends the orphan phase at its first delete, and the next run walks the same page again', async () => {
    const store = own.ctx.mediaStore;
    const orphans = ['image_output/da/file_daOrphan1', 'image_output/db/file_dbOrphan2', 'image_output/dc/file_dcOrphan3'];
    for (const key of orphans) await store.put(key, Buffer.from(key));
    let deletes = 0;
    const down: MediaStore = Object.assign(Object.create(store) as MediaStore, {
      delete: async (key: string) => {
        deletes++;
        throw new StorageUnavailable(key, Object.assign(new Error('connect ECONNREFUSED 10.0.0.9:9000'), { code: 'ECONNREFUSED', syscall: 'connect' }));
      },
    });
    expect((await runWith(down)).orphans).toBe(0);
    expect(deletes).toBe(1);
    expect(own.logs.some((l) => l.includes('media sweep phase failed') && l.includes('"phase":"orphans"') && l.includes('ECONNREFUSED'))).toBe(true);
    for (const key of orphans) expect(await store.stat(key), key).toBeDefined();
    expect((await runWith(store)).orphans).toBe(orphans.length);
    for (const key of orphans) expect(await store.stat(key), key).toBeUndefined();
  });

  it('does not take an output the store cannot stat (an I/O error) for missing: its row stays, its download answers 503, the other phases run', async () => {
    const c = await createCustomer(own.db, { balance: 100 });
    const store = own.ctx.mediaStore;
    const key = await insertFile(c.accountId, 'image_output', 'file_ioUnreadable', new Date(Date.now() + 86_400_000));
    await own.db.updateTable('files').set({ createdAt: new Date(Date.now() - 20 * 60_000) }).where('id', '=', 'file_ioUnreadable').execute();
    // A path the filesystem cannot resolve (ELOOP): stat fails with an error other than "no such file".
    const path = store.localPath!(key);
    await mkdir(dirname(path), { recursive: true });
    await symlink(path, path);
    await expect(store.stat(key)).rejects.toBeInstanceOf(StorageUnavailable);
    const download = await fetch(`${own.directUrl}/v1/files/file_ioUnreadable/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect([download.status, ((await download.json()) as { error: { code: string } }).error.code, download.headers.get('retry-after')]).toEqual([503, 'storage_unavailable', '30']);

    await store.put('image_output/or/file_orOrphan2', Buffer.from('x'));
    await insertFile(c.accountId, 'upload', 'file_exExpired', new Date(Date.now() - 1000));
    expect(await runWith(store)).toMatchObject({ expired: 1, unlanded: 0, orphans: 1 });
    expect(await own.ctx.repositories.files.find('file_ioUnreadable')).toBeDefined();
    expect(own.logs.some((l) => l.includes('media sweep phase failed') && l.includes('unlanded') && l.includes('ELOOP'))).toBe(true);
  });
});
