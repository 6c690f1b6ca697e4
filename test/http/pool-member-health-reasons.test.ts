/**
 * Member health shows the upstream's reasons, which come with a prefix of ours: a fal 422 of a
 * long pydantic message faulted on a model reads `HTTP 422: fal refused the input that the mapping
 * made for <endpoint> (HTTP 422: <300 characters>)`, past the contract's 400. The admin view cuts
 * every reason (last_error, model_faults[].reason, account_disabled.reason) to 400 characters
 * instead of failing its response validation.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { falError } from '../../server/providers/fal/fal-api.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { createGroup, createMember } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

describe('member health reasons', () => {
  it('are cut to the contract\'s 400 characters in the admin view, keeping their start', async () => {
    const group = await createGroup(server.db);
    const { id } = await createMember(server.db, group.id, { name: 'fal', models: ['local-video-1'] });
    const account: UpstreamAccount = { memberId: id, provider: 'fal', baseUrl: null, credentials: {}, modelMap: {} };
    // fal's 422 for an input the mapping made (fal-api.ts: falError), with a long validation message.
    const headers = { get: (name: string) => (name === 'x-fal-retryable' ? 'false' : null) };
    const detail = [{ loc: ['body', 'image_size'], msg: `Input should be one of the sizes of the model: ${'x'.repeat(300)}`, type: 'one_of' }];
    const refused = falError({ status: 422, headers, body: { detail } }, 'video submit', 'fal-ai/kling-video/v2.1/master/image-to-video');
    expect(refused.kind).toBe('misconfigured');
    await server.ctx.pool.health.failed(account, refused, performance.now());
    await server.ctx.pool.health.faultModel(account, 'local-video-1', refused);
    await server.ctx.pool.health.failed(account, new ProviderError('account_disabled', `the account is in arrears: ${'y'.repeat(450)}`), performance.now());

    const res = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } } });
    expect(res.response.status).toBe(200);
    const health = res.data!.data[0]!.health;
    const reasons = [health.last_error!, health.model_faults[0]!.reason, health.account_disabled!.reason];
    expect(reasons.map((r) => r.length)).toEqual([400, 400, 400]);
    expect(reasons.map((r) => r.slice(0, 30))).toEqual(['the account is in arrears: yyy', 'HTTP 422: fal refused the inpu', 'the account is in arrears: yyy']);
    expect(reasons.every((r) => r.endsWith('...'))).toBe(true);
  });
});
