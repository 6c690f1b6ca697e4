/**
 * Provider kind `openai`, videos: the OpenAI `/v1/videos` wire format (upstream-apis.md §2), as
 * served by OpenAI (Sora 2, being retired) and by OpenAI-compatible gateways at a member's
 * `base_url`.
 *
 *   submit    POST {base}/videos, multipart: prompt, model, `seconds` as a STRING ("4" | "8" |
 *             "12"; integers are refused upstream), `size` ("1280x720", …), optional
 *             `input_reference` file (resized to the target size, which the upstream expects);
 *             `Idempotency-Key: <task id>` (OpenAI's SDK convention; an upstream may ignore it)
 *   poll      GET {base}/videos/{id}: queued | in_progress → running, completed → succeeded,
 *             failed → failed with the upstream's error {code, message}
 *   download  GET {base}/videos/{id}/content?variant=video with the bearer key, streamed; a
 *             redirect to signed storage (OpenAI-compatible gateways answer 302) is followed by
 *             hand, the key sent to the member's origin only (`downloadOutput`)
 *
 * What the wire format cannot express (durations other than 4/8/12 s, aspect ratios other than
 * 16:9 and 9:16, a last frame, reference images/videos/audios, a negative prompt) is refused when
 * the task is created (`check`), before anything is charged.
 */
import sharp from 'sharp';
import { downloadOutput } from '../kit/output-download.ts';
import { ProviderError } from '../provider-error.ts';
import { shapeOf, type MediaInput, type UpstreamAccount, type VideoContent, type VideoJob, type VideoProvider, type VideoShape, type VideoStatus } from '../types.ts';
import { readJson, sanitizeMessage, upstreamFetch, upstreamUrl } from '../upstream-http.ts';
import { openaiError, openaiErrorOf } from './openai-errors.ts';

/** The guide suggests polling every 10–20 s. */
export const OPENAI_VIDEO_POLL_MS = 10_000;

const SECONDS = [4, 8, 12] as const;
/** `size` per aspect ratio and resolution; 1080p maps to the large sizes (sora-2-pro class). */
const SIZES: Record<string, Record<string, string>> = {
  '16:9': { '720p': '1280x720', '1080p': '1792x1024' },
  '9:16': { '720p': '720x1280', '1080p': '1024x1792' },
};
const POLICY_CODES = new Set(['moderation_blocked', 'content_policy_violation', 'content_filter']);

interface OpenAIVideo {
  id?: unknown;
  status?: unknown;
  progress?: unknown;
  error?: { code?: unknown; message?: unknown } | null;
}

export class OpenAIVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = OPENAI_VIDEO_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (!(SECONDS as readonly number[]).includes(shape.durationSeconds)) return `durations of ${SECONDS.join(', ')} seconds only`;
    if (!SIZES[shape.aspectRatio]) return `aspect ratios ${Object.keys(SIZES).join(' and ')} only`;
    if (!SIZES[shape.aspectRatio]![shape.resolution]) return `resolutions ${Object.keys(SIZES[shape.aspectRatio]!).join(' and ')} only`;
    if (shape.hasLastFrame) return 'a first frame only (no last frame)';
    if (shape.referenceImages > 0 || shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference images, videos or audios (a first frame only)';
    if (shape.hasNegativePrompt) return 'no negative prompt';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const unsupported = this.check(shapeOf(job));
    if (unsupported) throw new ProviderError('invalid_request', `this upstream accepts ${unsupported}`);
    const size = SIZES[job.aspectRatio]![job.resolution]!;
    const form = new FormData();
    form.set('prompt', job.prompt);
    form.set('model', job.model);
    form.set('seconds', String(job.durationSeconds));
    form.set('size', size);
    if (job.firstFrame) {
      // Resized to the target size (the upstream expects it): what is sent is bounded by `size`,
      // whatever the input's, and the input is read as a stream.
      const [width, height] = size.split('x').map(Number) as [number, number];
      const frame = await resized(job.firstFrame, width, height);
      form.set('input_reference', new Blob([frame], { type: 'image/png' }), 'first_frame.png');
    }
    const res = await upstreamFetch(
      upstreamUrl(account, '/videos'),
      { method: 'POST', headers: { ...auth(account), 'Idempotency-Key': job.taskId }, body: form },
      signal,
      'video submit',
    );
    if (!res.ok) throw await openaiError(res, 'video submit');
    const video = (await readJson(res)) as OpenAIVideo | undefined;
    // Some gateways answer an error envelope with status 200: no job was made, its code and type
    // decide (a refusal is not an answer that may have started a job, to submit again for an hour).
    const hasId = typeof video?.id === 'string' && video.id !== '';
    if (!hasId && typeof video?.error === 'object' && video.error !== null) throw openaiErrorOf(video, 'video submit');
    if (typeof video?.id !== 'string' || video.id === '') throw new ProviderError('retryable', 'the upstream accepted the video job without returning its id', { maybeAccepted: true });
    return video.id;
  }

  async poll(account: UpstreamAccount, jobId: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const res = await upstreamFetch(upstreamUrl(account, `/videos/${encodeURIComponent(jobId)}`), { headers: auth(account) }, signal, 'video status');
    if (res.status === 404) {
      res.discard();
      return { state: 'failed', error: new ProviderError('failed', 'the upstream no longer knows this video job', { upstreamStatus: 404 }) };
    }
    if (!res.ok) throw await openaiError(res, 'video status');
    const video = (await readJson(res)) as OpenAIVideo | undefined;
    switch (video?.status) {
      case 'queued':
      case 'in_progress':
        return { state: 'running', progress: typeof video.progress === 'number' ? video.progress : undefined };
      case 'completed':
        return { state: 'succeeded', output: {} };
      case 'failed': {
        const code = typeof video.error?.code === 'string' ? video.error.code : undefined;
        const message = sanitizeMessage(video.error?.message, 'the upstream reported the video job as failed');
        return { state: 'failed', error: new ProviderError(code && POLICY_CODES.has(code) ? 'policy' : 'failed', message, { upstreamCode: code }) };
      }
      default:
        // An unknown status (or an unreadable body): ask again later rather than guess.
        throw new ProviderError('retryable', `the upstream answered an unknown video status '${String(video?.status)}'`);
    }
  }

  async download(account: UpstreamAccount, jobId: string, _output: unknown, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    const url = upstreamUrl(account, `/videos/${encodeURIComponent(jobId)}/content?variant=video`);
    return downloadOutput(url, signal, {
      authHeaders: { ...auth(account), Accept: 'application/binary' },
      authOrigin: new URL(url).origin,
      upstreamError: openaiError,
      expiredMessage: 'the upstream no longer has this video (its content expired)',
    });
  }
}

/** The input as a PNG of exactly width x height (cropped to fill), read from its stream. */
function resized(input: MediaInput, width: number, height: number): Promise<Buffer> {
  const resize = sharp().resize(width, height, { fit: 'cover' }).png();
  const source = input.open();
  source.once('error', (err) => resize.destroy(err));
  return source.pipe(resize).toBuffer();
}

function auth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_key ?? ''}` };
}
