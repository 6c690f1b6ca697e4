import { describe, expect, it } from 'vitest';
import { openaiError } from '../../server/providers/openai/openai-errors.ts';
import { retryAfterMs, sanitizeMessage, upstreamUrl } from '../../server/providers/upstream-http.ts';

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(typeof body === 'string' ? body : JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });

describe('retryAfterMs', () => {
  it('reads retry-after-ms, retry-after seconds and HTTP dates, capped at an hour', () => {
    expect(retryAfterMs(new Headers({ 'retry-after-ms': '1500', 'retry-after': '9' }))).toBe(1500);
    expect(retryAfterMs(new Headers({ 'retry-after': '7' }))).toBe(7000);
    const now = Date.parse('2026-11-23T00:00:00Z');
    expect(retryAfterMs(new Headers({ 'retry-after': 'Mon, 23 Nov 2026 00:00:30 GMT' }), now)).toBe(30_000);
    expect(retryAfterMs(new Headers({ 'retry-after': '999999' }))).toBe(3_600_000);
    expect(retryAfterMs(new Headers({ 'retry-after': 'soon' }))).toBeUndefined();
    expect(retryAfterMs(new Headers())).toBeUndefined();
  });
});

describe('sanitizeMessage', () => {
  it('keeps the reason and drops URLs, keys and bearer tokens', () => {
    const out = sanitizeMessage('Bad  thing\nat https://x.example/a?sig=s3cr3t with sk-proj-abcdefghijklmnop and Bearer abc.def', 'fallback');
    expect(out).toBe('Bad thing at [url] with [redacted] and Bearer [redacted]');
    expect(sanitizeMessage(undefined, 'fallback')).toBe('fallback');
    expect(sanitizeMessage('x'.repeat(1000), 'f')).toHaveLength(300);
  });
});

describe('upstreamUrl', () => {
  it("joins the member's base URL or the provider default with the path", () => {
    expect(upstreamUrl({ memberId: 'm', provider: 'openai', baseUrl: 'http://127.0.0.1:9/v1/', credentials: {}, modelMap: {} }, '/videos')).toBe('http://127.0.0.1:9/v1/videos');
    expect(upstreamUrl({ memberId: 'm', provider: 'openai', baseUrl: null, credentials: {}, modelMap: {} }, 'videos')).toBe('https://api.openai.com/v1/videos');
  });
});

describe('openaiError', () => {
  const envelope = (code: string | null, type: string, message = 'upstream says no') => ({ error: { message, type, param: null, code } });

  it('classifies rate limits, exhausted quota, credentials, policy, invalid requests and server errors', async () => {
    const limited = await openaiError(json(429, envelope('rate_limit_exceeded', 'requests'), { 'retry-after': '3' }), 'call');
    expect([limited.kind, limited.retryAfterMs, limited.transient]).toEqual(['rate_limited', 3000, true]);
    const quota = await openaiError(json(429, envelope('insufficient_quota', 'insufficient_quota')), 'call');
    expect([quota.kind, quota.transient]).toEqual(['quota_exhausted', false]);
    const auth = await openaiError(json(401, envelope('invalid_api_key', 'invalid_request_error', 'Incorrect API key provided: sk-abc***xyz')), 'call');
    expect(auth.kind).toBe('auth');
    expect(auth.message).not.toContain('sk-');
    const policy = await openaiError(json(400, envelope('moderation_blocked', 'image_generation_user_error', 'Your request was rejected by the safety system.')), 'call');
    expect([policy.kind, policy.message]).toEqual(['policy', 'Your request was rejected by the safety system.']);
    const invalid = await openaiError(json(400, envelope('invalid_type', 'invalid_request_error', "Invalid type for 'seconds'")), 'call');
    expect([invalid.kind, invalid.upstreamCode]).toEqual(['invalid_request', 'invalid_type']);
    const server = await openaiError(json(503, '<html>bad gateway</html>'), 'video submit');
    expect([server.kind, server.message]).toEqual(['retryable', 'the upstream video submit failed with HTTP 503']);
    const gateway = await openaiError(json(400, { error: 'model not found' }), 'call');
    expect([gateway.kind, gateway.message]).toEqual(['invalid_request', 'model not found']);
  });
});
