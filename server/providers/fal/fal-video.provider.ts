/**
 * Provider kind `fal`, videos: any video model on fal.ai's queue, run through the catalog model's
 * fal mapping (kit/mapping.ts; the wire in fal-api.ts and fal-queue.ts). The member's `api_key`
 * goes as `Authorization: Key …`; its base URL defaults to https://queue.fal.run.
 *
 *   submit    the mapping's `input` over the request, media as it says (signed Mediagate URLs by
 *             default: fal fetches them; data URLs streamed into the body otherwise), POSTed to the
 *             mapping's endpoint → `{owner}/{app}/{request_id}`, with what is left of the task's
 *             lifetime as fal's start timeout (`X-Fal-Request-Timeout`)
 *   poll      the status under `owner/app`; COMPLETED → the result, whose output URL the mapping's
 *             `output` finds (recorded by the runner); a result that is an error answer fails the
 *             task: a 422 `detail[]` as the member's misconfiguration (the whole list in member
 *             health, a generic error for the client), a content refusal as such, a refusal of
 *             the client's frame (too small, unreadable) as the client's, in fal's words, a model
 *             or request error (500 internal_server_error, 503 runner_disconnected, …) as the job's
 *             failure with fal's reason; only a bare 429/5xx of fal's edge is polled again
 *   download  the output URL (fal's CDN, another origin: no credentials), streamed
 *   cancel    PUT …/cancel when the task failed by its deadline
 *
 * What a model accepts (durations, ratios, frames) is its catalog entry's; the adapter refuses only
 * what no mapping can carry (reference videos and audios: the mapping's request has none).
 */
import { ProviderError, downloadOutput, kindOfStatus, retryAfterMs, videoContext, type UpstreamAccount, type UpstreamResponse, type VideoContent, type VideoJob, type VideoOutputRef, type VideoProvider, type VideoShape, type VideoStatus } from '../kit.ts';
import { mappingOf } from './fal-api.ts';
import { falCancel, falResult, falStatusOf, falSubmit, inputOf } from './fal-queue.ts';

/** fal video models take one to several minutes; fal-js polls every 500 ms, which is for images. */
export const FAL_VIDEO_POLL_MS = 5_000;

export class FalVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = FAL_VIDEO_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const mapping = mappingOf(job);
    const unsupported = this.check({ referenceVideos: job.referenceVideos.length, referenceAudios: job.referenceAudios.length } as VideoShape);
    if (unsupported) throw new ProviderError('invalid_request', `fal accepts ${unsupported}`);
    const input = await inputOf(mapping, videoContext(job));
    // A request still queued when its task is given up on never starts (and is never billed).
    return falSubmit(account, mapping, input, signal, 'video submit', job.deadline);
  }

  async poll(account: UpstreamAccount, jobId: string, job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const progress = await falStatusOf(account, jobId, signal, 'video status');
    if (progress.state !== 'completed') return progress.state === 'running' ? { state: 'running' } : progress;
    const mapping = mappingOf(job);
    let result: Awaited<ReturnType<typeof falResult>>;
    try {
      result = await falResult(account, jobId, mapping, signal, 'video result');
    } catch (err) {
      // A request whose status said it failed has nothing more to wait for: a passing error of its result is not asked again.
      if (progress.error && err instanceof ProviderError && err.transient) return { state: 'failed', error: progress.error };
      throw err;
    }
    if ('error' in result) return { state: 'failed', error: result.error };
    if (progress.error) return { state: 'failed', error: progress.error };
    const [output] = result.outputs;
    // The runner records the output to download it later (a link); a video inside the result has none.
    if (typeof output !== 'string') {
      return { state: 'failed', error: new ProviderError('misconfigured', `fal answered the video of ${mapping.endpoint} inside its result (a data URL: sync_mode); the gateway takes videos by their link, so the mapping must not ask for sync_mode`, { upstreamCode: 'mapping' }) };
    }
    return { state: 'succeeded', output: { url: output } };
  }

  async download(_account: UpstreamAccount, _jobId: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.url) throw new ProviderError('failed', 'the fal result gave no video address');
    // fal's media CDN: a public link that needs (and gets) no credentials.
    return downloadOutput(output.url, signal, { upstreamError: cdnError, expiredMessage: "fal's link to the video expired before it was downloaded" });
  }

  async cancel(account: UpstreamAccount, jobId: string, signal: AbortSignal): Promise<void> {
    await falCancel(account, jobId, signal);
  }
}

/** The CDN's error answer (downloadOutput hands back only 5xx and 429) by its status. */
export async function cdnError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  res.discard();
  const kind = kindOfStatus(res.status);
  const wait = kind === 'rate_limited' ? retryAfterMs(res.headers) : undefined;
  return new ProviderError(kind, `the upstream ${what} answered HTTP ${res.status}`, { upstreamStatus: res.status, ...(wait !== undefined && { retryAfterMs: wait }) });
}
