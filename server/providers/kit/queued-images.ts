/**
 * Image models behind a job queue (the aggregators: fal's queue, Replicate's predictions), run
 * inside the client's synchronous request: submit a job for the images still owed, look at it every
 * `pollMs` until it is done, fetch its output images; jobs that make fewer than `n` images are
 * topped up by further jobs.
 *
 * A job, once accepted, is billed by the upstream whether or not it is collected, and an error out
 * of here sends the request to another member (or a later attempt) with a NEW job. So a look that
 * meets a passing error (a 5xx or 429 of the status or result call, an error answer that could not
 * be read) is tried again until `maxWaitMs`, as fal-js and Replicate's SDK retry their polls, and
 * an output download gets a few attempts. A job given up on for any reason (the client left,
 * `maxWaitMs`, an error that asking again cannot fix) is cancelled, best effort, so that nobody's
 * credit is spent on images no one will collect: what it cost until then is spent either way, and
 * it will deliver nothing, so a new job elsewhere is the request's only way to its images. A finished job whose output could not be fetched in passing is not given up on: its
 * error says the job is kept (`ProviderError.jobKept`), and a background task's next try collects
 * it instead of paying for another.
 *
 * A background task's jobs are recorded as they are accepted (`ImageEvents.submitted`, with the
 * queue's `refOf`): a run that stops while one is running (the process died, the engine stopped,
 * the lease was lost) leaves that job alone, and the task's next run waits for it (`ImageJob.resume`,
 * `revive`) instead of paying for another.
 *
 * A job's outputs are links to fetch, or images its answer carried inline (data URLs, decoded while
 * the answer was read: readJsonWithMedia), which need no fetching.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { fitImage, readBounded } from '../image-output.ts';
import { ProviderError, asProviderError } from '../provider-error.ts';
import type { ImageEvents, ImageJob } from '../types.ts';
import { upstreamFetch, type InlineMedia } from '../upstream-http.ts';

/** Largest image fetched from an output URL. */
const MAX_IMAGE_BYTES = 64 * 1024 * 1024;

/** Attempts at one output image on a passing failure (the CDN's 5xx, 429, a dropped connection). */
const DOWNLOAD_ATTEMPTS = 3;
/** Longest pause between two of those attempts (a longer Retry-After ends them). */
const MAX_DOWNLOAD_PAUSE_MS = 10_000;

/** One upstream's queue, as the loop needs it. */
export interface ImageQueue<Job> {
  /** The upstream's name in messages ("fal", "Replicate"). */
  name: string;
  /** Submits a job for `n` images (n goes into the mapping's context). */
  submit(n: number, signal: AbortSignal): Promise<Job>;
  /** One look at the job (`first`: right after submit): its outputs once done, `undefined` while it runs; throws its failure (a transient ProviderError: the look failed, not the job). */
  check(job: Job, first: boolean, signal: AbortSignal): Promise<ImageOutput[] | undefined>;
  cancel(job: Job, signal: AbortSignal): Promise<void>;
  /** A JSON reference to the job, for `ImageEvents.submitted`. */
  refOf(job: Job): unknown;
  /** The job a reference names (`ImageJob.resume`), or undefined when it is not one of this queue's. */
  revive(ref: unknown): Job | undefined;
}

/** An output of a job: the URL of an image to fetch, or the image its answer carried. */
export type ImageOutput = string | InlineMedia;

export interface QueueTiming {
  pollMs: number;
  maxWaitMs: number;
}

export async function generateQueuedImages<Job>(queue: ImageQueue<Job>, job: ImageJob, signal: AbortSignal, events: ImageEvents, timing: QueueTiming): Promise<void> {
  let delivered = 0;
  // An earlier run's job goes first; its images count like those of any job (fewer: topped up).
  let resumed = job.resume === undefined ? undefined : queue.revive(job.resume);
  while (delivered < job.n) {
    signal.throwIfAborted();
    const fresh = resumed === undefined;
    const submitted = resumed ?? (await queue.submit(job.n - delivered, signal));
    resumed = undefined;
    if (fresh && events.submitted) {
      try {
        await events.submitted(queue.refOf(submitted));
      } catch (err) {
        // Not recorded, so never collected: stop it.
        void queue.cancel(submitted, AbortSignal.timeout(10_000)).catch(() => undefined);
        throw err;
      }
    }
    const kept = events.submitted !== undefined;
    const outputs = await waitForOutputs(queue, submitted, signal, timing, { fresh, kept });
    let got = 0;
    for (const output of outputs) {
      if (delivered >= job.n) break;
      const image = typeof output === 'string' ? await downloadWithRetries(output, signal, queue.name).catch(keptJob) : output.bytes;
      await events.image(delivered++, { image: await fitImage(image, job.params) });
      got++;
    }
    // The job ran (and was paid for): another member must not run it again.
    if (got === 0) throw new ProviderError('retryable', `the ${queue.name} job completed without an image`, { maybeAccepted: true });
  }
}

/**
 * Looks at the job until it is done. `fresh`: submitted by this run (the first look may use what the
 * submit answered); `kept`: recorded for a later run, so an abort leaves it running.
 */
async function waitForOutputs<Job>(queue: ImageQueue<Job>, job: Job, signal: AbortSignal, { pollMs, maxWaitMs }: QueueTiming, { fresh, kept }: { fresh: boolean; kept: boolean }): Promise<ImageOutput[]> {
  const deadline = Date.now() + maxWaitMs;
  try {
    for (let first = fresh; ; first = false) {
      let wait = pollMs;
      try {
        const outputs = await queue.check(job, first, signal);
        if (outputs) return outputs;
      } catch (err) {
        if (signal.aborted) throw err;
        // A look that failed in passing says nothing of the job, which goes on (and is billed): look
        // again. (An error answer whose body broke off is such a look: `unreadAnswer`, retryable.)
        const error = asProviderError(err, `the ${queue.name} image status failed`);
        if (!error.transient || Date.now() > deadline) throw error;
        wait = Math.max(pollMs, error.retryAfterMs ?? 0);
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new ProviderError('retryable', `the ${queue.name} image job did not complete within ${Math.round(maxWaitMs / 1000)} s`);
      // A long Retry-After never holds the request (or a task's lease) past the wait: one last look at its end.
      await sleep(Math.min(wait, left), undefined, { signal });
    }
  } catch (err) {
    // A recorded job whose run stopped is the task's next run's to collect.
    if (kept && signal.aborted) throw err;
    // Nobody will collect it: stop it spending the account's credit (not awaited by the client). A
    // job that has already ended is no error to cancel (fal: ALREADY_COMPLETED; Replicate: as it was).
    void queue.cancel(job, AbortSignal.timeout(10_000)).catch(() => undefined);
    throw err;
  }
}

/**
 * A passing failure met while collecting a job that is neither cancelled nor gone (here: a finished,
 * paid-for job whose output could not be fetched): thrown as kept (`ProviderError.jobKept`), for a
 * later call to collect the job. Anything else (a link that is gone) is thrown as it is.
 */
export function keptJob(err: unknown): never {
  if (!(err instanceof ProviderError) || !err.transient) throw err;
  throw err.with({ jobKept: true });
}

/** An output image, tried again on a passing failure: the job that made it is paid for and done. */
export async function downloadWithRetries(url: string, signal: AbortSignal, provider: string): Promise<Buffer> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetchOutputImage(url, signal, provider);
    } catch (err) {
      if (!(err instanceof ProviderError) || !err.transient || signal.aborted || attempt >= DOWNLOAD_ATTEMPTS) throw err;
      // A CDN asking to wait longer than a short pause fails the download now rather than holding the request.
      const wait = Math.max(250 * attempt, err.retryAfterMs ?? 0);
      if (wait > MAX_DOWNLOAD_PAUSE_MS) throw err;
      await sleep(wait, undefined, { signal });
    }
  }
}

/**
 * An output image: a data URL decoded, or a link fetched without credentials (another origin),
 * following its redirects wherever they go (a CDN, signed storage). A link that is gone is permanent.
 */
export async function fetchOutputImage(url: string, signal: AbortSignal, provider: string): Promise<Buffer> {
  if (url.startsWith('data:')) {
    const comma = url.indexOf(',');
    if (comma < 0 || !/;base64$/i.test(url.slice(0, comma))) throw new ProviderError('failed', `the ${provider} result holds a data URL that is not base64`);
    // Line breaks and spaces are allowed (wrapped base64; readJsonWithMedia leaves such a string as
    // it is); anything else outside the alphabets is a result that asking again cannot mend.
    const data = url.slice(comma + 1).replace(/\s+/g, '');
    if (!/^[A-Za-z0-9+/_-]*={0,2}$/.test(data)) throw new ProviderError('failed', `the ${provider} result holds a data URL that is not valid base64`);
    return Buffer.from(data, 'base64');
  }
  const res = await upstreamFetch(url, { headers: { Accept: 'image/*' }, redirect: 'anywhere' }, signal, 'image download');
  if (!res.ok) {
    res.discard();
    if (res.status === 429 || res.status >= 500) throw new ProviderError(res.status === 429 ? 'rate_limited' : 'retryable', `the ${provider} image download answered HTTP ${res.status}`, { upstreamStatus: res.status });
    throw new ProviderError('failed', `the ${provider} link to the image answered HTTP ${res.status} (expired or gone)`, { upstreamStatus: res.status });
  }
  return readBounded(res, MAX_IMAGE_BYTES, signal, 'image download');
}
