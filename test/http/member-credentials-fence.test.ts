/**
 * Fixing a member's configuration is not undone by a call made with the old one. An admin replaces
 * credentials the upstream rejected (or updates a member whose account was disabled, or whose model
 * failed); a call that used the old configuration — a poll from this instance's account cache, one
 * already in flight across the change, or one from another instance that has not heard of it yet —
 * then answers 401 (account disabled, model not found). That answer is about a configuration the
 * member no longer has: it must not take the fixed member out again "until an admin changes it".
 *
 * The calls run as the video runner's poll step runs them (the member's account from the pool,
 * through member health, to the OpenAI videos adapter), against an upstream whose answers the test
 * can hold.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { Pool } from '../../server/pool/pool.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { sendJson, startFakeServer, type FakeServer } from '../fakes/fake-http.ts';
import { createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { SORA_2, addUpstreamMember } from '../support/upstreams.ts';

/**
 * A fake OpenAI `/v1/videos` upstream answering status checks (GET /v1/videos/{id}) with a running
 * job, or a 401 for a key it does not accept. The key is checked when the answer is given, so a
 * held request answers as the upstream stands when it is released (a key revoked meanwhile: 401).
 */
interface HeldUpstream {
  url: string;
  /** The API keys it accepts now. */
  keys: Set<string>;
  /** Holds the next request: `arrived` once it reached the upstream, answered after `release()`. */
  holdNext(): { arrived: Promise<void>; release(): void };
  close(): Promise<void>;
}

async function startHeldUpstream(): Promise<HeldUpstream> {
  const keys = new Set<string>();
  let held: { arrived(): void; released: Promise<void> } | undefined;
  const fake: FakeServer = await startFakeServer(async (req: IncomingMessage, res: ServerResponse, recorded) => {
    const hold = held;
    held = undefined;
    if (hold) {
      hold.arrived();
      await hold.released;
    }
    const id = /^\/v1\/videos\/([^/]+)$/.exec(recorded.path)?.[1];
    if (recorded.method !== 'GET' || !id) return sendJson(res, 404, { error: { message: 'Invalid URL', type: 'invalid_request_error', param: null, code: null } });
    const key = String(req.headers.authorization ?? '').replace(/^Bearer /, '');
    if (!keys.has(key)) return sendJson(res, 401, { error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } });
    sendJson(res, 200, { id, object: 'video', model: 'sora-2', status: 'in_progress', progress: 40, created_at: Math.floor(Date.now() / 1000), seconds: '4', size: '1280x720' });
  });
  return {
    url: fake.url,
    keys,
    holdNext() {
      let release!: () => void;
      let arrived!: () => void;
      const reached = new Promise<void>((resolve) => (arrived = resolve));
      held = { arrived, released: new Promise<void>((resolve) => (release = resolve)) };
      return { arrived: reached, release };
    },
    close: () => fake.close(),
  };
}

let server: TestServer;
let upstream: HeldUpstream;
beforeAll(async () => {
  upstream = await startHeldUpstream();
  // sk-old was revoked upstream; sk-new is the key the operator puts in its place.
  upstream.keys.add('sk-new');
  server = await startTestServer();
  await seedCatalog(server.db, [SORA_2]);
});
afterAll(async () => {
  await server?.close();
  await upstream?.close();
});

async function oldKeyMember() {
  const group = await createGroup(server.db);
  const { id } = await addUpstreamMember(server.db, server.secretKey, { groupId: group.id, provider: 'openai', baseUrl: `${upstream.url}/v1`, credentials: { api_key: 'sk-old' }, models: [SORA_2.id] });
  return { groupId: group.id, id };
}

/** The operator replaces the member's key through this instance's admin API. */
async function rotate(m: { groupId: string; id: string }) {
  const { response, data } = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
    params: { path: { group_id: m.groupId, member_id: m.id } },
    body: { credentials: { api_key: 'sk-new' } },
  });
  expect(response.status).toBe(200);
  expect(data!.health).toMatchObject({ credentials_rejected: false });
}

/** A poll step of a job the member accepted, on `account` (as VideoRunner.run makes it): 'running', or the failure's kind. */
async function pollOn(account: UpstreamAccount): Promise<string> {
  const provider = server.ctx.providers.video('openai')!;
  try {
    await server.ctx.pool.health.observeAccepted(account, () => provider.poll(account, 'video_abc', {} as VideoJob, new AbortController().signal));
    return 'running';
  } catch (err) {
    return err instanceof ProviderError ? err.kind : String(err);
  }
}

/** The same, with the account the pool gives for the member now. */
async function poll(memberId: string, pool: Pool = server.ctx.pool): Promise<string> {
  return pollOn((await pool.account(memberId))!);
}

async function healthOf(memberId: string) {
  const row = await server.db.selectFrom('memberHealth').select(['credentialsRejectedAt', 'accountDisabledAt']).where('memberId', '=', memberId).executeTakeFirst();
  return { credentialsRejected: row?.credentialsRejectedAt != null, accountDisabled: row?.accountDisabledAt != null };
}

/** The members new video work of the group would be routed to. */
async function serving(groupId: string): Promise<string[]> {
  return (await server.ctx.pool.serving({ groupId, model: SORA_2.id, capability: 'video' })).map((a) => a.memberId);
}

describe('rejected credentials', () => {
  it('a poll after the admin replaced them uses the new key, and the member stays in rotation', async () => {
    const m = await oldKeyMember();
    // The upstream revoked sk-old: a poll meets 401 and the member is taken out.
    expect(await poll(m.id)).toBe('auth');
    expect(await healthOf(m.id)).toMatchObject({ credentialsRejected: true });
    expect(await serving(m.groupId)).toEqual([]);

    await rotate(m);
    expect(await serving(m.groupId)).toEqual([m.id]);
    // The next poll, a moment later: not from the account cached with sk-old.
    expect(await poll(m.id)).toBe('running');
    expect(await healthOf(m.id)).toMatchObject({ credentialsRejected: false });
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([m.id]);
  });

  it('a call made with the old key before the change, answered 401 after it, takes nothing out', async () => {
    const m = await oldKeyMember();
    const hold = upstream.holdNext();
    const inFlight = poll(m.id);
    await hold.arrived;
    await rotate(m);
    hold.release();
    expect(await inFlight).toBe('auth');

    expect(await healthOf(m.id)).toMatchObject({ credentialsRejected: false });
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([m.id]);
    expect(await poll(m.id)).toBe('running');
    expect(server.logs.some((line) => line.includes(m.id) && line.includes('configuration changed since the call was made'))).toBe(true);
  });

  it("another instance's cached account, used after the change, takes nothing out", async () => {
    const m = await oldKeyMember();
    // An instance that has not heard the change yet (its NOTIFY is on its way): its cache holds sk-old.
    const other = new Pool(server.ctx.repositories.routing, server.ctx.providers, createTransactor(server.db, server.ctx.log), server.ctx.pool.health, server.secretKey);
    expect((await other.account(m.id))!.credentials).toEqual({ api_key: 'sk-old' });
    await rotate(m);

    expect(await poll(m.id, other)).toBe('auth');
    expect(await healthOf(m.id)).toMatchObject({ credentialsRejected: false });
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([m.id]);
    // Once it hears the change, it polls with the new key.
    other.invalidate();
    expect(await poll(m.id, other)).toBe('running');
  });
});

describe('a disabled account', () => {
  it('is not recorded from an answer to the configuration before the change; it is from one after', async () => {
    const m = await oldKeyMember();
    const before = (await server.ctx.pool.account(m.id))!;
    await rotate(m);
    const arrears = () => Promise.reject(new ProviderError('account_disabled', 'the account is in arrears'));

    await expect(server.ctx.pool.health.observeAccepted(before, arrears)).rejects.toThrow('arrears');
    expect(await healthOf(m.id)).toMatchObject({ accountDisabled: false });
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([m.id]);

    // The same answer about the member as it is now takes it out: the fence holds back nothing else.
    const now = (await server.ctx.pool.account(m.id))!;
    await expect(server.ctx.pool.health.observeAccepted(now, arrears)).rejects.toThrow('arrears');
    expect(await healthOf(m.id)).toMatchObject({ accountDisabled: true });
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([]);
  });
});

describe('a model fault', () => {
  /** New video work routed to the member: `started` once it runs there; it fails with `fault` once `gate` opens. */
  function route(m: { groupId: string }, gate: Promise<void>, fault: ProviderError) {
    const { pool, log } = server.ctx;
    let running!: () => void;
    const started = new Promise<void>((resolve) => (running = resolve));
    const routed = pool.route({ groupId: m.groupId, model: SORA_2.id, capability: 'video', take: async () => undefined, release: async () => undefined, log }, async () => {
      running();
      await gate;
      throw fault;
    });
    return { routed, started };
  }
  const notFound = () => new ProviderError('misconfigured', 'the upstream does not know the model', { upstreamStatus: 404 });
  const faultsOf = (memberId: string) => server.db.selectFrom('memberModelFaults').select(['model', 'kind']).where('memberId', '=', memberId).execute();

  it('answered after the member was changed is not recorded; one answered about the member as it is, is', async () => {
    const m = await oldKeyMember();
    let open!: () => void;
    const { routed, started } = route(m, new Promise<void>((resolve) => (open = resolve)), notFound());
    // The work holds its account (read before the change) while the operator fixes the member.
    await started;
    await rotate(m);
    open();
    await expect(routed).rejects.toThrow('does not know the model');
    expect(await faultsOf(m.id)).toEqual([]);
    server.ctx.pool.invalidate();
    expect(await serving(m.groupId)).toEqual([m.id]);

    await expect(route(m, Promise.resolve(), notFound()).routed).rejects.toThrow('does not know the model');
    expect(await faultsOf(m.id)).toEqual([{ model: SORA_2.id, kind: 'misconfigured' }]);
    expect(await serving(m.groupId)).toEqual([]);
  });
});
