/**
 * Provider kind `fal`, images: any image model on fal.ai, run through the catalog model's fal
 * mapping, inside the client's synchronous request.
 *
 * DECISION: through the queue (submit, then a status check every 500 ms as fal-js does, then the
 * result), not fal's synchronous host (`fal.run`): one base URL per member for both kinds, the
 * same errors and status words as videos, and a request that outlives the client (or
 * FAL_IMAGE_MAX_WAIT_MS) is cancelled instead of left running on the account. The reference
 * (§7.1) documents only the queue.
 *
 * The mapping decides how many images one request asks for (`num_images: n`, say) and where its
 * result lists them (`images.url`); when a request yields fewer than `n`, further requests are made
 * for the rest, so a mapping without `n` still delivers `n` images (charged per delivered image).
 * Each output is fetched at once (fal's CDN links, or data URLs with `sync_mode`) and re-encoded to
 * the size and format the client was promised (`fitImage`).
 */
import { fitImage, readBounded } from '../image-output.ts';
import { ProviderError, imageContext, upstreamFetch, type ImageEvents, type ImageJob, type ImageProvider, type UpstreamAccount } from '../kit.ts';
import { mappingOf } from './fal-api.ts';
import { falCancel, falResult, falStatusOf, falSubmit, inputOf } from './fal-queue.ts';

export const FAL_IMAGE_POLL_MS = 500;
export const FAL_IMAGE_MAX_WAIT_MS = 5 * 60_000;
/** Largest image fetched from an output URL. */
const MAX_IMAGE_BYTES = 64 * 1024 * 1024;

export class FalImageProvider implements ImageProvider {
  constructor(
    private readonly pollMs = FAL_IMAGE_POLL_MS,
    private readonly maxWaitMs = FAL_IMAGE_MAX_WAIT_MS,
  ) {}

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const mapping = mappingOf(job);
    const request = imageContext(job);
    let delivered = 0;
    while (delivered < job.n) {
      signal.throwIfAborted();
      request.context.n = job.n - delivered;
      const input = await inputOf(mapping, request);
      const jobId = await falSubmit(account, mapping, input, signal, 'image submit');
      const urls = await this.waitForResult(account, jobId, mapping, signal);
      let got = 0;
      for (const url of urls) {
        if (delivered >= job.n) break;
        const image = await fetchImage(url, signal);
        await events.image(delivered++, { image: await fitImage(image, job.params) });
        got++;
      }
      if (got === 0) throw new ProviderError('retryable', 'the fal image request completed without an image');
    }
  }

  /** Polls the request until it completes; cancels it when the client leaves or it takes too long. */
  private async waitForResult(account: UpstreamAccount, jobId: string, mapping: NonNullable<ImageJob['mapping']>, signal: AbortSignal): Promise<string[]> {
    const deadline = Date.now() + this.maxWaitMs;
    let timedOut = false;
    try {
      for (;;) {
        const progress = await falStatusOf(account, jobId, signal, 'image status');
        if (progress.state === 'failed') throw progress.error;
        if (progress.state === 'completed') {
          const result = await falResult(account, jobId, mapping, signal, 'image result');
          if ('error' in result) throw result.error;
          if (progress.error) throw progress.error;
          return result.urls;
        }
        if (Date.now() > deadline) {
          timedOut = true;
          throw new ProviderError('retryable', `the fal image request did not complete within ${Math.round(this.maxWaitMs / 1000)} s`);
        }
        await sleep(this.pollMs, signal);
      }
    } catch (err) {
      if (signal.aborted || timedOut) {
        // Nobody will collect it: stop it spending the account's credit (best effort, not awaited by the client).
        void falCancel(account, jobId, AbortSignal.timeout(10_000)).catch(() => undefined);
      }
      throw err;
    }
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * An output image: a data URL decoded, or a link fetched without credentials (another origin). A
 * link that is gone is permanent.
 */
export async function fetchImage(url: string, signal: AbortSignal, provider = 'fal'): Promise<Buffer> {
  if (url.startsWith('data:')) {
    const comma = url.indexOf(',');
    if (comma < 0 || !/;base64$/i.test(url.slice(0, comma))) throw new ProviderError('failed', `the ${provider} result holds a data URL that is not base64`);
    return Buffer.from(url.slice(comma + 1), 'base64');
  }
  const res = await upstreamFetch(url, { headers: { Accept: 'image/*' } }, signal, 'image download');
  if (!res.ok) {
    res.discard();
    if (res.status === 429 || res.status >= 500) throw new ProviderError(res.status === 429 ? 'rate_limited' : 'retryable', `the ${provider} image download answered HTTP ${res.status}`, { upstreamStatus: res.status });
    throw new ProviderError('failed', `the ${provider} link to the image answered HTTP ${res.status} (expired or gone)`, { upstreamStatus: res.status });
  }
  return readBounded(res, MAX_IMAGE_BYTES, signal, 'image download');
}
