/**
 * Provider kind `replicate`, images: any image model on Replicate, run through the catalog model's
 * replicate mapping, inside the client's synchronous request.
 *
 * With the mapping's `wait` (1–60 s) the create call asks Replicate to hold the answer until the
 * prediction finishes (`Prefer: wait=N`); a prediction still `starting`/`processing` then, or
 * created without `wait`, is polled every 500 ms. A prediction that outlives the client (or
 * REPLICATE_IMAGE_MAX_WAIT_MS) is cancelled. As on fal, the mapping decides how many images one
 * prediction makes (`num_outputs: n`); fewer than `n` are topped up by further predictions. Output
 * files (replicate.delivery, deleted an hour later) are fetched at once, then re-encoded to what
 * the client was promised.
 */
import { fitImage } from '../image-output.ts';
import { ProviderError, imageContext, type ImageEvents, type ImageJob, type ImageProvider, type UpstreamAccount, type UpstreamMapping } from '../kit.ts';
import { fetchImage } from '../fal/fal-image.provider.ts';
import { cancelPrediction, createPrediction, getPrediction, inputOf, mappingOf, outcomeOf, type Prediction } from './replicate-api.ts';

export const REPLICATE_IMAGE_POLL_MS = 500;
export const REPLICATE_IMAGE_MAX_WAIT_MS = 5 * 60_000;

export class ReplicateImageProvider implements ImageProvider {
  constructor(
    private readonly pollMs = REPLICATE_IMAGE_POLL_MS,
    private readonly maxWaitMs = REPLICATE_IMAGE_MAX_WAIT_MS,
  ) {}

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const mapping = mappingOf(job);
    const request = imageContext(job);
    let delivered = 0;
    while (delivered < job.n) {
      signal.throwIfAborted();
      request.context.n = job.n - delivered;
      const input = await inputOf(mapping, request);
      const created = await createPrediction(account, mapping, input, signal, 'image submit', mapping.wait);
      const urls = await this.waitForOutput(account, created, mapping, signal);
      let got = 0;
      for (const url of urls) {
        if (delivered >= job.n) break;
        const image = await fetchImage(url, signal, 'Replicate');
        await events.image(delivered++, { image: await fitImage(image, job.params) });
        got++;
      }
      if (got === 0) throw new ProviderError('retryable', 'the Replicate prediction succeeded without an image');
    }
  }

  private async waitForOutput(account: UpstreamAccount, created: Prediction & { id: string }, mapping: UpstreamMapping, signal: AbortSignal): Promise<string[]> {
    const deadline = Date.now() + this.maxWaitMs;
    let prediction: Parameters<typeof outcomeOf>[0] = created;
    let timedOut = false;
    try {
      for (;;) {
        const outcome = await outcomeOf(prediction, mapping);
        if (outcome.state === 'failed') throw outcome.error;
        if (outcome.state === 'succeeded') return outcome.urls;
        if (Date.now() > deadline) {
          timedOut = true;
          throw new ProviderError('retryable', `the Replicate prediction did not finish within ${Math.round(this.maxWaitMs / 1000)} s`);
        }
        await sleep(this.pollMs, signal);
        prediction = await getPrediction(account, created.id, signal, 'image status');
      }
    } catch (err) {
      // Nobody will collect it: stop it spending the account's credit (best effort).
      if (signal.aborted || timedOut) void cancelPrediction(account, created.id, AbortSignal.timeout(10_000)).catch(() => undefined);
      throw err;
    }
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
