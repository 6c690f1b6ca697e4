/**
 * Provider kind `fal`, images: any image model on fal.ai, run through the catalog model's fal
 * mapping, inside the client's synchronous request.
 *
 * DECISION: through the queue (submit, then a status check every 500 ms as fal-js does, then the
 * result), not fal's synchronous host (`fal.run`): one base URL per member for both kinds, the
 * same errors and status words as videos, and a request given up on (the client left,
 * FAL_IMAGE_MAX_WAIT_MS, an error that asking again cannot fix) is cancelled instead of left running
 * on the account; a status check or result read that meets a 5xx or 429 is asked again, as fal-js
 * does. The reference (§7.1) documents only the queue.
 *
 * The mapping decides how many images one request asks for (`num_images: n`, say) and where its
 * result lists them (`images.url`); when a request yields fewer than `n`, further requests are made
 * for the rest, so a mapping without `n` still delivers `n` images (charged per delivered image).
 * Each output is fetched at once (fal's CDN links; with `sync_mode` the images come inside the
 * result, decoded as it is read) and re-encoded to the size and format the client was promised
 * (`fitImage`).
 */
import { ProviderError, generateQueuedImages, imageContext, type ImageEvents, type ImageJob, type ImageProvider, type UpstreamAccount } from '../kit.ts';
import { mappingOf } from './fal-api.ts';
import { falCancel, falResult, falStatusOf, falSubmit, inputOf } from './fal-queue.ts';

export const FAL_IMAGE_POLL_MS = 500;
export const FAL_IMAGE_MAX_WAIT_MS = 5 * 60_000;

export class FalImageProvider implements ImageProvider {
  constructor(
    private readonly pollMs = FAL_IMAGE_POLL_MS,
    private readonly maxWaitMs = FAL_IMAGE_MAX_WAIT_MS,
  ) {}

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const mapping = mappingOf(job);
    const request = imageContext(job);
    const queue = {
      name: 'fal',
      submit: async (n: number, signal: AbortSignal) => {
        request.context.n = n;
        return falSubmit(account, mapping, await inputOf(mapping, request), signal, 'image submit');
      },
      check: async (jobId: string, _first: boolean, signal: AbortSignal) => {
        const progress = await falStatusOf(account, jobId, signal, 'image status');
        if (progress.state === 'failed') throw progress.error;
        if (progress.state !== 'completed') return undefined;
        // A request whose status said it failed has nothing more to wait for: a passing error of its result is not asked again.
        const result = await falResult(account, jobId, mapping, signal, 'image result').catch((err: unknown) => {
          throw progress.error && err instanceof ProviderError && err.transient ? progress.error : err;
        });
        if ('error' in result) throw result.error;
        if (progress.error) throw progress.error;
        return result.outputs;
      },
      cancel: (jobId: string, signal: AbortSignal) => falCancel(account, jobId, signal),
      refOf: (jobId: string) => jobId,
      revive: (ref: unknown) => (typeof ref === 'string' && ref !== '' ? ref : undefined),
    };
    await generateQueuedImages(queue, job, signal, events, { pollMs: this.pollMs, maxWaitMs: this.maxWaitMs });
  }

  async cancel(account: UpstreamAccount, ref: unknown, signal: AbortSignal): Promise<void> {
    if (typeof ref === 'string' && ref !== '') await falCancel(account, ref, signal);
  }
}
