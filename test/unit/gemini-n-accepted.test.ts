/**
 * Gemini's n parallel calls (GeminiImageProvider.generate) when one call is answered 200 without an
 * image (Google took and billed it) while another fails before the upstream took it (a 429 or 503,
 * which alone would move the work to another member): the failure thrown is the answered call's,
 * `maybeAccepted`, so the runner fails the request (released) instead of running all n again on a
 * spare member. Against the fake Gemini API, whose answer per call is set in order (`outcomes`).
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { GeminiImageProvider } from '../../server/providers/gemini/gemini-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageEvents, ImageJob, UpstreamAccount } from '../../server/providers/types.ts';
import { startGeminiFake, type GeminiFake, type ImageOutcome } from '../fakes/gemini.ts';
import { imageParams } from '../support/image-params.ts';

let fake: GeminiFake;
/** The outcomes of the next calls that get past the fake's faults, in order of arrival; then `ok`. */
const outcomes: ImageOutcome[] = [];
beforeAll(async () => {
  fake = await startGeminiFake({ apiKeys: ['gm-test'], outcome: () => outcomes.shift() ?? 'ok' });
});
afterAll(async () => fake?.close());
beforeEach(() => {
  fake.faults.clear();
  fake.counts.generate = 0;
  outcomes.length = 0;
});

const account = (): UpstreamAccount => ({ memberId: 'mem_gemini', provider: 'gemini', baseUrl: `${fake.url}/v1beta`, credentials: { api_key: 'gm-test' }, modelMap: {} });
const job = (n: number): ImageJob => ({ operation: 'generation', model: 'gemini-2.5-flash-image', prompt: 'bananas', n, slots: n, inputs: [], params: imageParams() });

/** Runs the adapter with all n calls at once; the indexes of the images it handed over and what it threw. */
async function run(n: number) {
  const delivered: number[] = [];
  const events: ImageEvents = { partial: async () => undefined, image: async (index) => void delivered.push(index) };
  const error = await new GeminiImageProvider().generate(account(), job(n), new AbortController().signal, events).then(
    () => undefined,
    (err: unknown) => err,
  );
  return { delivered, error: error as ProviderError | undefined };
}

describe('Gemini n>1: one call answered 200 without an image, another refused before acceptance', () => {
  const cases: { what: string; outcome: ImageOutcome; refuse: (fake: GeminiFake) => void; thrown: [string, string] }[] = [
    { what: 'NO_IMAGE next to a 429', outcome: 'no-image', refuse: (f) => f.rateLimitNext('generate', 5), thrown: ['failed', 'NO_IMAGE'] },
    { what: 'text only next to a 503', outcome: 'text-only', refuse: (f) => f.serverErrorNext('generate', 503), thrown: ['failed', 'STOP'] },
    { what: 'a blocked image next to a 429', outcome: 'block-image', refuse: (f) => f.rateLimitNext('generate', 5), thrown: ['policy', 'IMAGE_SAFETY'] },
  ];
  for (const { what, outcome, refuse, thrown } of cases) {
    it(`${what}: throws the answered call's failure as maybe accepted, so the work is not moved`, async () => {
      refuse(fake);
      outcomes.push(outcome);
      const { delivered, error } = await run(2);
      expect(delivered).toEqual([]);
      expect(error).toBeInstanceOf(ProviderError);
      expect([error!.kind, error!.upstreamCode, error!.maybeAccepted]).toEqual([...thrown, true]);
      expect(fake.counts.generate).toBe(2);
    });
  }

  it("hands over the image that came back and still throws the answered call's failure, maybe accepted", async () => {
    fake.serverErrorNext('generate', 503);
    outcomes.push('no-image');
    const { delivered, error } = await run(3);
    expect(delivered).toEqual([0]);
    expect([error!.kind, error!.upstreamCode, error!.maybeAccepted]).toEqual(['failed', 'NO_IMAGE', true]);
    expect(fake.counts.generate).toBe(3);
  });

  it('a 200 without an image alone is maybe accepted too', async () => {
    outcomes.push('no-image');
    const { delivered, error } = await run(1);
    expect(delivered).toEqual([]);
    expect([error!.kind, error!.upstreamCode, error!.maybeAccepted]).toEqual(['failed', 'NO_IMAGE', true]);
  });
});
