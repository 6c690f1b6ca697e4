/**
 * No Seedance task outlives the gateway task it was made for, and a cancel Ark refuses for the
 * task's state never blames the member. At its deadline the runner fails and refunds a task, then
 * sends one cancel; one that gets no answer (a 429 here) left the task in Ark's queue for the
 * default 48 hours, to run there later, billed to the member, for a client refunded long before. So
 * every submit gives the task `execution_expires_after`, what is left of the task's lifetime (in
 * Ark's [3600, 259200] seconds), and the fake expires a task still queued past it. Ark refuses to
 * cancel a running task; refused with a 403 `OperationDenied.*` or a 409, that read as rejected
 * credentials (the member taken out) or a failure towards its circuit.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { ArkVideoProvider, executionExpiresAfter } from '../../server/providers/ark/ark-video.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { arkErrorBody, startArkFake, type ArkFake } from '../fakes/ark.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';
import { videoJob } from '../support/video-job.ts';

const MODEL = 'seedance-1-0-pro-250528';
const never = new AbortController().signal;

describe('execution_expires_after and cancels, adapter and fake', () => {
  let fake: ArkFake;
  beforeAll(async () => {
    fake = await startArkFake({ accounts: { 'ark-unit': {} }, queuedMs: 30, runningMs: 30 });
  });
  afterAll(async () => fake?.close());
  const provider = new ArkVideoProvider(50);
  const account = (): UpstreamAccount => ({ memberId: 'mem_unit', provider: 'ark', baseUrl: `${fake.url}/api/v3`, credentials: { api_key: 'ark-unit' }, modelMap: {} });
  const job = (o: Parameters<typeof videoJob>[0] = {}) => videoJob({ taskId: 'vid_unit', model: MODEL, prompt: 'a boat', ...o });
  const create = (body: Record<string, unknown>) =>
    fetch(`${fake.url}/api/v3/contents/generations/tasks`, {
      method: 'POST',
      headers: { authorization: 'Bearer ark-unit', 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, content: [{ type: 'text', text: 'a boat [ark:stay-queued]' }], ...body }),
    });

  it('is the seconds left until the deadline, rounded up, within Ark\'s [3600, 259200]', () => {
    const now = Date.parse('2026-11-20T10:00:00Z');
    const at = (seconds: number) => new Date(now + seconds * 1000);
    expect(executionExpiresAfter(at(5000.2), now)).toBe(5001);
    expect(executionExpiresAfter(at(7200), now)).toBe(7200);
    expect(executionExpiresAfter(at(600), now)).toBe(3600);
    expect(executionExpiresAfter(at(-5), now)).toBe(3600);
    expect(executionExpiresAfter(at(7 * 86_400), now)).toBe(259_200);
  });

  it('is sent with every submit of a job that has a deadline', async () => {
    const id = await provider.submit(account(), job({ prompt: 'a boat [ark:stay-queued]', deadline: new Date(Date.now() + 9000_500) }), never);
    const sent = fake.tasks.get(id)!.body.execution_expires_after as number;
    expect(Number.isInteger(sent)).toBe(true);
    expect(sent).toBeGreaterThanOrEqual(8999);
    expect(sent).toBeLessThanOrEqual(9001);
  });

  it('expires a task still queued past it (never run), and leaves one running by then to run on', async () => {
    const queued = await provider.submit(account(), job({ prompt: 'a boat [ark:stay-queued]', deadline: new Date(Date.now() + 3600_000) }), never);
    const task = fake.tasks.get(queued)!;
    expect(fake.statusOf(queued)).toBe('queued');
    // An hour later.
    task.createdAt -= 3600_000;
    expect(fake.statusOf(queued)).toBe('expired');
    const status = await provider.poll(account(), queued, job(), never);
    expect(status.state === 'failed' && [status.error.kind, status.error.message]).toEqual(['failed', 'the upstream task expired in its queue before it ran']);
    const answer = (await (await fetch(`${fake.url}/api/v3/contents/generations/tasks/${queued}`, { headers: { authorization: 'Bearer ark-unit' } })).json()) as Record<string, unknown>;
    expect(answer).toMatchObject({ status: 'expired', error: null, execution_expires_after: 3600 });

    const running = await provider.submit(account(), job({ prompt: 'a long render [ark:stay-running]', deadline: new Date(Date.now() + 3600_000) }), never);
    await until(() => fake.statusOf(running) === 'running', 5000, 'the task to run');
    fake.tasks.get(running)!.createdAt -= 3600_000;
    expect(fake.statusOf(running)).toBe('running');
  });

  it('is refused by the fake outside [3600, 259200] or when not an integer, as Ark documents', async () => {
    for (const value of [3599, 259_201, 3600.5, '7200']) {
      const res = await create({ execution_expires_after: value });
      const body = (await res.json()) as { error: { code: string; param: string } };
      expect([res.status, body.error.code, body.error.param], String(value)).toEqual([400, 'InvalidParameter', 'execution_expires_after']);
    }
    for (const value of [3600, 259_200]) expect((await create({ execution_expires_after: value })).status, String(value)).toBe(200);
  });

  it('takes any 4xx refusal of a cancel for the task\'s state, 403 OperationDenied.* and 409 included, as "cannot cancel", not as the member\'s fault', async () => {
    const refusals = [
      { status: 403, body: arkErrorBody(403, 'OperationDenied.UnsupportedPhase', 'Operation is denied because operation is not supported while the target is in its current phase.') },
      { status: 403, body: arkErrorBody(403, 'OperationDenied.InvalidState', 'The specified task is in invalid state: Running.') },
      { status: 409, body: arkErrorBody(409, 'Conflict', 'The task cannot be cancelled in its current status.') },
      { status: 409, body: {} },
      { status: 400, body: arkErrorBody(400, 'InvalidParameter', 'The task is running and cannot be cancelled.') },
    ];
    for (const fault of refusals) {
      const id = await provider.submit(account(), job({ prompt: 'a long render [ark:stay-running]' }), never);
      fake.faults.push('cancel', fault);
      const err = await provider.cancel(account(), id, never).catch((e: unknown) => e);
      expect(err, JSON.stringify(fault)).toBeInstanceOf(ProviderError);
      expect([(err as ProviderError).kind, (err as ProviderError).upstreamStatus], JSON.stringify(fault)).toEqual(['failed', fault.status]);
      expect((err as ProviderError).message).toMatch(/^the upstream cannot cancel a running Seedance task; it runs to its end/);
    }
  });

  it('keeps what a cancel\'s answer says of the member\'s key or account, of a rate limit, or of no answer', async () => {
    const answers: [number, string, string][] = [
      [401, 'AuthenticationError', 'auth'],
      [403, 'AccessDenied', 'auth'],
      [403, 'AccountOverdueError', 'account_disabled'],
      [403, 'OperationDenied.ServiceOverdue', 'account_disabled'],
      [429, 'RateLimitExceeded.EndpointRPMExceeded', 'rate_limited'],
      [408, 'RequestTimeout', 'retryable'],
      [500, 'InternalServiceError', 'retryable'],
    ];
    for (const [status, code, kind] of answers) {
      const id = await provider.submit(account(), job({ prompt: 'a queue [ark:stay-queued]' }), never);
      fake.faults.push('cancel', { status, body: arkErrorBody(status, code, `${code} happened.`) });
      const err = await provider.cancel(account(), id, never).catch((e: unknown) => e);
      expect([(err as ProviderError).kind, (err as ProviderError).upstreamCode], code).toEqual([kind, code]);
    }
  });
});

describe('through the gateway', () => {
  let server: TestServer;
  let fake: ArkFake;
  // Two hours of lifetime: more than Ark's shortest queue lifetime, so the seconds left are sent as they are.
  const LIFETIME_S = 7200;
  beforeAll(async () => {
    fake = await startArkFake({ accounts: { 'ark-a': {} } });
    server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000', TASK_MAX_LIFETIME_SECONDS: String(LIFETIME_S) } });
    const created = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`ark/${MODEL}`)!.model });
    expect(created.response.status).toBe(201);
  });
  afterAll(async () => {
    await server?.close();
    await fake?.close();
  });

  async function customer() {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    const member = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'a', provider: 'ark', base_url: `${fake.url}/api/v3`, credentials: { api_key: 'ark-a' }, models: [MODEL], priority: 0 },
    });
    expect(member.response.status).toBe(201);
    return { groupId: group.id, key: (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key };
  }

  let seq = 0;
  async function createVideo(key: string, prompt: string): Promise<string> {
    const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: `expiry-${Date.now()}-${++seq}`, prompt, model: MODEL, seconds: 5, aspectRatio: '16:9', resolution: '720p' }),
    });
    expect(res.status).toBe(202);
    return ((await res.json()) as { id: string }).id;
  }

  const jobIdOf = (taskId: string) => until(async () => (await server.db.selectFrom('videoTasks').select('upstreamJobId').where('id', '=', taskId).executeTakeFirstOrThrow()).upstreamJobId ?? undefined, 10_000, 'the upstream task id');
  const pastDeadline = (taskId: string) => server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', '=', taskId).execute();
  const cancels = (jobId: string) => fake.requests.filter((r) => r.method === 'DELETE' && r.path.endsWith(`/tasks/${jobId}`)).length;
  const healthOf = async (groupId: string) => (await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } })).data!.data[0]!.health;

  it('a queued task whose cancel at the deadline meets 429s expires in Ark\'s queue by the task\'s deadline instead of running later', async () => {
    const c = await customer();
    const id = await createVideo(c.key, 'a long queue [ark:stay-queued]');
    const jobId = await jobIdOf(id);
    const { deadlineAt } = await server.db.selectFrom('videoTasks').select('deadlineAt').where('id', '=', id).executeTakeFirstOrThrow();
    const task = fake.tasks.get(jobId)!;
    const sent = task.body.execution_expires_after as number;
    // What was left of the task's lifetime when it was submitted: never past its deadline.
    expect(sent).toBeGreaterThan(LIFETIME_S - 60);
    expect(task.createdAt + sent * 1000).toBeLessThanOrEqual(deadlineAt.getTime() + 1000);

    // Every attempt of the cancel is refused (it is asked three times through passing failures).
    fake.rateLimitNext('cancel', 1, 3);
    await pastDeadline(id);
    const { task: failed } = await waitVideoFinished(server, c.key, id);
    expect(failed.status).toBe('failed');
    // Refunded as the contract says: quotedCredits unchanged, actualCredits 0.
    expect(failed.billing).toMatchObject({ kind: 'snapshot', quotedCredits: expect.any(Number), actualCredits: 0 });
    expect((failed.billing as { quotedCredits: number }).quotedCredits).toBeGreaterThan(0);
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    await until(() => server.logs.some((l) => l.includes(jobId) && l.includes('could not cancel')), 10_000, 'the warning');
    expect(cancels(jobId)).toBe(3);
    expect(fake.statusOf(jobId)).toBe('queued');
    // By the task's own deadline Ark's queue has given the task up: it never runs.
    task.createdAt -= sent * 1000;
    expect(fake.statusOf(jobId)).toBe('expired');
  });

  it('a cancel at the deadline answered 429 once is asked again after its Retry-After, and the queued task is cancelled', async () => {
    const c = await customer();
    const id = await createVideo(c.key, 'another long queue [ark:stay-queued]');
    const jobId = await jobIdOf(id);
    fake.rateLimitNext('cancel', 1);
    await pastDeadline(id);
    expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('failed');
    await until(() => fake.statusOf(jobId) === 'cancelled', 10_000, 'the second cancel');
    expect(cancels(jobId)).toBe(2);
  });

  it('a resubmit sends what is left of the lifetime then', async () => {
    const c = await customer();
    const submits = () => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/contents/generations/tasks')).length;
    const before = submits();
    // The first submit gets no answer (the connection drops after a second): it may have been accepted.
    fake.faults.push('submit', { delayMs: 1000, destroy: true });
    const id = await createVideo(c.key, 'a boat on a river');
    await until(() => submits() > before, 5000, 'the first submit');
    // Meanwhile the task has less of its lifetime left (as after a long wait for the resubmit).
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() + 5000_000) }).where('id', '=', id).execute();
    const jobId = await jobIdOf(id);
    expect(submits()).toBe(before + 2);
    const sent = fake.tasks.get(jobId)!.body.execution_expires_after as number;
    expect(sent).toBeGreaterThan(4900);
    expect(sent).toBeLessThanOrEqual(5000);
    expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('completed');
  });

  it.each([
    ['403 OperationDenied.UnsupportedPhase', { status: 403, body: arkErrorBody(403, 'OperationDenied.UnsupportedPhase', 'Operation is denied because operation is not supported while the target is in its current phase.') }],
    ['409', { status: 409, body: arkErrorBody(409, 'Conflict', 'The task cannot be cancelled in its current status.') }],
  ])('a running task whose cancel is refused with %s at the deadline leaves the member\'s health untouched', async (_name, fault) => {
    const c = await customer();
    const id = await createVideo(c.key, 'a long render [ark:stay-running]');
    const jobId = await jobIdOf(id);
    await until(() => fake.statusOf(jobId) === 'running', 5000, 'the task to run');
    fake.faults.push('cancel', fault);
    await pastDeadline(id);
    expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('failed');
    await until(() => server.logs.some((l) => l.includes(jobId) && l.includes('cannot cancel a running Seedance task')), 5000, 'the warning');
    expect(await healthOf(c.groupId)).toMatchObject({ credentials_rejected: false, account_disabled: null, cooldown_until: null, circuit: 'closed', last_error: null });
  });
});
