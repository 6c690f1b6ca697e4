/**
 * Provider kind `replicate`, images: any image model on Replicate, run through the catalog model's
 * replicate mapping, inside the client's synchronous request.
 *
 * With the mapping's `wait` (1–60 s) the create call asks Replicate to hold the answer until the
 * prediction finishes (`Prefer: wait=N`); a prediction still `starting`/`processing` then, or
 * created without `wait`, is polled every 500 ms; a GET that meets a 5xx or 429 is asked again (as
 * Replicate's SDK does), not taken for the prediction's end. A prediction given up on (the client
 * left, REPLICATE_IMAGE_MAX_WAIT_MS, an error that asking again cannot fix) is cancelled. As on fal, the mapping decides how many images one
 * prediction makes (`num_outputs: n`); fewer than `n` are topped up by further predictions. Output
 * files (replicate.delivery, deleted an hour later) are fetched at once, or taken from the
 * prediction when it carries them as data URLs (sync mode), then re-encoded to what the client
 * was promised.
 */
import { generateQueuedImages, imageContext, type ImageEvents, type ImageJob, type ImageProvider, type UpstreamAccount } from '../kit.ts';
import { cancelPrediction, createPrediction, getPrediction, inputOf, mappingOf, outcomeOf, type PredictionAnswer } from './replicate-api.ts';

/** A prediction of this request: its id, and its create call's answer (none for one an earlier run made). */
interface Created {
  id: string;
  answer?: PredictionAnswer;
}

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
    const queue = {
      name: 'Replicate',
      submit: async (n: number, signal: AbortSignal): Promise<Created> => {
        request.context.n = n;
        const answer = await createPrediction(account, mapping, await inputOf(mapping, request), signal, 'image submit', mapping.wait);
        return { id: answer.id, answer };
      },
      // The created prediction first (with Prefer: wait it may be done already), then fresh looks.
      check: async (created: Created, first: boolean, signal: AbortSignal) => {
        const outcome = await outcomeOf(first && created.answer ? created.answer : await getPrediction(account, created.id, signal, 'image status'), mapping);
        if (outcome.state === 'failed') throw outcome.error;
        return outcome.state === 'succeeded' ? outcome.outputs : undefined;
      },
      cancel: (created: Created, signal: AbortSignal) => cancelPrediction(account, created.id, signal),
      // A prediction is looked up by its id alone (a resumed one is read afresh: `first` is false).
      refOf: (created: Created) => ({ id: created.id }),
      revive: (ref: unknown): Created | undefined => {
        const id = (ref as { id?: unknown } | null)?.id;
        return typeof id === 'string' && id !== '' ? { id } : undefined;
      },
    };
    await generateQueuedImages(queue, job, signal, events, { pollMs: this.pollMs, maxWaitMs: this.maxWaitMs });
  }

  async cancel(account: UpstreamAccount, ref: unknown, signal: AbortSignal): Promise<void> {
    const id = (ref as { id?: unknown } | null)?.id;
    if (typeof id === 'string' && id !== '') await cancelPrediction(account, id, signal);
  }
}
