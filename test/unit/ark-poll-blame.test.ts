/**
 * Whose fault a refused Seedance status call or cancel is. A status call carries nothing of the
 * client's, so no answer to it is the client's rejected request; and only Ark's own "no such task"
 * (404 `ResourceNotFound`, upstream-apis.md §5.3, or the error-code table's `NotFound.<parameter>`)
 * says the task is gone: any other 404 (a wrong base URL after an edit) fails nothing, the job may
 * be running, billed, its output collected once the member is put right.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ArkVideoProvider } from '../../server/providers/ark/ark-video.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { videoJob } from '../support/video-job.ts';

type Answer = (res: ServerResponse) => void;

const arkAnswer =
  (status: number, code: string, extra: Record<string, string> = {}, headers: Record<string, string> = {}): Answer =>
  (res) => {
    const body = JSON.stringify({ error: { code, message: `upstream says ${code}. Request id: 0217`, param: '', type: 'NotFound', ...extra } });
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), ...headers }).end(body);
  };
const plainNotFound: Answer = (res) => res.writeHead(404, { 'content-type': 'text/plain' }).end('404 page not found');
/** The status line and part of an Ark error, then the connection is lost. */
const cut =
  (status: number): Answer =>
  (res) => {
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': '500' });
    res.write('{"error":{"code":"ResourceNotFound"');
    setTimeout(() => res.socket?.destroy(), 20);
  };

describe('Seedance status calls and cancels: whose fault a refusal is', () => {
  let base = '';
  let answer: Answer = plainNotFound;
  const seen: { method?: string; url?: string }[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    seen.push({ method: req.method, url: req.url });
    req.resume().on('end', () => answer(res));
  });
  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    server.closeAllConnections();
    server.close();
  });
  const never = new AbortController().signal;
  const provider = new ArkVideoProvider();
  const account = (path = '/api/v3'): UpstreamAccount => ({ memberId: 'mem_ark', provider: 'ark', baseUrl: `${base}${path}`, credentials: { api_key: 'ark-key' }, modelMap: {} });
  const job = videoJob({ taskId: 'vid_blame', model: 'seedance-1-0-pro-250528', prompt: 'a boat' });
  const pollWith = async (a: Answer, path?: string) => {
    answer = a;
    return provider.poll(account(path), 'cgt-20250629201507-n6k56', job, never).catch((e: unknown) => e);
  };
  const thrown = (outcome: unknown) => {
    expect(outcome).toBeInstanceOf(ProviderError);
    const err = outcome as ProviderError;
    return { kind: err.kind, upstreamStatus: err.upstreamStatus, upstreamCode: err.upstreamCode };
  };

  it("a status call answered 400 is the member's misconfiguration, never the client's rejected request", async () => {
    const outcome = await pollWith(arkAnswer(400, 'InvalidParameter', { param: 'id', type: 'BadRequest' }));
    expect(seen.at(-1)).toEqual({ method: 'GET', url: '/api/v3/contents/generations/tasks/cgt-20250629201507-n6k56' });
    expect(thrown(outcome)).toEqual({ kind: 'misconfigured', upstreamStatus: 400, upstreamCode: 'InvalidParameter' });
  });

  it("a 404 that is not Ark's \"no such task\" is the member's misconfiguration: the job is not failed", async () => {
    // A wrong base URL: a router's page, no Ark error.
    expect(thrown(await pollWith(plainNotFound, '/wrong/api/v3'))).toEqual({ kind: 'misconfigured', upstreamStatus: 404, upstreamCode: undefined });
    expect(thrown(await pollWith(arkAnswer(404, 'InvalidEndpointOrModel.NotFound')))).toEqual({ kind: 'misconfigured', upstreamStatus: 404, upstreamCode: 'InvalidEndpointOrModel.NotFound' });
    // A 404 whose body broke off says nothing about the task either: a passing failure, asked again.
    expect(thrown(await pollWith(cut(404)))).toEqual({ kind: 'retryable', upstreamStatus: 404, upstreamCode: undefined });
  });

  it('a 404 ResourceNotFound (or the table\'s NotFound.<parameter>) is a task Ark no longer has: failed', async () => {
    for (const code of ['ResourceNotFound', 'NotFound.TaskId']) {
      const status = await pollWith(arkAnswer(404, code));
      expect(status).toEqual({ state: 'failed', error: expect.any(ProviderError) });
      const error = (status as { error: ProviderError }).error;
      expect([error.kind, error.message, error.upstreamStatus, error.upstreamCode]).toEqual(['failed', 'the upstream no longer has this video task (records are kept 7 days)', 404, code]);
    }
  });

  it('other refusals keep the kind their code or status gives: credentials, a wait with its Retry-After, a passing failure', async () => {
    expect(thrown(await pollWith(arkAnswer(401, 'AuthenticationError')))).toEqual({ kind: 'auth', upstreamStatus: 401, upstreamCode: 'AuthenticationError' });
    const limited = await pollWith(arkAnswer(429, 'RateLimitExceeded.EndpointRPMExceeded', {}, { 'retry-after': '3' }));
    expect([thrown(limited).kind, (limited as ProviderError).retryAfterMs]).toEqual(['rate_limited', 3000]);
    expect(thrown(await pollWith(arkAnswer(500, 'InternalServiceError'))).kind).toBe('retryable');
    // A 400 whose body broke off: the status alone would say the client's request; what it said is
    // unknown, so it is a passing failure (asked again), never the client's.
    expect(thrown(await pollWith(cut(400)))).toEqual({ kind: 'retryable', upstreamStatus: 400, upstreamCode: undefined });
  });

  it('a cancel answered a 404 that is not ResourceNotFound cancelled nothing: thrown as the member\'s, not done', async () => {
    answer = plainNotFound;
    const wrong = await provider.cancel(account('/wrong/api/v3'), 'cgt-1', never).catch((e: unknown) => e);
    expect(seen.at(-1)).toEqual({ method: 'DELETE', url: '/wrong/api/v3/contents/generations/tasks/cgt-1' });
    expect(thrown(wrong)).toEqual({ kind: 'misconfigured', upstreamStatus: 404, upstreamCode: undefined });
    // A task Ark no longer knows is nothing to cancel.
    answer = arkAnswer(404, 'ResourceNotFound');
    await expect(provider.cancel(account(), 'cgt-1', never)).resolves.toBeUndefined();
  });
});
