/**
 * What an operator asks of a running gateway (issue 32, items 2-4), through the admin API:
 * listings of every task, ledger entry and webhook delivery (keyset pages stable under inserts,
 * every filter, 400 invalid_cursor), a task's whole story (quote, hold, ledger, upstream attempts
 * with sanitized errors, webhook), usage reports against hand-computed totals (JSON and CSV), the
 * task sweeper with no engine running, and the operator gauges of /metrics.
 * Calls go through `admin()` (Prism in the contract lane) except deliberately invalid ones.
 */
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import { createWorkers } from '../../server/workers/index.ts';
import { TaskSweeper } from '../../server/services/tasks/task-sweeper.ts';
import { TaskSweepRepository } from '../../server/repositories/task-sweep.repository.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { createLogger } from '../../server/logger.ts';
import { createCustomer, createMember, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

type Json = Record<string, any>;

/**
 * The local member's video upstream, scripted by prompt: `fail` is accepted and then reported
 * failed with a reason; `crash` breaks inside the adapter (a plain error carrying a secret and a
 * URL, which must never reach the story); anything else completes at its first poll.
 */
const overloadedOnce = new Set<string>();
const scriptedVideo: VideoProvider = {
  pollIntervalMs: 0,
  async submit(_account, job) {
    if (job.prompt === 'crash') throw new Error('token sk-live-SECRET rejected by https://internal.example/upstream');
    if (job.prompt === 'overloaded once' && !overloadedOnce.has(job.taskId)) {
      overloadedOnce.add(job.taskId);
      throw new ProviderError('retryable', 'The upstream is overloaded', { upstreamStatus: 503 });
    }
    return `job-${job.taskId}`;
  },
  async poll(_account, _jobId, job) {
    if (job.prompt === 'fail') return { state: 'failed', error: new ProviderError('policy', 'The upstream refused the prompt') };
    return { state: 'succeeded', output: {} };
  },
  async download() {
    const bytes = Buffer.from('not really an mp4, but bytes');
    return { stream: Readable.from([bytes]), contentType: 'video/mp4', bytes: bytes.length };
  },
};

// Arrays as the contract writes them (`status=queued,failed`).
const querySerializer = { array: { style: 'form', explode: false } } as const;

let server: TestServer;

async function postJson(key: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
}

async function createVideo(key: string, extra: Json = {}): Promise<string> {
  const res = await postJson(key, '/v1/videos/generations', { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...extra });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return res.body.id as string;
}

async function createImage(key: string, extra: Json = {}, headers: Record<string, string> = {}): Promise<string> {
  const res = await postJson(key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a harbour', response_format: 'url', ...extra }, headers);
  expect([200, 202]).toContain(res.status);
  return (res.taskId ?? res.body.id) as string;
}

async function admin(path: string, query: Json = {}) {
  // Any admin path (typed calls are used where a test reads a field).
  const get = server.admin().GET as unknown as (path: string, init: unknown) => Promise<{ response: Response; data?: Json; error?: Json }>;
  const res = await get(path, { params: { query }, querySerializer });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
}

const ids = (body: Json) => (body.data as Json[]).map((t) => (t.id ?? t.webhook_id) as string);
const status = async (id: string) =>
  (await server.db.selectFrom(id.startsWith('vid_') ? 'videoTasks' : 'imageTasks').select('status').where('id', '=', id).executeTakeFirstOrThrow()).status;

/** Runs the task engines until `done` holds. */
async function runWorkersUntil(done: () => Promise<boolean>): Promise<void> {
  const workers = createWorkers(server.ctx);
  workers.start();
  try {
    await until(async () => (await done()) || undefined, 30_000, 'the tasks to finish');
  } finally {
    await workers.stop();
  }
}

/** Every item of a listing, page by page (`between` runs after each page but the last). */
async function collect(path: string, query: Json, between: () => Promise<void> = async () => {}): Promise<string[]> {
  const seen: string[] = [];
  let cursor: string | undefined;
  for (;;) {
    const res = await admin(path, { ...query, ...(cursor && { cursor }) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    seen.push(...ids(res.body));
    if (res.body.next_cursor === null) return seen;
    cursor = res.body.next_cursor;
    await between();
  }
}

beforeAll(async () => {
  // No workers: tasks stay queued (or processing) until a test runs the engines.
  server = await startTestServer({ env: { ALLOW_PRIVATE_TARGETS: '1' }, overrides: { providers: { local: { video: scriptedVideo } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

describe('GET /admin/v1/tasks', () => {
  let a: Awaited<ReturnType<typeof createCustomer>>;
  let b: Awaited<ReturnType<typeof createCustomer>>;
  const t: Record<string, string> = {};

  beforeAll(async () => {
    a = await createCustomer(server.db, { balance: 100 });
    b = await createCustomer(server.db, { balance: 100 });
    t.done = await createVideo(a.key);
    t.failed = await createVideo(a.key, { prompt: 'fail' });
    await runWorkersUntil(async () => (await status(t.done!)) === 'completed' && (await status(t.failed!)) === 'failed');
    t.image = await createImage(a.key);
    t.attention = await createImage(b.key, {}, { Prefer: 'respond-async' });
    await server.db.updateTable('imageTasks').set({ status: 'needs_attention', errorCode: 'outcome_unknown', errorMessage: 'Stored nowhere.' }).where('id', '=', t.attention!).execute();
    t.queued = await createVideo(b.key, { model: 'local-video-lite' });
    t.async = await createImage(a.key, {}, { Prefer: 'respond-async' });
  });

  it('lists the tasks of every account, images and videos together, newest first, with member, provider and credits', async () => {
    const res = await admin('/admin/v1/tasks', { account_id: a.accountId });
    expect(res.status).toBe(200);
    expect(ids(res.body)).toEqual([t.async, t.image, t.failed, t.done]);
    expect(res.body.next_cursor).toBeNull();
    const [pending, image, failed, done] = res.body.data as Json[];
    expect(pending).toMatchObject({ kind: 'image', status: 'processing', member_id: null, provider: null, held_credits: 1, captured_credits: 0, released_credits: 0, completed_at: null });
    expect(image).toMatchObject({ kind: 'image', status: 'completed', provider: 'local', model: 'local-image-1', held_credits: 1, captured_credits: 1, released_credits: 0, error: null });
    expect(failed).toMatchObject({ kind: 'video', status: 'failed', provider: 'local', upstream_job_id: `job-${t.failed}`, held_credits: 0.1, captured_credits: 0, released_credits: 0.1 });
    expect(failed!.error).toMatchObject({ code: expect.any(String), message: expect.stringContaining('The upstream refused the prompt') });
    expect(done).toMatchObject({ kind: 'video', status: 'completed', account_id: a.accountId, api_key_id: a.apiKeyId, member_id: expect.stringMatching(/^mem_/), held_credits: 0.1, captured_credits: 0.1 });
  });

  it('filters by kind, status (needs_attention, unfinished), account, key, model, member, provider and creation time', async () => {
    const all = (await admin('/admin/v1/tasks', { limit: 200 })).body.data as Json[];
    const mine = (q: Json) => admin('/admin/v1/tasks', { limit: 200, ...q }).then((r) => ids(r.body).filter((id) => Object.values(t).includes(id)));
    expect(await mine({ status: ['needs_attention'] })).toEqual([t.attention]);
    expect(await mine({ status: ['queued', 'in_progress', 'processing'] })).toEqual([t.async, t.queued]);
    expect(await mine({ kind: 'video' })).toEqual([t.queued, t.failed, t.done]);
    expect(await mine({ kind: 'image', status: ['completed'] })).toEqual([t.image]);
    expect(await mine({ kind: 'image', status: ['queued'] })).toEqual([]);
    expect(ids((await admin('/admin/v1/tasks', { account_id: b.accountId })).body)).toEqual([t.queued, t.attention]);
    expect(ids((await admin('/admin/v1/tasks', { api_key_id: b.apiKeyId, kind: 'video' })).body)).toEqual([t.queued]);
    expect(await mine({ model: 'local-video-lite' })).toEqual([t.queued]);
    const member = all.find((x) => x.id === t.done)!.member_id as string;
    expect(ids((await admin('/admin/v1/tasks', { member_id: member })).body)).toEqual([t.image, t.failed, t.done]);
    expect(await mine({ provider: 'local' })).toEqual([t.image, t.failed, t.done]);
    expect((await admin('/admin/v1/tasks', { provider: 'openai' })).body.data).toEqual([]);
    expect((await admin('/admin/v1/tasks', { account_id: 'acct_nobody' })).body).toEqual({ data: [], next_cursor: null });
    const created = (id: string) => all.find((x) => x.id === id)!.created_at as string;
    expect(ids((await admin('/admin/v1/tasks', { account_id: a.accountId, created_after: created(t.failed!) })).body)).toEqual([t.async, t.image]);
    expect(ids((await admin('/admin/v1/tasks', { account_id: a.accountId, created_before: created(t.image!) })).body)).toEqual([t.failed, t.done]);
    expect(ids((await admin('/admin/v1/tasks', { account_id: a.accountId, created_after: created(t.done!), created_before: created(t.async!) })).body)).toEqual([t.image, t.failed]);
  });

  it('pages with an opaque cursor: tasks created between pages are never listed twice and none goes missing', async () => {
    const p = await createCustomer(server.db, { balance: 100 });
    const originals: string[] = [];
    for (let i = 0; i < 7; i++) originals.push(i % 2 === 0 ? await createVideo(p.key) : await createImage(p.key));
    const added: string[] = [];
    const seen = await collect('/admin/v1/tasks', { limit: 2, account_id: p.accountId }, async () => {
      added.push(await createVideo(p.key), await createImage(p.key));
    });
    expect(added.length).toBeGreaterThan(0);
    expect(seen).toEqual([...originals].reverse());
    // Every task of every account too, a page of 3 at a time while others are created.
    const everything = ids((await admin('/admin/v1/tasks', { limit: 200 })).body);
    const paged = await collect('/admin/v1/tasks', { limit: 3 }, async () => {
      await createImage(p.key);
    });
    expect(paged).toEqual(everything);
  });

  it('pages stay exact while tasks are created concurrently: every earlier task once, in order, none twice', async () => {
    const p = await createCustomer(server.db, { balance: 100 });
    for (let i = 0; i < 6; i++) await createImage(p.key);
    const before = ids((await admin('/admin/v1/tasks', { account_id: p.accountId })).body);
    let stop = false;
    const inserter = (async () => {
      while (!stop) await createImage(p.key);
    })();
    const all = (await admin('/admin/v1/tasks', { account_id: p.accountId, limit: 200 })).body.data as Json[];
    const seen = await collect('/admin/v1/tasks', { limit: 2, account_id: p.accountId });
    stop = true;
    await inserter;
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen.filter((id) => before.includes(id))).toEqual(before);
    // Whatever was created before the first page was read is listed, in order.
    expect(seen.slice(seen.length - before.length)).toEqual(before);
    expect(all.length).toBeGreaterThanOrEqual(before.length);
  });

  it('answers 400 invalid_cursor for a cursor it did not issue, and 400 invalid_request for a bad filter', async () => {
    for (const cursor of ['garbage', Buffer.from('{"x":1}').toString('base64url'), Buffer.from('[1,2]').toString('base64url')]) {
      const res = await admin('/admin/v1/tasks', { cursor });
      expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_cursor', 'cursor']);
    }
    // Another listing's cursor would read as a position here and end the listing early, silently.
    await createCustomer(server.db, { balance: 1 });
    await createCustomer(server.db, { balance: 1 });
    const accounts = await admin('/admin/v1/accounts', { limit: 1 });
    expect(accounts.body.next_cursor).toEqual(expect.any(String));
    for (const path of ['/admin/v1/tasks', '/admin/v1/api-keys', '/admin/v1/webhook-deliveries', '/admin/v1/ledger', '/admin/v1/groups']) {
      const res = await admin(path, { cursor: accounts.body.next_cursor });
      expect([path, res.status, res.body.error?.code]).toEqual([path, 400, 'invalid_cursor']);
    }
    expect((await admin('/admin/v1/accounts', { limit: 1, cursor: accounts.body.next_cursor })).status).toBe(200);
    for (const query of [{ status: 'done' }, { limit: 0 }, { created_after: 'yesterday' }, { kind: 'audio' }, { provider: 'nobody' }]) {
      const res = await server.direct().GET('/admin/v1/tasks', { params: { query: query as never }, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
      expect([res.response.status, (res.error as Json)?.error.code]).toEqual([400, 'invalid_request']);
    }
    const anonymous = await server.direct().GET('/admin/v1/tasks', {});
    expect(anonymous.response.status).toBe(401);
  });
});

describe('GET /admin/v1/tasks/{task_id}: the whole story', () => {
  it('a completed video: quote, captured hold, its ledger entries, each upstream call with member, job id and timings', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(c.key, { seconds: 4 });
    await runWorkersUntil(async () => (await status(id)) === 'completed');
    const res = await admin(`/admin/v1/tasks/${id}`);
    expect(res.status).toBe(200);
    const task = res.body;
    expect(task).toMatchObject({ id, kind: 'video', status: 'completed', provider: 'local', deadline_at: null, settled_reason: null, webhook: null });
    expect(task.quote).toEqual({ billing_kind: 'snapshot', mode: 'per_second', unit_price: 0.05, units: 4, quoted_credits: 0.2, actual_credits: 0.2 });
    expect(task.hold).toMatchObject({ id: expect.stringMatching(/^hold_/), status: 'captured', amount: 0.2, captured: 0.2, released: 0, settled_at: expect.any(String) });
    expect(task.ledger.map((e: Json) => [e.kind, e.amount, e.balance_change, e.task_id, e.hold_id])).toEqual([
      ['hold', 0.2, -0.2, id, task.hold.id],
      ['capture', 0.2, 0, id, task.hold.id],
    ]);
    expect(task.attempts.map((a: Json) => [a.step, a.outcome, a.member_id, a.provider, a.upstream_job_id, a.error])).toEqual([
      ['submit', 'ok', task.member_id, 'local', `job-${id}`, null],
      ['poll', 'ok', task.member_id, 'local', `job-${id}`, null],
      ['download', 'ok', task.member_id, 'local', `job-${id}`, null],
    ]);
    for (const a of task.attempts as Json[]) {
      expect(a.duration_ms).toBeGreaterThanOrEqual(0);
      expect(Date.parse(a.started_at)).toBeGreaterThanOrEqual(Date.parse(task.created_at));
    }
  });

  it("a failed video and a broken adapter: the upstream's reason, an internal failure never shown, refunds, the webhook with its attempts", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const failed = await createVideo(c.key, { prompt: 'fail', callback_url: 'http://127.0.0.1:9/hook' });
    const crashed = await createVideo(c.key, { prompt: 'crash' });
    await runWorkersUntil(async () => (await status(failed)) === 'failed' && (await admin(`/admin/v1/tasks/${crashed}`)).body.attempts.length > 0);
    const f = (await admin(`/admin/v1/tasks/${failed}`)).body;
    expect(f.hold).toMatchObject({ status: 'released', amount: 0.1, captured: 0, released: 0.1 });
    expect(f.ledger.map((e: Json) => [e.kind, e.balance_change])).toEqual([
      ['hold', -0.1],
      ['release', 0.1],
    ]);
    expect(f.attempts.map((a: Json) => [a.step, a.outcome])).toEqual([
      ['submit', 'ok'],
      ['poll', 'ok'],
    ]);
    expect(f.error.message).toContain('The upstream refused the prompt');
    expect(f.webhook).toMatchObject({ task_id: failed, account_id: c.accountId, event_type: 'video.failed', url: 'http://127.0.0.1:9/hook' });
    const k = (await admin(`/admin/v1/tasks/${crashed}`)).body;
    expect(k.attempts[0]).toMatchObject({ step: 'submit', outcome: 'internal', upstream_job_id: null, member_id: k.member_id ?? expect.any(String) });
    expect(JSON.stringify(k)).not.toMatch(/SECRET|internal\.example/);
    expect(k.attempts[0].error).toMatch(/internal error/i);
  });

  it('a task that failed over: the submit each member got, the refused one with its reason', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const second = await createMember(server.db, c.groupId);
    const id = await createVideo(c.key, { prompt: 'overloaded once' });
    await runWorkersUntil(async () => (await status(id)) === 'completed');
    const task = (await admin(`/admin/v1/tasks/${id}`)).body;
    const [refused, accepted, ...rest] = task.attempts as Json[];
    expect(refused).toMatchObject({ step: 'submit', outcome: 'retryable', error: 'The upstream is overloaded. (HTTP 503)', upstream_job_id: null, provider: 'local' });
    expect(accepted).toMatchObject({ step: 'submit', outcome: 'ok', upstream_job_id: `job-${id}`, member_id: task.member_id });
    expect(refused!.member_id).not.toBe(accepted!.member_id);
    expect([refused!.member_id, accepted!.member_id]).toContain(second.id);
    expect(rest.map((a) => a.step)).toEqual(['poll', 'download']);
  });

  it('a synchronous image: its generate call, recorded by the statement that settled it, and its per-image quote', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await createImage(c.key, { n: 2 });
    const task = (await admin(`/admin/v1/tasks/${id}`)).body;
    expect(task).toMatchObject({ kind: 'image', status: 'completed', provider: 'local', upstream_job_id: null, webhook: null, deadline_at: null });
    expect(task.quote).toEqual({ billing_kind: 'snapshot', mode: 'per_item', unit_price: 1, units: 2, quoted_credits: 2, actual_credits: 2 });
    expect(task.attempts).toEqual([
      { step: 'generate', member_id: task.member_id, provider: 'local', upstream_job_id: null, outcome: 'ok', error: null, started_at: expect.any(String), duration_ms: expect.any(Number) },
    ]);
    const pending = await createImage(c.key, {}, { Prefer: 'respond-async' });
    const p = (await admin(`/admin/v1/tasks/${pending}`)).body;
    expect(p).toMatchObject({ status: 'processing', attempts: [], ledger: [{ kind: 'hold' }], hold: { status: 'held' } });
    expect(Date.parse(p.deadline_at) - Date.parse(p.created_at)).toBe(server.config.taskMaxLifetimeSeconds * 1000);
    expect((await admin('/admin/v1/tasks/img_nothing')).body.error.code).toBe('task_not_found');
  });
});

describe('GET /admin/v1/ledger and /admin/v1/webhook-deliveries', () => {
  it('lists ledger entries newest first with every filter, pages stable while entries are written', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const grant = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: c.accountId } }, body: { amount: 5, reason: 'invoice 42' } });
    expect(grant.response.status).toBe(200);
    const image = await createImage(c.key, { n: 2 });
    const video = await createVideo(c.key);
    const all = (await admin('/admin/v1/ledger', { account_id: c.accountId })).body.data as Json[];
    expect(all.map((e) => [e.kind, e.task_id, e.amount, e.balance_change])).toEqual([
      ['hold', video, 0.1, -0.1],
      ['capture', image, 2, 0],
      ['hold', image, 2, -2],
      ['grant', null, 5, 5],
      ['grant', null, 10, 10], // the account's opening balance
    ]);
    expect(all[3]).toMatchObject({ reason: 'invoice 42', api_key_id: null, hold_id: null, account_id: c.accountId });
    expect(all[0]).toMatchObject({ api_key_id: c.apiKeyId, hold_id: expect.stringMatching(/^hold_/) });
    const kinds = async (q: Json) => ((await admin('/admin/v1/ledger', { account_id: c.accountId, ...q })).body.data as Json[]).map((e) => e.kind);
    expect(await kinds({ kind: ['grant', 'debit'] })).toEqual(['grant', 'grant']);
    expect(await kinds({ task_id: image })).toEqual(['capture', 'hold']);
    expect(await kinds({ api_key_id: c.apiKeyId })).toEqual(['hold', 'capture', 'hold']);
    expect(await kinds({ created_after: all[1]!.created_at, kind: ['hold'] })).toEqual(['hold']);
    expect(await kinds({ created_before: all[2]!.created_at })).toEqual(['grant', 'grant']);
    const seen = await collect('/admin/v1/ledger', { account_id: c.accountId, limit: 1 }, async () => {
      await createImage(c.key);
    });
    expect(seen).toEqual(all.map((e) => e.id));
    const bad = await admin('/admin/v1/ledger', { cursor: Buffer.from('{"l":"x"}').toString('base64url') });
    expect([bad.status, bad.body.error.code]).toEqual([400, 'invalid_cursor']);
  });

  it('lists webhook deliveries of every account with their attempts, by state and account', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const first = await createVideo(c.key, { callback_url: 'http://127.0.0.1:9/a' });
    const second = await createVideo(c.key, { prompt: 'fail', callback_url: 'http://127.0.0.1:9/b' });
    await runWorkersUntil(async () => (await status(first)) === 'completed' && (await status(second)) === 'failed');
    const res = await admin('/admin/v1/webhook-deliveries', { account_id: c.accountId });
    expect(res.status).toBe(200);
    // Newest first: a delivery is written when its task ends.
    const data = res.body.data as Json[];
    expect(data.map((d) => [d.task_id, d.event_type, d.account_id]).sort()).toEqual([
      [first, 'video.completed', c.accountId],
      [second, 'video.failed', c.accountId],
    ].sort());
    expect(Date.parse(data[0]!.created_at)).toBeGreaterThanOrEqual(Date.parse(data[1]!.created_at));
    for (const d of data) expect(d.attempts.length).toBeGreaterThanOrEqual(0);
    const statuses = (res.body.data as Json[]).map((d) => d.status as string);
    const byState = await admin('/admin/v1/webhook-deliveries', { account_id: c.accountId, status: [statuses[0]] });
    expect((byState.body.data as Json[]).map((d) => d.task_id)).toContain(data[0]!.task_id);
    const other = statuses[0] === 'delivered' ? 'gone' : 'delivered';
    expect((await admin('/admin/v1/webhook-deliveries', { account_id: c.accountId, status: [other] })).body.data.filter((d: Json) => d.status !== other)).toEqual([]);
    const page = await admin('/admin/v1/webhook-deliveries', { account_id: c.accountId, limit: 1 });
    expect((page.body.data as Json[]).map((d) => d.task_id)).toEqual([data[0]!.task_id]);
    const next = await admin('/admin/v1/webhook-deliveries', { account_id: c.accountId, limit: 1, cursor: page.body.next_cursor });
    expect([(next.body.data as Json[]).map((d) => d.task_id), next.body.next_cursor]).toEqual([[data[1]!.task_id], null]);
  });
});

describe('GET /admin/v1/usage', () => {
  let u: Awaited<ReturnType<typeof createCustomer>>;
  let from: Date;

  beforeAll(async () => {
    from = new Date(Date.now() - 60_000);
    u = await createCustomer(server.db, { balance: 100 });
    const done = await createVideo(u.key); // 2 s × 0.05: 0.1 captured
    const failed = await createVideo(u.key, { prompt: 'fail' }); // 0.1 held, then released
    await runWorkersUntil(async () => (await status(done)) === 'completed' && (await status(failed)) === 'failed');
    await createImage(u.key, { n: 2 }); // 2 × 1 credit captured
    await createImage(u.key, {}, { Prefer: 'respond-async' }); // 1 credit held; no member yet
  });

  it('takes from and to written as the README writes them, with their colons not percent-encoded', async () => {
    const raw = `from=${from.toISOString()}&to=${new Date(Date.now() + 60_000).toISOString()}&account_id=${u.accountId}&group_by=key`;
    expect(raw).toContain(':');
    const res = await fetch(`${server.baseUrl}/admin/v1/usage?${raw}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    expect(res.status, await res.clone().text()).toBe(200);
  });

  const report = async (q: Json) => {
    const res = await admin('/admin/v1/usage', { from: from.toISOString(), to: new Date(Date.now() + 60_000).toISOString(), account_id: u.accountId, ...q });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body;
  };
  /** Rows summed over their periods (a run across midnight or an hour splits them). */
  const totals = (rows: Json[], key: (r: Json) => string) => {
    const out: Record<string, Json> = {};
    for (const r of rows) {
      const k = key(r);
      const acc = (out[k] ??= {});
      for (const [name, v] of Object.entries(r)) if (typeof v === 'number') acc[name] = Math.round(((acc[name] ?? 0) + v) * 1e6) / 1e6;
    }
    return out;
  };
  const zero = { video_tasks_queued: 0, video_tasks_in_progress: 0, image_tasks_needs_attention: 0, image_tasks_failed: 0 };

  it('by account and day: credits spent and refunded, tasks by status, images asked for and delivered, as computed by hand', async () => {
    const body = await report({});
    expect(body).toMatchObject({ granularity: 'day', group_by: ['account'] });
    expect((body.rows as Json[]).every((r) => r.account_id === u.accountId && r.model === null && r.api_key_id === null && r.provider === null)).toBe(true);
    expect(totals(body.rows, (r) => r.account_id)[u.accountId]).toEqual({
      ...zero,
      credits_spent: 2.1,
      credits_refunded: 0.1,
      video_tasks_completed: 1,
      video_tasks_failed: 1,
      image_tasks_processing: 1,
      image_tasks_completed: 1,
      images_requested: 3,
      images_delivered: 2,
    });
    // The first period starts at `from` (not aligned to a day).
    expect(body.rows[0].period_start).toBe(from.toISOString());
  });

  it('by model, by provider and key, by hour', async () => {
    const byModel = totals((await report({ group_by: ['model'] })).rows, (r) => r.model);
    expect(byModel['local-image-1']).toMatchObject({ credits_spent: 2, credits_refunded: 0, image_tasks_completed: 1, image_tasks_processing: 1, images_requested: 3, images_delivered: 2, video_tasks_completed: 0 });
    expect(byModel['local-video-1']).toMatchObject({ credits_spent: 0.1, credits_refunded: 0.1, video_tasks_completed: 1, video_tasks_failed: 1, images_requested: 0 });
    const byProvider = await report({ group_by: ['provider', 'key'], granularity: 'hour' });
    for (const r of byProvider.rows as Json[]) {
      expect(r.api_key_id).toBe(u.apiKeyId);
      expect(r.account_id).toBeNull();
      expect(Date.parse(r.period_start) % 3_600_000 === 0 || r.period_start === from.toISOString()).toBe(true);
    }
    const p = totals(byProvider.rows, (r) => r.provider);
    expect(Object.keys(p).sort()).toEqual(['local', 'none']);
    expect(p.local).toMatchObject({ credits_spent: 2.1, credits_refunded: 0.1, image_tasks_completed: 1, images_requested: 2, video_tasks_failed: 1 });
    expect(p.none).toMatchObject({ credits_spent: 0, image_tasks_processing: 1, images_requested: 1 });
  });

  it('answers CSV with Accept: text/csv: a header, then the same rows', async () => {
    const json = await report({ group_by: ['account', 'model'] });
    const q = new URLSearchParams({ from: from.toISOString(), to: new Date(Date.now() + 60_000).toISOString(), account_id: u.accountId, group_by: 'account,model' });
    const res = await fetch(`${server.baseUrl}/admin/v1/usage?${q}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, Accept: 'text/csv' } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/csv/);
    const [header, ...lines] = (await res.text()).trimEnd().split('\n');
    const columns = header!.split(',');
    expect(columns).toEqual(Object.keys(json.rows[0]));
    expect(lines).toHaveLength(json.rows.length);
    const parsed = lines.map((line) => Object.fromEntries(line.split(',').map((v, i) => [columns[i], v])));
    for (const [i, row] of (json.rows as Json[]).entries()) {
      for (const c of columns) expect(parsed[i]![c!]).toBe(row[c!] === null ? '' : String(row[c!]));
    }
  });

  it('refuses a range that ends before it starts or is too long for its granularity (400 naming the parameter)', async () => {
    const t0 = '2026-01-10T00:00:00Z';
    for (const [q, param] of [
      [{ from: t0, to: t0 }, 'to'],
      [{ from: t0, to: '2026-03-10T00:00:00Z', granularity: 'hour' }, 'to'],
      [{ from: '2020-01-01T00:00:00Z', to: '2026-01-01T00:00:00Z' }, 'to'],
    ] as const) {
      const res = await admin('/admin/v1/usage', q);
      expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_request', param]);
    }
    const empty = await admin('/admin/v1/usage', { from: t0, to: '2026-01-11T00:00:00Z', group_by: ['account', 'model', 'key', 'provider'] });
    expect(empty.body).toEqual({ from: '2026-01-10T00:00:00.000Z', to: '2026-01-11T00:00:00.000Z', granularity: 'day', group_by: ['account', 'model', 'key', 'provider'], rows: [] });
    // A leap second is valid RFC 3339 (JavaScript's Date refuses it): the next minute's start.
    const leap = await admin('/admin/v1/usage', { from: '2026-01-09T23:59:60Z', to: '2026-01-10T23:59:60.5+00:00' });
    expect([leap.status, leap.body.from, leap.body.to]).toEqual([200, '2026-01-10T00:00:00.000Z', '2026-01-11T00:00:00.500Z']);
  });
});

describe('the task sweeper, with no engine running, and the operator gauges', () => {
  let s: TestServer;
  beforeAll(async () => {
    s = await startTestServer({ env: { METRICS_TOKEN: 'metrics-token-0123456789', TASK_MAX_LIFETIME_SECONDS: '600' } });
    await seedCatalog(s.db);
  });
  afterAll(async () => s?.close());

  const post = async (key: string, path: string, body: Json, headers: Record<string, string> = {}) => {
    const res = await fetch(`${s.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
  };
  const video = async (key: string) => (await post(key, '/v1/videos/generations', { client_request_id: randomUUID(), prompt: 'x', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' })).body.id as string;
  const balance = async (accountId: string) => (await s.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow()).balance;
  const gauges = async () => {
    const res = await fetch(`${s.directUrl}/metrics`, { headers: { Authorization: 'Bearer metrics-token-0123456789' } });
    expect(res.status).toBe(200);
    const text = await res.text();
    const value = (name: string) => Number(new RegExp(`^${name.replace(/[{}"]/g, '\\$&')} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
    return {
      held: value('mediagate_credits_held'),
      holds: value('mediagate_credit_holds_held'),
      queued: value('mediagate_tasks{kind="video",status="queued"}'),
      processing: value('mediagate_tasks{kind="image",status="processing"}'),
      attention: value('mediagate_tasks_needs_attention'),
      oldest: value('mediagate_tasks_needs_attention_oldest_age_seconds'),
    };
  };

  it('fails and refunds tasks past their deadline that no worker claims, leaves leased ones, settles holds of ended tasks; one sweeper at a time', async () => {
    // Engines that ran once and were stopped (their sweeper's run stopped with them) leave a sweeper that still works.
    const workers = createWorkers(s.ctx);
    workers.start();
    await workers.stop();
    const c = await createCustomer(s.db, { balance: 10 });
    const start = await balance(c.accountId);
    const overdue = await video(c.key);
    const leased = await video(c.key);
    const young = await video(c.key);
    const image = (await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'x', response_format: 'url' }, { Prefer: 'respond-async' })).taskId!;
    const endedVideo = await video(c.key);
    const endedImage = (await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'y', response_format: 'url', n: 2 }, { Prefer: 'respond-async' })).taskId!;
    const past = new Date(Date.now() - 1000);
    await s.db.updateTable('videoTasks').set({ deadlineAt: past }).where('id', 'in', [overdue, leased]).execute();
    await s.db.updateTable('videoTasks').set({ leaseOwner: 'a-live-worker', leaseExpiresAt: new Date(Date.now() + 60_000), attempt: 1 }).where('id', '=', leased).execute();
    await s.db.updateTable('imageTasks').set({ createdAt: new Date(Date.now() - 601_000) }).where('id', '=', image).execute();
    // Ended without their holds settled (what an older version or a manual edit could leave).
    await s.db.updateTable('videoTasks').set({ status: 'completed', actualCredits: 100_000, completedAt: new Date() }).where('id', '=', endedVideo).execute();
    await s.db.updateTable('imageTasks').set({ status: 'failed', completedAt: new Date(), errorMessage: 'x' }).where('id', '=', endedImage).execute();
    expect(await gauges()).toMatchObject({ held: 3.4, holds: 6, queued: 3, processing: 1 });

    // A second sweeper (another instance) meanwhile finds the lease taken.
    const other = new TaskSweeper({
      repo: new TaskSweepRepository(s.db),
      sweepers: new SweeperRepository(s.db),
      ledger: s.ctx.repositories.ledger,
      settlement: s.ctx.settlement,
      videoRunner: s.ctx.runners.video,
      imageRunner: s.ctx.runners.image,
      db: s.db,
      log: createLogger('silent'),
      taskMaxLifetimeSeconds: 600,
    });
    const [one, two] = await Promise.all([s.ctx.taskSweeper.run(), other.run()]);
    expect([one, two].filter((r) => r === undefined)).toHaveLength(1);
    expect(one ?? two).toEqual({ videos: 1, images: 1, holds: 2 });

    expect(await status2(overdue)).toMatchObject({ status: 'failed', errorCode: 'timeout' });
    expect(await status2(leased)).toMatchObject({ status: 'queued' });
    expect(await status2(young)).toMatchObject({ status: 'queued' });
    const story = (await s.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: overdue } } })).data!;
    expect(story.hold).toMatchObject({ status: 'released', released: 0.1 });
    expect(story.error).toEqual({ code: 'timeout', message: 'The task exceeded its maximum lifetime and was refunded.' });
    const img = (await s.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: image } } })).data!;
    expect([img.status, img.error?.code, img.hold?.status]).toEqual(['failed', 'timeout', 'released']);
    const ended = (await s.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: endedVideo } } })).data!;
    expect(ended.hold).toMatchObject({ status: 'captured', captured: 0.1 });
    const endedI = (await s.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: endedImage } } })).data!;
    expect(endedI.hold).toMatchObject({ status: 'released', released: 2 });
    // Held: the leased and the young video; everything else went back but the captured 0.1.
    expect(await balance(c.accountId)).toBe(start - 300_000);
    expect(await s.ctx.taskSweeper.run()).toEqual({ videos: 0, images: 0, holds: 0 });
    expect(await gauges()).toMatchObject({ held: 0.2, holds: 2, queued: 2, processing: 0, attention: 0, oldest: 0 });
  });

  it('shows needs_attention tasks and the age of the oldest', async () => {
    const c = await createCustomer(s.db, { balance: 10 });
    const id = (await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'x', response_format: 'url' }, { Prefer: 'respond-async' })).taskId!;
    await s.db.updateTable('imageTasks').set({ status: 'needs_attention', createdAt: new Date(Date.now() - 3_600_000) }).where('id', '=', id).execute();
    const g = await gauges();
    expect(g.attention).toBe(1);
    expect(g.oldest).toBeGreaterThanOrEqual(3600);
    expect(g.oldest).toBeLessThan(3700);
    // The sweeper leaves it to an operator.
    await s.ctx.taskSweeper.run();
    expect(await status2(id)).toMatchObject({ status: 'needs_attention' });
  });

  async function status2(id: string) {
    const table = id.startsWith('vid_') ? 'videoTasks' : 'imageTasks';
    return s.db.selectFrom(table).select(['status', 'errorCode']).where('id', '=', id).executeTakeFirstOrThrow();
  }
});
