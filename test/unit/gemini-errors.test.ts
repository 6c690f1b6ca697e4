// Google's error statuses that are the project's state rather than the client's request
// (upstream-apis.md §3.6, and what Google's own pages and live answers show since).
import { describe, expect, it } from 'vitest';
import { apiErrorOf } from '../../server/errors.ts';
import { DAILY_QUOTA_COOLDOWN_MS, googleErrorOf } from '../../server/providers/gemini/gemini-errors.ts';

describe('googleErrorOf', () => {
  it('takes 400 FAILED_PRECONDITION (billing not enabled, region or model not open to the project) as the account\'s state', () => {
    const err = googleErrorOf({ code: 400, message: 'Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio.', status: 'FAILED_PRECONDITION' }, 'image generation', 400);
    expect([err.kind, err.transient]).toEqual(['account_disabled', false]);
    expect(apiErrorOf(err)).toMatchObject({ status: 503, code: 'upstream_unavailable' });
    // INVALID_ARGUMENT stays the request's.
    expect(googleErrorOf({ code: 400, message: 'bad aspect ratio', status: 'INVALID_ARGUMENT' }, 'image generation', 400).kind).toBe('invalid_request');
  });

  it('takes depleted prepaid credit (402, or 429 "prepayment credits are depleted") as used-up quota, cooled for at least an hour', () => {
    for (const [code, status] of [[402, 'RESOURCE_EXHAUSTED'], [429, 'RESOURCE_EXHAUSTED']] as const) {
      const err = googleErrorOf({ code, message: 'Your prepayment credits are depleted. Please go to AI Studio at https://ai.studio/projects to manage your project and billing.', status }, 'image generation', code);
      expect([err.kind, err.transient]).toEqual(['quota_exhausted', false]);
      expect(err.retryAfterMs).toBeGreaterThanOrEqual(DAILY_QUOTA_COOLDOWN_MS);
    }
    // A per-minute limit is still a short wait.
    const limited = googleErrorOf({ code: 429, message: 'Resource has been exhausted (e.g. check quota).', status: 'RESOURCE_EXHAUSTED', details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: '20s' }] }, 'image generation', 429);
    expect([limited.kind, limited.retryAfterMs]).toEqual(['rate_limited', 20_000]);
  });
});
