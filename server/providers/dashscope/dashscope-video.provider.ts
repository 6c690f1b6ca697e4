/**
 * Provider kind `dashscope`, videos: Alibaba Cloud Model Studio (DashScope) video synthesis — Wan,
 * HappyHorse and the other vendors Model Studio hosts on the same endpoints (upstream-apis.md §10.5).
 *
 *   submit    POST {host}/api/v1/services/aigc/video-generation/video-synthesis (keyframe models:
 *             …/aigc/image2video/video-synthesis) with `X-DashScope-Async: enable` (DashScope's HTTP
 *             API is async only), a JSON body streamed with its inputs → `output.task_id`
 *   poll      GET {host}/api/v1/tasks/{id}: PENDING | RUNNING (| SUSPENDED, which the Python SDK
 *             also waits through) → running; SUCCEEDED → `output.video_url`; FAILED (its `code` and
 *             `message` in `output`, or at the top level: sources disagree, both are read),
 *             CANCELED, UNKNOWN (the id expired after 24 hours, or DashScope never issued it) → failed
 *   download  the `video_url` (OSS, another host: the key is not sent), streamed; it lives 24 hours,
 *             and a link that is gone fails the task (refunded)
 *   cancel    POST {host}/api/v1/tasks/{id}/cancel: DashScope cancels PENDING tasks only; a running
 *             one is reported as not cancellable and runs to its end (its result never collected)
 *
 * Which body a model takes follows from its upstream model id, the way Alibaba names and splits
 * them (no table of models here; the official Python SDK also routes `kf2v` models by name):
 *
 *   Wan 2.1–2.6 (`wan2.x-…`, `wanx2.1-…`)   the legacy protocol, frozen at 2.6 by Alibaba:
 *       t2v       `input.prompt`, `parameters.size` "W*H" (the tier's size of the asked ratio)
 *       i2v       `input.img_url`, `parameters.resolution` (the output takes the frame's ratio)
 *       kf2v      image2video endpoint, `input.first_frame_url` and `last_frame_url`
 *   anything else (wan2.7+, HappyHorse, …)  the new protocol: `input.media[]` of `{type, url}` —
 *       `first_frame`, `last_frame`, `reference_image` — and `parameters.resolution`, `ratio` (not
 *       with a frame: the frame decides), `duration`, `audio`
 *
 * Every body also has `duration`, `audio` (DashScope ignores it where the model has no switch),
 * `prompt_extend: false` (the client's prompt is used as written, not rewritten by an LLM) and
 * `watermark` (false unless the member says `?watermark=true`); `negative_prompt` goes in `input`.
 * The task name in the id says what a model needs: `i2v` and `kf2v` a first frame, `r2v` reference
 * images — a task without them fails before any upstream call, refunded (the catalog cannot require
 * an input). What each model accepts (durations, resolutions, ratios, frames, reference images,
 * audio) is its catalog definition; `check` refuses what no DashScope model can express.
 *
 * Inputs are short-lived signed Mediagate URLs (`signedUrl`), which DashScope downloads at submit; a
 * member with `?inline_media=true` sends base64 data URLs instead where the body takes them (the
 * legacy fields; the new protocol's media take URLs only). DashScope documents no idempotency key: a
 * resubmit after a crash is the runner's intent marker's business.
 */
import {
  ProviderError,
  dataUrl,
  downloadOutput,
  jobStatus,
  jsonStream,
  kindOfStatus,
  readJson,
  retryAfterMs,
  sanitizeMessage,
  shapeOf,
  signedUrl,
  upstreamFetch,
  type Base64Source,
  type MediaInput,
  type UpstreamAccount,
  type UpstreamResponse,
  type VideoContent,
  type VideoJob,
  type VideoOutputRef,
  type VideoProvider,
  type VideoShape,
  type VideoStatus,
} from '../kit.ts';
import { dashscopeAuth, dashscopeEndpoint, dashscopeError, dashscopeErrorOf, dashscopeOrigin, dashscopeUrl, type DashScopeErrorBody } from './dashscope-api.ts';

/** Alibaba suggests polling video tasks every 15 seconds. */
export const DASHSCOPE_POLL_MS = 15_000;

const RATIOS = ['16:9', '9:16', '1:1', '4:3', '3:4'];
const RESOLUTIONS = ['480p', '720p', '1080p'];
/** Wan 2.6/2.7 start at 2 s; every model ends at 15 s. */
const DURATIONS = { min: 2, max: 15 };
/** HappyHorse r2v takes up to 9 reference images. */
const MAX_REFERENCE_IMAGES = 9;

/** The legacy text-to-video sizes per tier and ratio (Alibaba's tables: `W*H`). */
const LEGACY_SIZES: Record<string, Record<string, string>> = {
  '480p': { '16:9': '832*480', '9:16': '480*832', '1:1': '624*624' },
  '720p': { '16:9': '1280*720', '9:16': '720*1280', '1:1': '960*960', '4:3': '1088*832', '3:4': '832*1088' },
  '1080p': { '16:9': '1920*1080', '9:16': '1080*1920', '1:1': '1440*1440', '4:3': '1632*1248', '3:4': '1248*1632' },
};

/** Input image limits of each body (Alibaba's references); a model may be stricter (DashScope says so then). */
const IMAGE_LIMITS = {
  legacy: { minSide: 360, maxSide: 2000, maxBytes: 10 * 1024 * 1024, maxRatio: Infinity },
  keyframe: { minSide: 240, maxSide: 8000, maxBytes: 10 * 1024 * 1024, maxRatio: Infinity },
  media: { minSide: 240, maxSide: 8000, maxBytes: 20 * 1024 * 1024, maxRatio: 8 },
} as const;

/** The input formats Wan's references list. */
const IMAGE_TYPES = ['image/jpeg', 'image/png', 'image/bmp', 'image/webp'];

const status = jobStatus({ running: ['PENDING', 'RUNNING', 'SUSPENDED'], succeeded: ['SUCCEEDED'], failed: ['FAILED', 'CANCELED', 'UNKNOWN'] }, 'DashScope task');

export type DashScopeBody = 'legacy' | 'keyframe' | 'media';
export type DashScopeTaskName = 't2v' | 'i2v' | 'kf2v' | 'r2v';

export interface DashScopeRouting {
  body: DashScopeBody;
  path: string;
  /** What the model id says it does, when it says. */
  task?: DashScopeTaskName;
}

/** Where a job of `model` goes and which body it takes, from the model id's own structure. */
export function dashscopeRouting(model: string): DashScopeRouting {
  const task = /(?:^|[-_/.])(t2v|i2v|kf2v|r2v)(?=$|[-_.])/.exec(model)?.[1] as DashScopeTaskName | undefined;
  const legacy = /^wanx?2\.[1-6](?=[-.]|$)/.test(model);
  if (legacy && task === 'kf2v') return { body: 'keyframe', path: '/api/v1/services/aigc/image2video/video-synthesis', task };
  return { body: legacy ? 'legacy' : 'media', path: '/api/v1/services/aigc/video-generation/video-synthesis', ...(task && { task }) };
}

interface DashScopeTaskAnswer {
  request_id?: unknown;
  code?: unknown;
  message?: unknown;
  output?: { task_id?: unknown; task_status?: unknown; video_url?: unknown; code?: unknown; message?: unknown } | null;
}

export class DashScopeVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = DASHSCOPE_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (!Number.isInteger(shape.durationSeconds) || shape.durationSeconds < DURATIONS.min || shape.durationSeconds > DURATIONS.max) return `durations of ${DURATIONS.min} to ${DURATIONS.max} seconds only`;
    if (!RATIOS.includes(shape.aspectRatio)) return `aspect ratios ${RATIOS.join(', ')} only`;
    if (!RESOLUTIONS.includes(shape.resolution)) return `resolutions ${RESOLUTIONS.join(', ')} only`;
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    if (shape.referenceImages > MAX_REFERENCE_IMAGES) return `at most ${MAX_REFERENCE_IMAGES} reference images`;
    if (shape.hasLastFrame && !shape.hasFirstFrame) return 'a last frame only together with a first frame';
    if (shape.referenceImages > 0 && shape.hasFirstFrame) return 'frames or reference images, not both';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const unsupported = this.check(shapeOf(job));
    if (unsupported) throw new ProviderError('invalid_request', `DashScope accepts ${unsupported}`);
    const routing = dashscopeRouting(job.model);
    const missing = missingInput(job, routing);
    if (missing) throw new ProviderError('invalid_request', missing);
    const fields = await bodyOf(account, job, routing);
    const { body, length } = jsonStream(fields);
    const res = await upstreamFetch(
      dashscopeUrl(account, routing.path),
      {
        method: 'POST',
        headers: { ...dashscopeAuth(account), 'content-type': 'application/json', 'content-length': String(length), 'X-DashScope-Async': 'enable' },
        body,
        redirect: 'manual',
      },
      signal,
      'video submit',
    );
    if (!res.ok) throw await dashscopeError(account, res, 'video submit', job.model);
    const answer = (await readJson(res)) as DashScopeTaskAnswer | undefined;
    // An error code with a 2xx (a proxy's habit, new-api checks for it too) is still an error.
    if (typeof answer?.code === 'string' && answer.code !== '') throw dashscopeErrorOf(account, answer, 'video submit', { status: res.status, model: job.model });
    const taskId = answer?.output?.task_id;
    if (typeof taskId !== 'string' || taskId === '') throw new ProviderError('retryable', 'the upstream accepted the video task without returning its id', { maybeAccepted: true });
    return taskId;
  }

  async poll(account: UpstreamAccount, taskId: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const res = await upstreamFetch(dashscopeUrl(account, `/api/v1/tasks/${encodeURIComponent(taskId)}`), { headers: dashscopeAuth(account) }, signal, 'video status');
    if (!res.ok) throw statusCallFailure(await dashscopeError(account, res, 'video status'));
    const answer = (await readJson(res)) as DashScopeTaskAnswer | undefined;
    if (answer === undefined) throw new ProviderError('retryable', 'the upstream answered a video status that is not JSON');
    if (!answer.output && typeof answer.code === 'string' && answer.code !== '') throw statusCallFailure(dashscopeErrorOf(account, answer, 'video status', { status: res.status }));
    const word = answer.output?.task_status;
    const state = status(word);
    if (state === 'running') return { state };
    if (state === 'failed') return { state, error: failureOf(account, word, answer) };
    const url = answer.output?.video_url;
    if (typeof url === 'string' && url !== '') return { state, output: { url } };
    return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video task without a video (its link is kept 24 hours)') };
  }

  async download(account: UpstreamAccount, _taskId: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.url) throw new ProviderError('failed', 'the upstream gave no video address');
    return downloadOutput(output.url, signal, {
      authHeaders: dashscopeAuth(account),
      authOrigin: dashscopeOrigin(account),
      // Only the result host's 5xx and 429 come here: the links are never on the API host.
      upstreamError: storageError,
      expiredMessage: "the upstream's link to the video expired before it was downloaded (DashScope keeps videos 24 hours)",
    });
  }

  async cancel(account: UpstreamAccount, taskId: string, signal: AbortSignal): Promise<void> {
    const res = await upstreamFetch(dashscopeUrl(account, `/api/v1/tasks/${encodeURIComponent(taskId)}/cancel`), { method: 'POST', headers: dashscopeAuth(account) }, signal, 'video cancel');
    if (res.ok) {
      res.discard();
      return;
    }
    const err = await dashscopeError(account, res, 'video cancel');
    if (err.upstreamCode !== 'UnsupportedOperation') throw err;
    // Refused for the task's state: it already runs (DashScope cancels PENDING tasks only) and will finish upstream.
    throw new ProviderError('failed', `the upstream cannot cancel a DashScope task that left its queue; it runs to its end (${err.message})`, { upstreamStatus: err.upstreamStatus, upstreamCode: err.upstreamCode });
  }
}

/** What the model's task needs and the job lacks, said to the client; undefined when nothing is missing. */
function missingInput(job: VideoJob, routing: DashScopeRouting): string | undefined {
  const model = `DashScope's model ${job.model}`;
  if ((routing.task === 'i2v' || routing.task === 'kf2v') && !job.firstFrame) return `${model} makes a video from a first frame; send first_frame`;
  if (routing.task === 'r2v' && job.referenceImages.length === 0) return `${model} makes a video from reference images; send reference_images`;
  if (routing.body !== 'media' && job.referenceImages.length > 0) return `${model} (Wan 2.1–2.6) takes no reference images`;
  if (routing.body === 'legacy' && job.lastFrame) return `${model} takes no last frame (Wan's keyframe models, kf2v, do)`;
  return undefined;
}

/** The job's JSON body, its images streamed in (data URLs) or as signed URLs. */
async function bodyOf(account: UpstreamAccount, job: VideoJob, routing: DashScopeRouting): Promise<Record<string, unknown>> {
  const { inlineMedia, watermark } = dashscopeEndpoint(account);
  const resolution = job.resolution.toUpperCase();
  const image = async (media: MediaInput, what: string, body: DashScopeBody): Promise<string | Base64Source> => {
    checkImage(media, what, body);
    // Only the legacy fields take inline base64; the new protocol's media are URLs DashScope fetches.
    return inlineMedia && body !== 'media' ? dataUrl(media) : signedUrl(media);
  };
  const input: Record<string, unknown> = { prompt: job.prompt };
  if (job.negativePrompt) input.negative_prompt = job.negativePrompt;
  const parameters: Record<string, unknown> = {};
  switch (routing.body) {
    case 'legacy':
      if (job.firstFrame && routing.task !== 't2v') {
        input.img_url = await image(job.firstFrame, 'the first frame', 'legacy');
        parameters.resolution = resolution;
      } else {
        const size = LEGACY_SIZES[job.resolution]?.[job.aspectRatio];
        if (!size) throw new ProviderError('invalid_request', `DashScope's model ${job.model} has no ${job.aspectRatio} size at ${job.resolution} (at 480p: 16:9, 9:16 and 1:1)`);
        parameters.size = size;
      }
      break;
    case 'keyframe':
      input.first_frame_url = await image(job.firstFrame!, 'the first frame', 'keyframe');
      if (job.lastFrame) input.last_frame_url = await image(job.lastFrame, 'the last frame', 'keyframe');
      parameters.resolution = resolution;
      break;
    case 'media': {
      const media: { type: string; url: string | Base64Source }[] = [];
      if (job.firstFrame) media.push({ type: 'first_frame', url: await image(job.firstFrame, 'the first frame', 'media') });
      if (job.lastFrame) media.push({ type: 'last_frame', url: await image(job.lastFrame, 'the last frame', 'media') });
      for (const [i, reference] of job.referenceImages.entries()) media.push({ type: 'reference_image', url: await image(reference, `reference image ${i + 1}`, 'media') });
      if (media.length > 0) input.media = media;
      parameters.resolution = resolution;
      // With a first frame the video takes the frame's ratio.
      if (!job.firstFrame) parameters.ratio = job.aspectRatio;
      break;
    }
  }
  Object.assign(parameters, { duration: job.durationSeconds, audio: job.generateAudio, prompt_extend: false, watermark });
  return { model: job.model, input, parameters };
}

/**
 * A status call's own failure (an HTTP error, or an error code without the task) says nothing of
 * the job, which runs on, billed: an answer that reads as a refused request (a 4xx, `InvalidParameter`)
 * refuses the call, not the client's input, and is asked again (until the task's deadline). A task
 * DashScope no longer knows is answered 200 UNKNOWN (read above as failed), never with an error. The
 * other kinds (credentials, a wrong base URL, throttling) keep theirs: the runner retries those too.
 */
function statusCallFailure(err: ProviderError): ProviderError {
  return err.kind === 'invalid_request' || err.kind === 'policy' ? err.with({ kind: 'retryable' }) : err;
}

/** Refuses before any call an image the body's limits exclude (DashScope would refuse it at submit). */
function checkImage(media: MediaInput, what: string, body: DashScopeBody): void {
  // Wan's documented formats. The file service hands a GIF over as a PNG of its first frame, so
  // this refuses only a format the gateway would hand over unconverted one day.
  if (!IMAGE_TYPES.includes(media.contentType)) throw new ProviderError('invalid_request', `DashScope takes JPEG, PNG, BMP or WebP images; ${what} is ${media.contentType}`);
  const limits = IMAGE_LIMITS[body];
  if (media.bytes > limits.maxBytes) throw new ProviderError('invalid_request', `DashScope takes images of at most ${limits.maxBytes / (1024 * 1024)} MB here; ${what} has ${media.bytes} bytes`);
  const { width, height } = media;
  if (width === null || height === null) return;
  const short = Math.min(width, height);
  const long = Math.max(width, height);
  if (short < limits.minSide || long > limits.maxSide) throw new ProviderError('invalid_request', `DashScope takes images of ${limits.minSide} to ${limits.maxSide} px a side here; ${what} is ${width}x${height}`);
  if (long / short > limits.maxRatio) throw new ProviderError('invalid_request', `DashScope takes images between 1:${limits.maxRatio} and ${limits.maxRatio}:1; ${what} is ${width}x${height}`);
}

/** Why a finished task did not succeed: its error code's kind (content inspection, a parameter) or DashScope's failure. */
function failureOf(account: UpstreamAccount, word: unknown, answer: DashScopeTaskAnswer): ProviderError {
  if (word === 'CANCELED') return new ProviderError('failed', 'the upstream task was canceled', { upstreamCode: 'CANCELED' });
  if (word === 'UNKNOWN') return new ProviderError('failed', 'DashScope no longer knows this video task (its task ids expire after 24 hours)', { upstreamCode: 'UNKNOWN' });
  // Alibaba's examples put the error in `output`; the reference at the top level: either is read.
  const error: DashScopeErrorBody = typeof answer.output?.code === 'string' ? answer.output : answer;
  const classified = dashscopeErrorOf(account, error, 'video task');
  const kind = classified.kind === 'policy' || classified.kind === 'invalid_request' ? classified.kind : 'failed';
  return new ProviderError(kind, sanitizeMessage(error.message, 'the upstream reported the video task as failed'), { upstreamCode: classified.upstreamCode });
}

/** The result host's error answer (the only one downloadOutput hands back: 5xx and 429) by its status. */
async function storageError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  res.discard();
  const kind = kindOfStatus(res.status);
  const wait = kind === 'rate_limited' ? retryAfterMs(res.headers) : undefined;
  return new ProviderError(kind, `the upstream ${what} answered HTTP ${res.status}`, { upstreamStatus: res.status, ...(wait !== undefined && { retryAfterMs: wait }) });
}
