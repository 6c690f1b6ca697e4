/**
 * Provider kind `replicate`, videos: any video model on Replicate, run through the catalog model's
 * replicate mapping (kit/mapping.ts; the wire in replicate-api.ts). The member's `api_token` goes
 * as a bearer token; its base URL defaults to https://api.replicate.com/v1.
 *
 *   submit    the mapping's `input` over the request (media as signed Mediagate URLs Replicate
 *             fetches, or data URLs in the body, as the mapping says), created at the endpoint's
 *             path (model, version or deployment), with what is left of the task's lifetime as
 *             its deadline (`Cancel-After`) → the prediction id
 *   poll      GET /predictions/{id}: starting | processing → running; succeeded → the output URL the
 *             mapping's `output` finds (recorded by the runner); failed, canceled (charged by
 *             Replicate) and aborted (not charged) → the task fails, refunded
 *   download  the output URL (replicate.delivery, another origin, expiring an hour after the
 *             prediction: the runner downloads as soon as the poll saw it succeed), no credentials
 *   cancel    POST /predictions/{id}/cancel when the task failed by its deadline
 *
 * A prediction is never waited for in its create call (`wait` is for images). Replicate documents
 * no idempotency key.
 */
import { ProviderError, downloadOutput, videoContext, type UpstreamAccount, type VideoContent, type VideoJob, type VideoOutputRef, type VideoProvider, type VideoShape, type VideoStatus } from '../kit.ts';
import { cdnError } from '../fal/fal-video.provider.ts';
import { cancelPrediction, createPrediction, getPrediction, inputOf, mappingOf, outcomeOf } from './replicate-api.ts';

/** Bifrost's Replicate adapter polls every 2 s; videos take minutes. */
export const REPLICATE_VIDEO_POLL_MS = 5_000;

export class ReplicateVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = REPLICATE_VIDEO_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const mapping = mappingOf(job);
    if (job.referenceVideos.length > 0 || job.referenceAudios.length > 0) throw new ProviderError('invalid_request', 'Replicate accepts no reference videos or audios');
    const input = await inputOf(mapping, videoContext(job));
    return (await createPrediction(account, mapping, input, signal, 'video submit', undefined, job.deadline)).id;
  }

  async poll(account: UpstreamAccount, jobId: string, job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const outcome = await outcomeOf(await getPrediction(account, jobId, signal, 'video status'), mappingOf(job));
    if (outcome.state !== 'succeeded') return outcome;
    const [output] = outcome.outputs;
    // The runner records the output to download it later (a link); a video inside the prediction
    // has none. Replicate inlines files only in sync mode, which videos never use.
    if (typeof output !== 'string') return { state: 'failed', error: new ProviderError('failed', 'the Replicate prediction answered its video inline (a data URL), which the gateway cannot keep for its download') };
    return { state: 'succeeded', output: { url: output } };
  }

  async download(_account: UpstreamAccount, _jobId: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.url) throw new ProviderError('failed', 'the Replicate prediction gave no video address');
    return downloadOutput(output.url, signal, { upstreamError: cdnError, expiredMessage: "Replicate's link to the video expired before it was downloaded" });
  }

  async cancel(account: UpstreamAccount, jobId: string, signal: AbortSignal): Promise<void> {
    await cancelPrediction(account, jobId, signal);
  }
}
