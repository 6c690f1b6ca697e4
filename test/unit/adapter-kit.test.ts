/**
 * The adapter toolkit's own pieces (server/providers/kit/): upstream error codes to kinds, job
 * status words to states, and media inputs as data URLs inside a streamed JSON body.
 */
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { describe, expect, it } from 'vitest';
import { ProviderError, dataUrl, inlineBase64, jobStatus, jsonStream, kindOfCode } from '../../server/providers/kit.ts';
import { mediaInputOf } from '../support/video-adapter-conformance.ts';

describe('kindOfCode', () => {
  const table = { ModelNotOpen: 'model_not_open', 'RateLimitExceeded.': 'rate_limited', 'RateLimitExceeded.Quota*': 'quota_exhausted', '1102': 'account_disabled' } as const;

  it('matches exact codes, numbers as text, and the longest prefix', () => {
    expect(kindOfCode(table, 'ModelNotOpen')).toBe('model_not_open');
    expect(kindOfCode(table, 1102)).toBe('account_disabled');
    expect(kindOfCode(table, 'RateLimitExceeded.EndpointRPMExceeded')).toBe('rate_limited');
    expect(kindOfCode(table, 'RateLimitExceeded.QuotaOfTheDay')).toBe('quota_exhausted');
  });

  it('knows nothing of codes outside its table', () => {
    expect(kindOfCode(table, 'ModelNotOpenX')).toBeUndefined();
    expect(kindOfCode(table, 'RateLimitExceeded')).toBeUndefined();
    expect(kindOfCode(table, undefined)).toBeUndefined();
  });
});

describe('jobStatus', () => {
  const status = jobStatus({ running: ['queued', 'running'], succeeded: ['succeeded'], failed: ['failed', 'expired', 'cancelled'] }, 'Seedance task');

  it('maps each declared word to its state', () => {
    expect(['queued', 'running', 'succeeded', 'failed', 'expired', 'cancelled'].map(status)).toEqual(['running', 'running', 'succeeded', 'failed', 'failed', 'failed']);
  });

  it('makes an undeclared word a retryable error that names it, not a guess', () => {
    expect(() => status('succeed')).toThrow(ProviderError);
    try {
      status('Succeeded');
    } catch (err) {
      expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['retryable', "the upstream answered an unknown Seedance task status 'Succeeded'"]);
    }
  });
});

describe('media inputs in a streamed JSON body', () => {
  it('writes a data URL and bare base64 with the exact length, from the input\'s stream', async () => {
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 1, 2, 3, 4, 5, 6, 7]);
    const input = mediaInputOf(png, 'image/png');
    const { body, length } = jsonStream({ content: [{ type: 'image_url', image_url: { url: dataUrl(input) } }], image: inlineBase64(input) });
    const text = (await buffer(body)).toString();
    expect(Buffer.byteLength(text)).toBe(length);
    expect(JSON.parse(text)).toEqual({ content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${png.toString('base64')}` } }], image: png.toString('base64') });
  });

  it('opens the input again for every body (a retry on another member)', async () => {
    let opens = 0;
    const input = { ...mediaInputOf(Buffer.from('abc'), 'image/jpeg'), open: () => (opens++, Readable.from([Buffer.from('abc')])) };
    for (let i = 0; i < 2; i++) await buffer(jsonStream({ image: dataUrl(input) }).body);
    expect(opens).toBe(2);
  });
});
