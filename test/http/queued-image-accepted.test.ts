/**
 * A queued image job (fal here; Replicate and Kling share the runner's rule) that the upstream ran
 * and billed is never run a second time: not on the spare member (a job that completed without an
 * image), not by a background task's next try (an output that does not decode: the job is done, and
 * collecting it again cannot help). The request fails and its hold is released instead.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { FalImageProvider } from '../../server/providers/fal/fal-image.provider.ts';
import { ImageTaskRepository } from '../../server/repositories/image-task.repository.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let fal: FalFake;
beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret', 'fal-b:secret'], queueMs: 20, jobDurationMs: 50 });
  server = await startTestServer({ workers: true, overrides: { providers: { fal: { image: new FalImageProvider(30, 5000) } } } });
  expect((await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition('fal/flux-dev-fal')!.model })).response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fal?.close();
});

/** A key whose group has two fal members: `top` (tried first) and `spare`. */
async function customer(): Promise<string> {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  for (const [i, key] of ['fal-a:secret', 'fal-b:secret'].entries()) {
    const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: i === 0 ? 'top' : 'spare', provider: 'fal', priority: i === 0 ? 10 : 0, base_url: fal.url, credentials: { api_key: key }, models: ['flux-dev-fal'] },
    });
    expect(response.status).toBe(201);
  }
  return (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
}

const notAnImage = 'data:image/png;base64,' + Buffer.from('these bytes are no image at all').toString('base64');
/** The fal keys the jobs of a prompt were submitted with, in order. */
const jobsFor = (word: string) => [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes(word)).map((j) => j.apiKey);

/** A background (respond-async) image task of `prompt`, once it has ended: its id and row. */
async function backgroundTask(key: string, prompt: string) {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
    body: JSON.stringify({ model: 'flux-dev-fal', prompt, size: '1024x1024' }),
  });
  expect(res.status).toBe(202);
  const id = res.headers.get('x-task-id')!;
  const row = await until(async () => {
    const r = await server.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    return r.status !== 'processing' && r.status !== 'queued' && r;
  }, 30_000, 'the task to end');
  return { id, row };
}

describe('a queued image job the upstream ran', () => {
  it('is not submitted again by a background task when its output does not decode: failed, released', async () => {
    const key = await customer();
    fal.faults.push('result', { status: 200, body: { images: [{ url: notAnImage, width: 1024, height: 1024, content_type: 'image/png' }], seed: 1 } }, 10);
    try {
      const { id, row } = await backgroundTask(key, 'undecodable output');
      expect([row.status, row.errorCode, row.retries]).toEqual(['failed', 'upstream_error', 0]);
      expect(jobsFor('undecodable output')).toEqual(['fal-a:secret']);
      const ledger = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
      expect(ledger.map((e) => e.kind).sort()).toEqual(['hold', 'release']);
    } finally {
      fal.faults.clear();
    }
  });

  it('is not submitted again by a background task when the job it accepted could not be recorded: failed, released', async () => {
    const key = await customer();
    const record = ImageTaskRepository.prototype.recordUpstreamJob;
    ImageTaskRepository.prototype.recordUpstreamJob = () => Promise.reject(new Error('the database went away'));
    try {
      const { row } = await backgroundTask(key, 'unrecorded job');
      expect([row.status, row.retries]).toEqual(['failed', 0]);
      expect(jobsFor('unrecorded job')).toEqual(['fal-a:secret']);
    } finally {
      ImageTaskRepository.prototype.recordUpstreamJob = record;
    }
  });

  it('is not moved to the spare member when it completed without an image: 502, nothing charged', async () => {
    const key = await customer();
    fal.faults.push('result', { status: 200, body: { images: [], seed: 1 } }, 1);
    try {
      const res = await fetch(`${server.directUrl}/v1/images/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: 'flux-dev-fal', prompt: 'empty result', size: '1024x1024' }),
      });
      const body = (await res.json()) as { error?: { code: string } };
      expect([res.status, body.error?.code], JSON.stringify(jobsFor('empty result'))).toEqual([502, 'upstream_error']);
      expect(jobsFor('empty result')).toEqual(['fal-a:secret']);
    } finally {
      fal.faults.clear();
    }
  });
});
