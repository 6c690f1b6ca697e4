/**
 * Provider kind `minimax`, videos: MiniMax Hailuo on MiniMax's open platform (upstream-apis.md
 * §10.4). The member's `base_url` picks the platform: `https://api.minimax.io` (global, the
 * default) or `https://api.minimaxi.com` (mainland China); its `api_key` goes as a bearer token.
 * Two API generations, chosen by the model (minimax-models.ts):
 *
 *   v1 (Hailuo 2.3 / 2.3-Fast / 02, the 01 models)
 *     submit    POST /v1/video_generation: `model`, `prompt`, an integer `duration`, `resolution`
 *               in MiniMax's tiers (`768P`), `prompt_optimizer` (false unless the catalog model asks:
 *               minimax-models.ts), `aigc_watermark: false`, and the images as data URLs:
 *               `first_frame_image`, `last_frame_image`, or the one reference image as
 *               `subject_reference: [{type: character, image: [..]}]` (S2V-01). v1 takes no ratio:
 *               it renders 16:9 from text and a first frame's own ratio from an image, so only 16:9
 *               is sent its way. → `v1/<task_id>`
 *     poll      GET /v1/query/video_generation?task_id=: Preparing | Queueing | Processing →
 *               running; Success → the `file_id` (recorded by the runner); Fail (`Failed` in
 *               MiniMax's own CLI: both are read) → failed, by `base_resp`'s code when it has one
 *     download  GET /v1/files/retrieve?file_id= for a fresh `download_url` (temporary, signed, on
 *               MiniMax's object storage: no credentials go there), streamed; a link that is gone
 *               is permanent
 *   v2 (MiniMax-H3, MiniMax-H3-Max)
 *     submit    POST /v2/video_generation: `content[]` with the text, then the frames as
 *               `{type: image_url, image_url: {url: <data URL>}, role: first_frame | last_frame}`
 *               or the reference images with `role: reference_image`; `resolution` 768P | 2K,
 *               `duration` 4–15, `ratio`, `aigc_watermark: false`. → `v2/<task_id>`
 *     poll      GET /v2/query/video_generation/{id}: `task.status` queued | running → running;
 *               succeeded → `task.content.url` (recorded); failed | cancelled → failed, by
 *               `task.error`'s code
 *     download  the recorded URL, streamed (no credentials); a link that is gone (it is signed
 *               for a while only) is asked for again with the query, once
 *
 * v1 refuses with HTTP 200 and `base_resp.status_code ≠ 0`; v2 with its own envelope, whose code
 * is at the end of its message (minimax-api.ts).
 *
 * Images go as data URLs streamed into the body (`dataUrl` in `jsonStream`), not as signed
 * Mediagate URLs, although MiniMax takes both: a data URL needs no route from MiniMax to this
 * gateway (a gateway behind a firewall, or one MiniMax's China platform cannot reach) and cannot
 * expire in MiniMax's queue; the body is larger, and MiniMax limits images to 20 MB anyway.
 *
 * MiniMax documents no idempotency key and no way to cancel a task: a resubmit after a crash is the
 * runner's intent marker's business, and a task failed by its deadline runs to its end upstream.
 */
import { ProviderError, dataUrl, downloadOutput, jobStatus, jsonStream, kindOfStatus, retryAfterMs, sanitizeMessage, shapeOf } from '../kit.ts';
import type { UpstreamAccount, UpstreamResponse, VideoContent, VideoJob, VideoOutputRef, VideoProvider, VideoShape, VideoStatus } from '../kit.ts';
import { errorOfAnswer, minimaxCall, minimaxErrorOf, v2CodeOf, type MiniMaxAnswer } from './minimax-api.ts';
import { minimaxModel, type MiniMaxModel, type MiniMaxProtocol } from './minimax-models.ts';

/** Hailuo renders for a minute to several; MiniMax's own tools poll every 5 to 20 s. */
export const MINIMAX_POLL_MS = 10_000;

/** What any MiniMax model can be asked for (each model's own limits are its catalog entry's). */
const RESOLUTIONS = ['512p', '720p', '768p', '1080p', '2k'];
/** v2's ratios (v1 takes 16:9 only: see above); `adaptive` is no ratio of the contract. */
const RATIOS = ['21:9', '16:9', '4:3', '1:1', '3:4', '9:16'];
/** v1: 6 or 10 s; v2: 4 to 15 s. */
const DURATIONS = { min: 4, max: 15 };
/** v2 takes up to 9 reference images; v1 one, as S2V-01's subject. */
const MAX_REFERENCE_IMAGES = 9;
/** MiniMax's prompt limits: v1 (Hailuo 02, 2.3, the 01 models) 2,000 characters, v2 (H3) 7,000. */
const MAX_PROMPT_CHARS = { v1: 2000, v2: 7000 } as const;

const v1Status = jobStatus({ running: ['Preparing', 'Queueing', 'Processing'], succeeded: ['Success'], failed: ['Fail', 'Failed'] }, 'Hailuo task');
// `expired`: MiniMax's CLI (src/types/api.ts, src/commands/video/generate.ts) ends a v2 task so.
const v2Status = jobStatus({ running: ['queued', 'running'], succeeded: ['succeeded'], failed: ['failed', 'cancelled', 'expired'] }, 'Hailuo task');

export class MiniMaxVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = MINIMAX_POLL_MS) {}

  check(shape: VideoShape, upstreamModel?: string): string | undefined {
    if (!Number.isInteger(shape.durationSeconds) || shape.durationSeconds < DURATIONS.min || shape.durationSeconds > DURATIONS.max) return `durations of ${DURATIONS.min} to ${DURATIONS.max} seconds only`;
    if (!RATIOS.includes(shape.aspectRatio)) return `aspect ratios ${RATIOS.join(', ')} only`;
    if (!RESOLUTIONS.includes(shape.resolution)) return `resolutions ${RESOLUTIONS.join(', ')} only`;
    if (shape.hasNegativePrompt) return 'no negative prompt';
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    if (shape.referenceImages > MAX_REFERENCE_IMAGES) return `at most ${MAX_REFERENCE_IMAGES} reference images`;
    if (shape.hasLastFrame && !shape.hasFirstFrame) return 'a last frame only together with a first frame';
    if (shape.referenceImages > 0 && shape.hasFirstFrame) return 'frames or reference images, not both';
    // Checked at creation, before any charge: H3 (v2) takes 7,000 characters (MiniMax's CLI,
    // src/video/v2.ts), the v1 models 2,000 (MiniMax answers 2013 after the 202 otherwise). Judged
    // by each member's own upstream model, at creation as when routed; a name that is not one of
    // MiniMax's (whose rules are not known here) is held to the larger limit: MiniMax decides.
    const named = upstreamModel === undefined ? undefined : minimaxModel(upstreamModel);
    const model = named?.known ? named : undefined;
    const maxPrompt = MAX_PROMPT_CHARS[model?.protocol ?? 'v2'];
    if (shape.promptLength > maxPrompt) return `prompts of at most ${maxPrompt} characters${model ? ` on ${model.name}` : ''}`;
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const model = minimaxModel(job.model);
    const unsupported = this.check(shapeOf(job), job.model) ?? modelRule(model, job);
    if (unsupported) throw new ProviderError('invalid_request', `MiniMax accepts ${unsupported}`);
    const body = model.protocol === 'v1' ? v1Body(model, job) : v2Body(model, job);
    const answer = await minimaxCall(account, { method: 'POST', path: `/${model.protocol}/video_generation`, body: jsonStream(body) }, signal, 'video submit');
    const error = errorOfAnswer(answer, 'video submit');
    if (error) throw error;
    const taskId = answer.body?.task_id;
    const id = typeof taskId === 'number' ? String(taskId) : taskId;
    if (typeof id !== 'string' || id === '') throw new ProviderError('retryable', 'the upstream accepted the video task without returning its id', { maybeAccepted: true });
    return `${model.protocol}/${id}`;
  }

  async poll(account: UpstreamAccount, jobId: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const { protocol, taskId } = parseJobId(jobId);
    const path = protocol === 'v1' ? `/v1/query/video_generation?task_id=${encodeURIComponent(taskId)}` : `/v2/query/video_generation/${encodeURIComponent(taskId)}`;
    const answer = await minimaxCall(account, { method: 'GET', path }, signal, 'video status');
    return protocol === 'v1' ? v1Poll(answer) : v2Poll(answer);
  }

  async download(account: UpstreamAccount, jobId: string, output: VideoOutputRef, job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (output.file_id) {
      const answer = await minimaxCall(account, { method: 'GET', path: `/v1/files/retrieve?file_id=${encodeURIComponent(output.file_id)}` }, signal, 'video file lookup');
      const error = errorOfAnswer(answer, 'video file lookup');
      // The file is gone from MiniMax (2013 for a file it does not know): asking again cannot help.
      if (error?.kind === 'invalid_request') throw new ProviderError('failed', `the upstream no longer has the video file (${error.message})`, { upstreamCode: error.upstreamCode });
      if (error) throw error;
      const file = answer.body?.file as { download_url?: unknown } | undefined;
      if (typeof file?.download_url !== 'string' || file.download_url === '') throw new ProviderError('failed', 'the upstream gave no video address');
      return fetchVideo(file.download_url, signal);
    }
    if (!output.url) throw new ProviderError('failed', 'the upstream gave no video address');
    try {
      return await fetchVideo(output.url, signal);
    } catch (err) {
      // v2's link is signed for a while only (its query page: download it promptly) and each query
      // signs it anew: a link gone by the time it is fetched (a download retried hours later) is
      // asked for again, once. A task MiniMax no longer answers for keeps the link's own failure.
      if (!(err instanceof ProviderError && err.kind === 'failed')) throw err;
      const fresh = await this.poll(account, jobId, job, signal);
      if (fresh.state !== 'succeeded' || !fresh.output.url || fresh.output.url === output.url) throw err;
      return fetchVideo(fresh.output.url, signal);
    }
  }
}

/** A signed object-storage link: it needs (and gets) no credentials. */
function fetchVideo(url: string, signal: AbortSignal): Promise<VideoContent> {
  return downloadOutput(url, signal, { upstreamError: storageError, expiredMessage: "the upstream's link to the video expired before it was downloaded" });
}

export function parseJobId(jobId: string): { protocol: MiniMaxProtocol; taskId: string } {
  const m = /^(v1|v2)\/(.+)$/.exec(jobId);
  if (!m) throw new ProviderError('failed', `'${jobId}' is not a MiniMax video job id`);
  return { protocol: m[1] as MiniMaxProtocol, taskId: m[2]! };
}

/** Rules of one model that its catalog definition cannot state. */
function modelRule(model: MiniMaxModel, job: VideoJob): string | undefined {
  const refs = job.referenceImages.length;
  if (model.protocol === 'v1') {
    if (job.aspectRatio !== '16:9') return `only 16:9 on ${model.name} (its output takes a first frame's own ratio)`;
    if (refs > 1) return `one subject reference image on ${model.name}`;
  }
  if (model.needs === 'first-frame' && !job.firstFrame) return `a first frame on its image-to-video model ${model.name}`;
  if (model.needs === 'subject' && refs === 0) return `a subject reference image on ${model.name}`;
  if (model.imageOnlyResolutions?.includes(job.resolution)) {
    if (!job.firstFrame) return `${job.resolution} on ${model.name} only from a first frame`;
    if (job.lastFrame) return `no last frame at ${job.resolution} on ${model.name}`;
  }
  return undefined;
}

/** MiniMax's tier names: `768P`, `2K`. */
const tier = (resolution: string) => resolution.toUpperCase();

function v1Body(model: MiniMaxModel & { promptOptimizer: boolean }, job: VideoJob): Record<string, unknown> {
  return {
    model: model.name,
    prompt: job.prompt,
    duration: job.durationSeconds,
    resolution: tier(job.resolution),
    prompt_optimizer: model.promptOptimizer,
    aigc_watermark: false,
    ...(job.firstFrame && { first_frame_image: dataUrl(job.firstFrame) }),
    ...(job.lastFrame && { last_frame_image: dataUrl(job.lastFrame) }),
    ...(job.referenceImages.length > 0 && { subject_reference: [{ type: 'character', image: job.referenceImages.map(dataUrl) }] }),
  };
}

function v2Body(model: MiniMaxModel, job: VideoJob): Record<string, unknown> {
  const image = (input: NonNullable<VideoJob['firstFrame']>, role: string) => ({ type: 'image_url', image_url: { url: dataUrl(input) }, role });
  const content: unknown[] = [{ type: 'text', text: job.prompt }];
  if (job.firstFrame) content.push(image(job.firstFrame, 'first_frame'));
  if (job.lastFrame) content.push(image(job.lastFrame, 'last_frame'));
  for (const reference of job.referenceImages) content.push(image(reference, 'reference_image'));
  return { model: model.name, content, resolution: tier(job.resolution), duration: job.durationSeconds, ratio: job.aspectRatio, aigc_watermark: false };
}

function v1Poll(answer: MiniMaxAnswer): VideoStatus {
  const status = answer.body?.status;
  const error = errorOfAnswer(answer, 'video status');
  // A failed task carries its reason in base_resp; any other error is the query's own.
  if (error && !(status === 'Fail' || status === 'Failed')) return unknownTaskOr(error);
  switch (v1Status(status)) {
    case 'running':
      return { state: 'running' };
    case 'failed':
      return { state: 'failed', error: taskFailure(error) };
    case 'succeeded': {
      const fileId = answer.body?.file_id;
      const file = typeof fileId === 'number' ? String(fileId) : fileId;
      if (typeof file === 'string' && file !== '') return { state: 'succeeded', output: { file_id: file } };
      return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video task without a video file') };
    }
  }
}

function v2Poll(answer: MiniMaxAnswer): VideoStatus {
  const error = errorOfAnswer(answer, 'video status');
  if (error) return unknownTaskOr(error);
  const task = answer.body?.task as { status?: unknown; content?: { url?: unknown } | null; error?: { code?: unknown; message?: unknown } | null } | undefined;
  switch (v2Status(task?.status)) {
    case 'running':
      return { state: 'running' };
    case 'failed': {
      if (task?.status === 'cancelled') return { state: 'failed', error: new ProviderError('failed', 'the upstream task was cancelled', { upstreamCode: 'cancelled' }) };
      const said = task?.error ? v2CodeOf(task.error) : undefined;
      const failure = said?.code !== undefined ? minimaxErrorOf(said.code, said.message, 'video task') : undefined;
      return { state: 'failed', error: taskFailure(failure, said?.message) };
    }
    case 'succeeded': {
      const url = task?.content?.url;
      if (typeof url === 'string' && url !== '') return { state: 'succeeded', output: { url } };
      return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video task without a video') };
    }
  }
}

/**
 * A query refused as invalid names a task MiniMax does not know (any more): asking again cannot
 * help, and the request was not at fault. Other errors (rate limits, credentials) are thrown.
 */
function unknownTaskOr(error: ProviderError): VideoStatus {
  if (error.kind !== 'invalid_request') throw error;
  return { state: 'failed', error: new ProviderError('failed', `the upstream does not know this video task (${error.message})`, { upstreamCode: error.upstreamCode }) };
}

/** Why a task failed: a content refusal or a refused input keeps its kind; the rest is the upstream's failure. */
function taskFailure(error: ProviderError | undefined, message?: unknown): ProviderError {
  if (error?.kind === 'policy' || error?.kind === 'invalid_request') return error;
  return new ProviderError('failed', error?.message ?? sanitizeMessage(message, 'the upstream reported the video task as failed'), { upstreamCode: error?.upstreamCode });
}

/** An object storage's error answer (downloadOutput hands back only 5xx and 429) by its status. */
async function storageError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  res.discard();
  const kind = kindOfStatus(res.status);
  const wait = kind === 'rate_limited' ? retryAfterMs(res.headers) : undefined;
  return new ProviderError(kind, `the upstream ${what} answered HTTP ${res.status}`, { upstreamStatus: res.status, ...(wait !== undefined && { retryAfterMs: wait }) });
}
