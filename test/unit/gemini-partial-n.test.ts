/**
 * The Gemini image adapter's n parallel calls when some fail (GeminiImageProvider.generate), against
 * the fake Gemini API: the images that came back are handed over, numbered in order without gaps,
 * then the first failure is thrown, `maybeAccepted` when anything was or may have been made; calls
 * not started yet are not made after a failure.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { GeminiImageProvider } from '../../server/providers/gemini/gemini-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageEvents, ImageJob, UpstreamAccount } from '../../server/providers/types.ts';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';
import { imageParams } from '../support/image-params.ts';

let fake: GeminiFake;
beforeAll(async () => {
  fake = await startGeminiFake({ apiKeys: ['gm-test'] });
});
afterAll(async () => fake?.close());
beforeEach(() => {
  fake.faults.clear();
  fake.counts.generate = 0;
});

const account = (): UpstreamAccount => ({ memberId: 'mem_gemini', provider: 'gemini', baseUrl: `${fake.url}/v1beta`, credentials: { api_key: 'gm-test' }, modelMap: {} });
const job = (n: number, slots: number): ImageJob => ({ operation: 'generation', model: 'gemini-2.5-flash-image', prompt: 'bananas', n, slots, inputs: [], params: imageParams() });

/** Runs the adapter; the indexes of the images it handed over and what it threw. */
async function run(n: number, slots: number) {
  const delivered: number[] = [];
  const events: ImageEvents = {
    partial: async () => undefined,
    image: async (index, generated) => {
      expect(generated.image.subarray(1, 4).toString('latin1')).toBe('PNG');
      delivered.push(index);
    },
  };
  const error = await new GeminiImageProvider().generate(account(), job(n, slots), new AbortController().signal, events).then(
    () => undefined,
    (err: unknown) => err,
  );
  return { delivered, error: error as ProviderError | undefined };
}

describe('Gemini n>1 with a call that fails', () => {
  it('hands over the images of the calls that succeeded, numbered 0..k-1, then throws the failure as maybe accepted', async () => {
    fake.serverErrorNext('generate', 500);
    const { delivered, error } = await run(3, 3);
    expect(delivered).toEqual([0, 1]);
    expect(error).toBeInstanceOf(ProviderError);
    expect([error!.kind, error!.maybeAccepted, error!.upstreamStatus]).toEqual(['retryable', true, 500]);
    expect(fake.counts.generate).toBe(3);
  });

  it('makes no call it had not started once one failed: with nothing made, the failure stays movable to another member', async () => {
    fake.serverErrorNext('generate', 503);
    const { delivered, error } = await run(3, 1);
    expect(delivered).toEqual([]);
    expect([error!.kind, error!.maybeAccepted, error!.upstreamStatus]).toEqual(['retryable', false, 503]);
    expect(fake.counts.generate).toBe(1);
  });

  it('throws the failure as maybe accepted when another call broke off after its 200, even with nothing delivered', async () => {
    // Both calls run at once: one gets the 429, the other a 200 whose stream breaks off.
    fake.rateLimitNext('generate', 5);
    fake.faults.push('generate', { cutAfterBytes: 300 });
    const { delivered, error } = await run(2, 2);
    expect(delivered).toEqual([]);
    expect(error).toBeInstanceOf(ProviderError);
    expect(error!.maybeAccepted).toBe(true);
    expect(fake.counts.generate).toBe(2);
  });
});
