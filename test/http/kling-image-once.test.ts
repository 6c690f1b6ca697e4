/**
 * One image request, one paid Kling task (the Kling image adapter against test/fakes/kling.ts).
 * Kling has no cancel: a task it accepted runs and is billed, so whatever goes wrong once it may
 * exist must never lead to a second task, neither on another member (a synchronous request failing
 * over) nor on a later attempt (a background task retried). Through the public API: a status call
 * whose connection drops, a status word Kling does not document, a submit answered only after the
 * adapter stopped waiting (looked up by its external_task_id, the gateway's task id, on the same
 * member), a submit Kling carries out only after it was first looked up (looked up again until the
 * grace since it was sent is over), a submit Kling never carried out (safe to fail over once that
 * grace is over, and it does), and a finished task whose images the CDN fails to serve (not run
 * again elsewhere). Then the adapter's own errors once the task exists: thrown as maybe accepted,
 * and as kept for a later try to collect, and a resubmit of a task Kling has: continued with it, or,
 * its links gone, replaced by a task under the next external id. A create Kling refuses that no
 * lookup finds a task for (the lookup refused or failing too) stays the client's refusal, at once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import { KlingTokens } from '../../server/providers/kling/kling-auth.ts';
import { klingCall } from '../../server/providers/kling/kling-api.ts';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import type { ImageEvents, ImageJob, UpstreamAccount } from '../../server/providers/types.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { imageParams } from '../support/image-params.ts';
import { holdOf, until } from '../support/tasks.ts';

/** How long one call to Kling may take here (the adapter's default is the gateway's 60 s). */
const CALL_TIMEOUT_MS = 1_000;
/** How long after a submit Kling's "no such task" is believed here (the adapter's default: the call timeout + 30 s). */
const LOOKUP_GRACE_MS = CALL_TIMEOUT_MS * 3;

let server: TestServer;
let fake: KlingFake;
let seq = 0;

beforeAll(async () => {
  fake = await startKlingFake({
    accounts: [
      { accessKey: 'ak-a', secretKey: 'sk-a-secret' },
      { accessKey: 'ak-b', secretKey: 'sk-b-secret' },
    ],
    jobDurationMs: 300,
    durationFor: (p) => (p.includes('[never]') ? 'never' : undefined),
  });
  const tokens = new KlingTokens();
  server = await startTestServer({
    workers: true,
    overrides: { providers: { kling: { image: new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS, lookupGraceMs: LOOKUP_GRACE_MS, tokens }) } } },
  });
  const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition('kling/kling-v2-1')!.model });
  expect(response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

/** A customer whose group has member `a` (ak-a, first by priority) and, with `two`, member `b` (ak-b). */
async function customer(two: boolean) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const members = [['a', 'ak-a', 'sk-a-secret', 10], ...(two ? [['b', 'ak-b', 'sk-b-secret', 0] as const] : [])] as const;
  for (const [name, ak, sk, priority] of members) {
    const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name, provider: 'kling', base_url: fake.url, credentials: { access_key: ak, secret_key: sk }, models: ['kling-v2-1'], priority },
    });
    expect(response.status).toBe(201);
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return key.key;
}

const prompt = (what: string) => `${what} #${Date.now()}-${++seq}`;

async function generate(key: string, text: string, background = false) {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...(background && { Prefer: 'respond-async' }) },
    body: JSON.stringify({ model: 'kling-v2-1', prompt: text }),
  });
  return { status: res.status, taskId: res.headers.get('x-task-id')!, body: (await res.json()) as Record<string, any> };
}

/** Lookups of an external id, in either form Kling may take it (`?external_task_id=`, or in the path). */
const lookupsOf = (external: string, requests = fake.requests) =>
  requests.filter((r) => r.method === 'GET' && (r.query.get('external_task_id') === external || r.path === `/v1/images/generations/${external}`));

/** The Kling tasks created for a prompt: which account each is on. */
const tasksOf = (text: string) => [...fake.tasks.values()].filter((t) => t.prompt === text);

const rowOf = (id: string) => server.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

describe('a synchronous Kling image request with two members', () => {
  it('a status call whose connection drops is asked again: one Kling task, delivered and charged once', async () => {
    const key = await customer(true);
    const text = prompt('a dropped status call');
    fake.faults.push('image-poll', { destroy: true });
    const res = await generate(key, text);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(tasksOf(text).map((t) => t.accessKey)).toEqual(['ak-a']);
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'captured' });
  });

  it('a status word Kling does not document is asked again, never guessed: one Kling task', async () => {
    const key = await customer(true);
    const text = prompt('an unknown status word');
    fake.faults.push('image-poll', { status: 200, body: { code: 0, message: 'SUCCEED', request_id: 'r-1', data: { task_id: 'whatever', task_status: 'queueing' } } });
    const res = await generate(key, text);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(tasksOf(text).map((t) => t.accessKey)).toEqual(['ak-a']);
  });

  it('a submit answered only after the adapter stopped waiting is found by its external_task_id on the same member: no failover, one Kling task', async () => {
    const key = await customer(true);
    const text = prompt('a slow submit');
    const since = fake.requests.length;
    // Kling creates the task at once and answers long after the call's timeout.
    fake.delayAnswerNext('image-submit', CALL_TIMEOUT_MS * 3);
    const res = await generate(key, text);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const tasks = tasksOf(text);
    expect(tasks.map((t) => t.accessKey)).toEqual(['ak-a']);
    // Sent with the gateway's task id as its external id, and looked up by it (the query takes it instead of the task id).
    const external = tasks[0]!.externalTaskId!;
    expect(external).toBe(res.taskId);
    expect(lookupsOf(external).length).toBeGreaterThan(0);
    // Member b was never asked for anything.
    expect(new Set(fake.requests.slice(since).map((r) => keyOf(r.headers.authorization)))).toEqual(new Set(['ak-a']));
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'captured' });
  });

  it('a submit Kling carries out only after the adapter first looked for it is found by a later lookup: no failover, one Kling task', async () => {
    const key = await customer(true);
    const text = prompt('a create still under way');
    const since = fake.requests.length;
    // Kling is still at work on the create when the call times out (and is first looked up), and
    // never answers it; the task shows up a second later.
    fake.createLateNext('image-submit', CALL_TIMEOUT_MS * 2);
    const res = await generate(key, text);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const tasks = tasksOf(text);
    expect(tasks.map((t) => t.accessKey)).toEqual(['ak-a']);
    const sent = fake.requests.slice(since).find((r) => r.method === 'POST')!;
    const lookups = lookupsOf(res.taskId, fake.requests.slice(since));
    // Looked up before the task existed, and again after.
    expect(lookups[0]!.receivedAt).toBeLessThan(tasks[0]!.createdAt);
    expect(lookups.at(-1)!.receivedAt).toBeGreaterThanOrEqual(tasks[0]!.createdAt);
    expect(lookups.at(-1)!.receivedAt - sent.receivedAt).toBeLessThan(LOOKUP_GRACE_MS);
    expect(new Set(fake.requests.slice(since).map((r) => keyOf(r.headers.authorization)))).toEqual(new Set(['ak-a']));
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'captured' });
  });

  it('a submit that timed out and that Kling never carried out (no task once the grace is over) fails over: one Kling task, on the second member', async () => {
    const key = await customer(true);
    const text = prompt('a lost submit');
    // The connection is held past the timeout and then dropped; nothing is created.
    fake.faults.push('image-submit', { delayMs: CALL_TIMEOUT_MS * 2, destroy: true });
    const res = await generate(key, text);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(tasksOf(text).map((t) => t.accessKey)).toEqual(['ak-b']);
  });

  it('a create Kling refuses as invalid whose duplicate lookup is refused too is the client\'s 400, not an upstream failure', async () => {
    const key = await customer(true);
    const text = prompt('an invalid request');
    fake.errorNext('image-submit', 1201);
    // Both forms of the lookup refused.
    fake.errorNext('image-poll', 1200);
    fake.errorNext('image-poll', 1200);
    const res = await generate(key, text);
    expect([res.status, res.body.error?.code], JSON.stringify(res.body)).toEqual([400, 'upstream_rejected']);
    expect(tasksOf(text)).toEqual([]);
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('a finished task whose images the CDN fails to serve is not run again on the other member: one Kling task, nothing charged', async () => {
    const key = await customer(true);
    const text = prompt('a CDN that keeps failing');
    // Every download attempt of the one image (three) meets a 503.
    fake.serverErrorNext('cdn', 503, 3);
    const res = await generate(key, text);
    expect([res.status, res.body.error?.code]).toEqual([502, 'upstream_error']);
    expect(tasksOf(text).map((t) => t.accessKey)).toEqual(['ak-a']);
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'released', captured: 0 });
  });
});

describe('a background Kling image task', () => {
  it('a dropped status call does not make a later attempt submit a second Kling task', async () => {
    const key = await customer(false);
    const text = prompt('a dropped background status call');
    fake.faults.push('image-poll', { destroy: true });
    const res = await generate(key, text, true);
    expect(res.status).toBe(202);
    const row = await until(async () => {
      const r = await rowOf(res.taskId);
      return r.status !== 'processing' && r;
    }, 20_000, 'the task to finish');
    const tasks = tasksOf(text);
    expect(tasks).toHaveLength(1);
    expect(row).toMatchObject({ status: 'completed', upstreamJob: tasks[0]!.taskId });
  });

  it('a submit answered late is found and recorded for a later attempt, as an answered one is', async () => {
    const key = await customer(false);
    const text = prompt('a slow background submit');
    fake.delayAnswerNext('image-submit', CALL_TIMEOUT_MS * 3);
    const res = await generate(key, text, true);
    expect(res.status).toBe(202);
    const row = await until(async () => {
      const r = await rowOf(res.taskId);
      return r.status !== 'processing' && r;
    }, 20_000, 'the task to finish');
    const tasks = tasksOf(text);
    expect(tasks).toHaveLength(1);
    expect(row).toMatchObject({ status: 'completed', upstreamJob: tasks[0]!.taskId });
  });
});

describe('the fake, after image-generation.md', () => {
  it('keeps an image create\'s external_task_id unique per account and answers the single-task query by it (as a query parameter; the path takes the task id)', async () => {
    const tokens = new KlingTokens();
    const as = (ak: string): UpstreamAccount => ({ memberId: `mem_${ak}`, provider: 'kling', baseUrl: fake.url, credentials: { access_key: ak, secret_key: `sk-${ak.slice(3)}-secret` }, modelMap: {} });
    const signal = new AbortController().signal;
    const create = (ak: string, external: string) => {
      const text = JSON.stringify({ model_name: 'kling-v2-1', prompt: 'a fake check', external_task_id: external });
      return klingCall<Record<string, any>>(tokens, as(ak), { method: 'POST', path: '/v1/images/generations', body: () => ({ body: text, length: Buffer.byteLength(text) }) }, signal, 'image generation');
    };
    const query = (ak: string, id: string) => klingCall<Record<string, any>>(tokens, as(ak), { method: 'GET', path: `/v1/images/generations/${id}` }, signal, 'image status');
    const byExternalId = (ak: string, id: string) => klingCall<Record<string, any>>(tokens, as(ak), { method: 'GET', path: `/v1/images/generations?external_task_id=${id}` }, signal, 'image lookup');
    const external = `ext-${Date.now()}-${++seq}`;
    const first = await create('ak-a', external);
    expect([first.status, first.body?.code, first.body?.data?.task_info]).toEqual([200, 0, { external_task_id: external }]);
    const byExternal = await byExternalId('ak-a', external);
    expect([byExternal.body?.code, byExternal.body?.data?.task_id, byExternal.body?.data?.task_info]).toEqual([0, first.body!.data!.task_id, { external_task_id: external }]);
    expect((await query('ak-a', first.body!.data!.task_id)).body?.data?.task_info).toEqual({ external_task_id: external });
    expect([(await query('ak-a', external)).status, (await query('ak-a', external)).body?.code]).toEqual([404, 1203]);
    const again = await create('ak-a', external);
    expect([again.status, again.body?.code]).toEqual([400, 1201]);
    // Another account's tasks are its own: the id is free there, and the first account's task unknown.
    expect([(await byExternalId('ak-b', external)).status, (await byExternalId('ak-b', external)).body?.code]).toEqual([404, 1203]);
    expect((await create('ak-b', external)).body?.code).toBe(0);
  });
});

describe('the adapter, once the task may exist', () => {
  const account = (): UpstreamAccount => ({ memberId: 'mem_kling_once', provider: 'kling', baseUrl: fake.url, credentials: { access_key: 'ak-a', secret_key: 'sk-a-secret' }, modelMap: {} });
  const job = (text: string): ImageJob => ({ operation: 'generation', model: 'kling-v2-1', prompt: text, n: 1, params: imageParams(), inputs: [] });
  const events = (): ImageEvents & { refs: unknown[] } => {
    const refs: unknown[] = [];
    return { refs, partial: async () => undefined, image: async () => undefined, submitted: async (ref) => void refs.push(ref) };
  };
  const failureOf = (p: Promise<unknown>) =>
    p.then(
      () => expect.unreachable('the call succeeded'),
      (err: unknown) => {
        expect(err).toBeInstanceOf(ProviderError);
        return err as ProviderError;
      },
    );

  it('the deadline of a task that does not finish is thrown as maybe accepted, the task kept for a later try', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, timeoutMs: 500, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a task that never ends [never]');
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, events()));
    expect([err.kind, err.maybeAccepted, err.jobKept]).toEqual(['retryable', true, true]);
    expect(tasksOf(text)).toHaveLength(1);
  });

  it('a finished task whose image the CDN fails to serve three times is kept for a later try; one whose link is gone is not', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a finished task, its CDN failing');
    fake.serverErrorNext('cdn', 503, 3);
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, events()));
    expect([err.kind, err.upstreamStatus, err.jobKept]).toEqual(['retryable', 503, true]);
    // Collected by the next try as it is (ImageJob.resume): no second task.
    const [task] = tasksOf(text);
    const images: Buffer[] = [];
    await provider.generate(account(), { ...job(text), resume: task!.taskId }, new AbortController().signal, { ...events(), image: async (_i, img) => void images.push(img.image) });
    expect([images.length, tasksOf(text).length]).toEqual([1, 1]);

    fake.expire(task!.taskId);
    const gone = await failureOf(provider.generate(account(), { ...job(text), resume: task!.taskId }, new AbortController().signal, events()));
    expect([gone.kind, gone.upstreamStatus, gone.jobKept]).toEqual(['failed', 403, false]);
  });

  it('a task that failed, or that Kling no longer knows, is not kept', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const failed = await failureOf(provider.generate(account(), job(prompt('a task that fails kling-fail')), new AbortController().signal, events()));
    expect([failed.kind, failed.jobKept]).toEqual(['failed', false]);
    fake.errorNext('image-poll', 1203);
    const forgotten = await failureOf(provider.generate(account(), job(prompt('a task Kling forgets')), new AbortController().signal, events()));
    expect([forgotten.kind, forgotten.jobKept]).toEqual(['failed', false]);
  });

  it('submits with the job\'s task id as external_task_id; a resubmit Kling refuses as a duplicate continues with the task it has: one Kling task', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a task submitted twice');
    const taskId = `img_once_${Date.now()}_${++seq}`;
    const first = events();
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, first);
    const tasks = tasksOf(text);
    expect(tasks.map((t) => t.externalTaskId)).toEqual([taskId]);
    // A later try of the same task (its first one stopped before recording the task) submits again.
    const since = fake.requests.length;
    const again = events();
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, again);
    expect(tasksOf(text)).toHaveLength(1);
    expect([first.refs, again.refs]).toEqual([[tasks[0]!.taskId], [tasks[0]!.taskId]]);
    const lookup = fake.requests.slice(since).filter((r) => r.method === 'GET')[0]!;
    expect([lookup.path, lookup.query.get('external_task_id')]).toEqual(['/v1/images/generations', taskId]);
  });

  it('a refusal of a submit whose external_task_id Kling has no task for stands, blamed on the request', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a refused submit');
    fake.errorNext('image-submit', 1201);
    const seen = events();
    const err = await failureOf(provider.generate(account(), { ...job(text), taskId: `img_refused_${Date.now()}_${++seq}` }, new AbortController().signal, seen));
    expect([err.kind, err.maybeAccepted, err.upstreamCode]).toEqual(['invalid_request', false, '1201']);
    expect([tasksOf(text), seen.refs]).toEqual([[], []]);
  });

  it('a refused submit whose lookup is refused (1200) stands as the client\'s: invalid_request with Kling\'s code, not maybe accepted', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a refused submit, its lookup refused');
    fake.errorNext('image-submit', 1201);
    // Both forms of the lookup refused.
    fake.errorNext('image-poll', 1200);
    fake.errorNext('image-poll', 1200);
    const seen = events();
    const err = await failureOf(provider.generate(account(), { ...job(text), taskId: `img_refused_${Date.now()}_${++seq}` }, new AbortController().signal, seen));
    expect([err.kind, err.maybeAccepted, err.upstreamCode]).toEqual(['invalid_request', false, '1201']);
    expect([tasksOf(text), seen.refs]).toEqual([[], []]);
  });

  it('a refused submit whose lookups are rate-limited stands as the client\'s at once, not after waiting for the deadline', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, timeoutMs: 20_000, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a refused submit, its lookups rate-limited');
    const since = fake.requests.length;
    fake.errorNext('image-submit', 1201);
    fake.rateLimitNext('image-poll', 0, { times: 1000, retryAfter: false });
    const started = Date.now();
    try {
      const err = await failureOf(provider.generate(account(), { ...job(text), taskId: `img_refused_${Date.now()}_${++seq}` }, new AbortController().signal, events()));
      expect([err.kind, err.maybeAccepted, err.upstreamCode]).toEqual(['invalid_request', false, '1201']);
      expect(Date.now() - started).toBeLessThan(2_000);
      // One lookup, and one more after it failed in passing.
      expect(fake.requests.slice(since).filter((r) => r.method === 'GET')).toHaveLength(2);
    } finally {
      fake.faults.clear();
    }
  });

  it('a resubmit whose first lookup fails in passing finds the task it has on the second: one Kling task', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a task submitted twice, its lookup rate-limited');
    const taskId = `img_once_${Date.now()}_${++seq}`;
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, events());
    fake.rateLimitNext('image-poll', 0);
    const again = events();
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, again);
    expect(tasksOf(text)).toHaveLength(1);
    expect(again.refs).toEqual([tasksOf(text)[0]!.taskId]);
  });

  it('a resubmit whose earlier task\'s links are gone makes a new task under the next external id; a later resubmit collects that one', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a task whose links expired');
    const taskId = `img_gone_${Date.now()}_${++seq}`;
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, events());
    const [old] = tasksOf(text);
    // Its links expired: a resumed try gave it up, and the runner forgot it.
    fake.expire(old!.taskId);
    const images: Buffer[] = [];
    const again = events();
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, { ...again, image: async (_i, img) => void images.push(img.image) });
    const tasks = tasksOf(text);
    expect(tasks.map((t) => t.externalTaskId)).toEqual([taskId, `${taskId}-2`]);
    expect([images.length, again.refs]).toEqual([1, [old!.taskId, tasks[1]!.taskId]]);

    // A try that stopped before recording the new task: the gone one again, then the new one, collected.
    const third = events();
    await provider.generate(account(), { ...job(text), taskId }, new AbortController().signal, third);
    expect(tasksOf(text)).toHaveLength(2);
    expect(third.refs).toEqual([old!.taskId, tasks[1]!.taskId]);
  });

  it('a task this call created whose links are gone is not replaced: one Kling task', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a new task whose links are gone');
    const seen = events();
    const err = await failureOf(
      provider.generate(account(), { ...job(text), taskId: `img_gone_${Date.now()}_${++seq}` }, new AbortController().signal, {
        ...seen,
        submitted: async (ref) => {
          seen.refs.push(ref);
          fake.expire(String(ref));
        },
      }),
    );
    expect([err.kind, err.upstreamStatus]).toEqual(['failed', 403]);
    expect(tasksOf(text)).toHaveLength(1);
  });

  it('a status call refused for good (not "no such task") is thrown as maybe accepted, blaming no client', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a refused status call');
    fake.errorNext('image-poll', 1200);
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, events()));
    expect([err.kind, err.maybeAccepted, err.upstreamCode]).toEqual(['retryable', true, '1200']);
  });

  it('a task Kling says it does not know (1203) fails as gone, not as the member\'s misconfiguration to fail over from', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const text = prompt('a task Kling forgot');
    fake.errorNext('image-poll', 1203);
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, events()));
    expect([err.kind, err.maybeAccepted, err.upstreamStatus, err.upstreamCode]).toEqual(['failed', false, 404, '1203']);
  });

  it('a submit without an answer that Kling has no task for is thrown as not accepted (safe elsewhere) only after lookups over the grace since it was sent', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS, lookupGraceMs: LOOKUP_GRACE_MS });
    const text = prompt('a submit Kling never carried out');
    const since = fake.requests.length;
    fake.faults.push('image-submit', { delayMs: CALL_TIMEOUT_MS * 2, destroy: true });
    const seen = events();
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, seen));
    expect([err.kind, err.maybeAccepted]).toEqual(['retryable', false]);
    const sent = fake.requests.slice(since).find((r) => r.method === 'POST')!;
    const external = (sent.json as { external_task_id: string }).external_task_id;
    const lookups = fake.requests.slice(since).filter((r) => r.method === 'GET');
    expect(lookupsOf(external, lookups)).toEqual(lookups);
    // Asked again, more and more slowly, the last time once the grace was over.
    expect(lookups.length).toBeGreaterThanOrEqual(3);
    expect(lookups.at(-1)!.receivedAt - sent.receivedAt).toBeGreaterThanOrEqual(LOOKUP_GRACE_MS - 50);
    expect(tasksOf(text)).toEqual([]);
    expect(seen.refs).toEqual([]);
  });

  it('a submit whose task has not shown up when the deadline comes, within the grace, is thrown as maybe accepted', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, timeoutMs: CALL_TIMEOUT_MS * 2, callTimeoutMs: CALL_TIMEOUT_MS, lookupGraceMs: CALL_TIMEOUT_MS * 10 });
    const text = prompt('a submit still unknown at the deadline');
    fake.faults.push('image-submit', { delayMs: CALL_TIMEOUT_MS * 2, destroy: true });
    const err = await failureOf(provider.generate(account(), job(text), new AbortController().signal, events()));
    expect([err.kind, err.maybeAccepted]).toEqual(['retryable', true]);
  });

  it('a lookup after a late submit that is refused for good is thrown as maybe accepted; one asked again in passing finds the task', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 50, callTimeoutMs: CALL_TIMEOUT_MS });
    const refused = prompt('a late submit, its lookup refused');
    fake.delayAnswerNext('image-submit', CALL_TIMEOUT_MS * 3);
    // Both forms of the lookup refused.
    fake.errorNext('image-poll', 1200);
    fake.errorNext('image-poll', 1200);
    const err = await failureOf(provider.generate(account(), job(refused), new AbortController().signal, events()));
    expect([err.kind, err.maybeAccepted]).toEqual(['retryable', true]);
    expect(tasksOf(refused)).toHaveLength(1);

    const text = prompt('a late submit, its lookup rate-limited');
    fake.delayAnswerNext('image-submit', CALL_TIMEOUT_MS * 3);
    fake.rateLimitNext('image-poll', 0);
    const seen = events();
    await provider.generate(account(), job(text), new AbortController().signal, seen);
    expect(tasksOf(text)).toHaveLength(1);
    expect(seen.refs).toEqual([tasksOf(text)[0]!.taskId]);
  });
});

/** The access key (the JWT's `iss`) a request was signed for. */
function keyOf(authorization: string | string[] | undefined): string {
  return JSON.parse(Buffer.from(String(authorization).split('.')[1]!, 'base64url').toString()).iss as string;
}
