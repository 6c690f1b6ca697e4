/**
 * Provider kind `kling`, videos: Kling AI's video API (upstream-apis.md §6, §10.2), four endpoints
 * of one family, chosen by the job's shape and model:
 *
 *   omni-video          the omni models (`kling-v3-omni`, `kling-video-o1`): frames as
 *                       `image_list: [{image_url, type: first_frame|end_frame}]`, reference images
 *                       as `image_list: [{image_url}]`, `sound on|off`, `aspect_ratio` only without a
 *                       first frame (Kling takes the frame's); no `negative_prompt` field: Kling says
 *                       the omni prompt carries positive and negative descriptions, so a negative
 *                       prompt is appended to it as one ("Avoid: …"), shortened or left out
 *                       where the two would pass Kling's 2,500 characters (`omniPrompt`)
 *   multi-image2video   reference images (up to 4): `image_list: [{image}]`, `aspect_ratio`
 *   image2video         a first frame `image` and an optional last frame `image_tail`; no
 *                       `aspect_ratio` (the frame's)
 *   text2video          the rest, with `aspect_ratio`
 *
 * Every body has `model_name`, `prompt`, `negative_prompt` (but omni), `duration` as a STRING,
 * `mode` and `external_task_id` = the task id, and `sound: "on"` when audio is asked for (the
 * catalog offers audio only on models that have it; Kling's default is off; omni-video always gets
 * `sound`, `on` or `off`). Images go as raw
 * base64 WITHOUT a `data:` prefix, streamed into the body (`inlineBase64`, `jsonStream`); a WebP
 * input (Kling takes JPEG and PNG) is converted to PNG first.
 *
 * The mode is data, chosen by the catalog model through its upstream model id: a trailing `-std` or
 * `-pro` (`kling-v3-pro` → `model_name: kling-v3, mode: pro`); without one no `mode` is sent (Kling's
 * default). No Kling model name ends so, and the shipped definitions (catalog/definitions/kling/)
 * use the convention, so the catalog id is the upstream id and a member needs no model map.
 *
 * The saved job id is `<endpoint>/<task_id>`: a poll goes to `GET /v1/videos/<endpoint>/<task_id>`,
 * where the task lives, whatever the catalog or the member's model map say by then.
 *
 * No double submit: a resubmit (`VideoJob.resubmit`: an earlier submit's answer never came) first
 * looks the task up by its external id (`lookUpExternalId`: as a query parameter, then in the path) and,
 * when an earlier submit's answer was lost (a crash, a timeout) but Kling made the task, answers
 * that task's id without creating anything (even a task that failed risk control: its poll says
 * why). Only then is the task created: Kling's answer to a second create with a taken
 * external_task_id is not documented, and a resubmit refused for another reason first (1102: the
 * pack the first task used up; 1303: the concurrency it holds) would never have looked. A lookup
 * that fails in passing or for the member (429, 5xx, no answer, credentials, the account) is thrown
 * as it is, never as the client's refusal: no create was sent (the runner resubmits to the same
 * member anyway, and a first submit may go to another); one Kling refuses as a request (neither
 * form known to it) lets the create go ahead as before. A create refused as an invalid parameter is
 * looked up once more (a create still under way at the first look, carried out since, is refused
 * as a duplicate: ASSUMPTION, 1201): found, its id is answered; a lookup that fails is thrown,
 * marked as possibly accepted, so the runner asks the same member again rather than failing the
 * task while Kling runs it; only Kling's "no such task" lets the refusal stand.
 *
 *   poll      `submitted | processing` → running, `succeed` → the first video's `url`,
 *             `failed` → `task_status_msg` as the reason; an answer with an error code and the
 *             failed task in `data` (risk control: 1301 at HTTP 200) fails it with the code's kind
 *   download  the video's CDN URL, no credentials (`downloadOutput`); a link that is gone is
 *             permanent. Kling purges outputs after 30 days; the gateway downloads at once.
 *
 * Kling documents no way to cancel a task: no `cancel`.
 */
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { Base64Source, ProviderError, downloadOutput, inlineBase64, jobStatus, jsonStream, kindOfStatus, retryAfterMs, sanitizeMessage, shapeOf } from '../kit.ts';
import type { MediaInput, UpstreamAccount, UpstreamResponse, VideoContent, VideoJob, VideoOutputRef, VideoProvider, VideoShape, VideoStatus } from '../kit.ts';
import { KlingTokens } from './kling-auth.ts';
import { isUnknownTask, klingCall, lookUpExternalId, lookupBlocked, outcomeOf, possiblyAccepted, statusCallError, type KlingCall } from './kling-api.ts';

/** Kling jobs take minutes; its docs show no interval. */
export const KLING_VIDEO_POLL_MS = 10_000;

export type KlingVideoEndpoint = 'text2video' | 'image2video' | 'multi-image2video' | 'omni-video';
const ENDPOINTS: readonly KlingVideoEndpoint[] = ['text2video', 'image2video', 'multi-image2video', 'omni-video'];

/** What any Kling video model can be asked for (each model's own limits are its catalog entry's). */
const RATIOS = ['16:9', '9:16', '1:1'];
const RESOLUTIONS = ['720p', '1080p'];
const MIN_SECONDS = 3;
const MAX_SECONDS = 15;
/** Kling's limit on `prompt` (and `negative_prompt`) on every video endpoint: 2,500 characters. */
const MAX_PROMPT_CHARS = 2500;
/** Omni models take up to 7 images; multi-image2video 4 (its catalog entries say so). */
const MAX_REFERENCE_IMAGES = 7;

/** Kling's input images (§6.3): JPEG or PNG, at most 10 MB, at least 300 px, ratio 1:2.5 to 2.5:1. */
const MAX_IMAGE_BYTES = 10 * 1024 * 1024;
const MIN_IMAGE_SIDE = 300;
const MAX_IMAGE_RATIO = 2.5;

const status = jobStatus({ running: ['submitted', 'processing'], succeeded: ['succeed'], failed: ['failed'] }, 'video');

/** The task as Kling's create and query answers describe it (§6.4). */
interface KlingTask {
  task_id?: unknown;
  task_status?: unknown;
  task_status_msg?: unknown;
  task_info?: { external_task_id?: unknown };
  task_result?: { videos?: { id?: unknown; url?: unknown; duration?: unknown }[] };
}

/** `kling-v3-pro` → Kling's `model_name` and `mode`. */
export function klingModel(upstreamModel: string): { name: string; mode?: 'std' | 'pro' } {
  const m = /^(.+)-(std|pro)$/.exec(upstreamModel);
  return m ? { name: m[1]!, mode: m[2] as 'std' | 'pro' } : { name: upstreamModel };
}

/** The omni models, by name: they take every input through one endpoint. */
export function isOmniModel(name: string): boolean {
  return /-omni$/.test(name) || /^kling-video-o\d/.test(name);
}

/** Where a job of this model and shape goes. */
export function endpointOf(model: string, shape: Pick<VideoShape, 'hasFirstFrame' | 'referenceImages'>): KlingVideoEndpoint {
  if (isOmniModel(klingModel(model).name)) return 'omni-video';
  if (shape.referenceImages > 0) return 'multi-image2video';
  if (shape.hasFirstFrame) return 'image2video';
  return 'text2video';
}

export interface KlingVideoOptions {
  pollIntervalMs?: number;
  /** The token cache (shared with the image adapter: one token per member and process). */
  tokens?: KlingTokens;
}

export class KlingVideoProvider implements VideoProvider {
  readonly pollIntervalMs: number;
  /** A resubmit finds the task an earlier submit made by its external_task_id and answers it. */
  readonly findsEarlierSubmit = true;
  private readonly tokens: KlingTokens;

  constructor(options: KlingVideoOptions = {}) {
    this.pollIntervalMs = options.pollIntervalMs ?? KLING_VIDEO_POLL_MS;
    this.tokens = options.tokens ?? new KlingTokens();
  }

  check(shape: VideoShape): string | undefined {
    if (!Number.isInteger(shape.durationSeconds) || shape.durationSeconds < MIN_SECONDS || shape.durationSeconds > MAX_SECONDS) return `durations of ${MIN_SECONDS} to ${MAX_SECONDS} seconds only`;
    if (!RATIOS.includes(shape.aspectRatio)) return `aspect ratios ${RATIOS.join(', ')} only`;
    if (!RESOLUTIONS.includes(shape.resolution)) return `resolutions ${RESOLUTIONS.join(' and ')} only`;
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    if (shape.referenceImages > MAX_REFERENCE_IMAGES) return `at most ${MAX_REFERENCE_IMAGES} reference images`;
    if (shape.hasLastFrame && !shape.hasFirstFrame) return 'a last frame only together with a first frame';
    // Checked at creation, before any charge (Kling refuses a longer one at submit, after the 202).
    // On omni a negative prompt is shortened into the prompt instead (omniPrompt), but this rule is
    // the one every Kling endpoint states for the field.
    if (shape.promptLength > MAX_PROMPT_CHARS) return `prompts of at most ${MAX_PROMPT_CHARS} characters`;
    if (shape.negativePromptLength > MAX_PROMPT_CHARS) return `negative prompts of at most ${MAX_PROMPT_CHARS} characters`;
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const unsupported = this.check(shapeOf(job));
    if (unsupported) throw new ProviderError('invalid_request', `Kling accepts ${unsupported}`);
    const { name, mode } = klingModel(job.model);
    // Kling 2.6 renders a first and last frame only silent (its capability map).
    if (name === 'kling-v2-6' && job.lastFrame && job.generateAudio) throw new ProviderError('invalid_request', 'Kling 2.6 renders a first and last frame only without audio; send generate_audio false or no last frame');
    const endpoint = endpointOf(job.model, shapeOf(job));
    // A resubmit first asks for the task an earlier submit may have made (a first submit has none).
    const earlier = job.resubmit ? await this.earlierTask(account, endpoint, job.taskId, signal) : undefined;
    if (earlier) return `${endpoint}/${earlier}`;
    const inputs = await inputsOf(job);
    const fields = bodyOf(endpoint, name, mode, job, inputs);
    const call: KlingCall = { method: 'POST', path: `/v1/videos/${endpoint}`, body: () => jsonStream(fields) };
    const answer = await klingCall<KlingTask>(this.tokens, account, call, signal, 'video submit');
    const outcome = outcomeOf(answer, 'video submit');
    if (!outcome.ok) {
      // A create Kling was still carrying out when it was looked for may have made the task since
      // (its external_task_id taken): the task that exists is this task's.
      if (outcome.error.kind === 'invalid_request') {
        const existing = await this.findByExternalId(account, endpoint, job.taskId, signal);
        if (existing) return `${endpoint}/${existing}`;
      }
      throw outcome.error;
    }
    const taskId = outcome.data?.task_id;
    if (typeof taskId !== 'string' || taskId === '') throw new ProviderError('retryable', 'the upstream accepted the video task without returning its id', { maybeAccepted: true });
    return `${endpoint}/${taskId}`;
  }

  async poll(account: UpstreamAccount, jobId: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const { endpoint, taskId } = parseJobId(jobId);
    const answer = await klingCall<KlingTask>(this.tokens, account, { method: 'GET', path: `/v1/videos/${endpoint}/${encodeURIComponent(taskId)}` }, signal, 'video status');
    const outcome = outcomeOf(answer, 'video status');
    if (!outcome.ok) {
      // The task itself failed (risk control answers its code with the task): the job is over.
      if (outcome.data?.task_status === 'failed') return { state: 'failed', error: outcome.error };
      // Kling does not know the task (any more): asking again cannot help.
      if (isUnknownTask(outcome.error)) {
        return { state: 'failed', error: new ProviderError('failed', 'the upstream no longer knows this video task', { upstreamStatus: answer.status, upstreamCode: outcome.error.upstreamCode }) };
      }
      throw statusCallError(outcome.error);
    }
    const task = outcome.data;
    switch (status(task?.task_status)) {
      case 'running':
        return { state: 'running' };
      case 'failed':
        return { state: 'failed', error: new ProviderError('failed', sanitizeMessage(task?.task_status_msg, 'the upstream reported the video task as failed')) };
      case 'succeeded': {
        const url = task?.task_result?.videos?.map((v) => v.url).find((u): u is string => typeof u === 'string' && u !== '');
        if (!url) return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video task without a video') };
        return { state: 'succeeded', output: { url } };
      }
    }
  }

  async download(_account: UpstreamAccount, _jobId: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.url) throw new ProviderError('failed', 'the upstream gave no video address');
    // A CDN link: signed by Kling itself, it needs (and gets) no credentials.
    return downloadOutput(output.url, signal, { upstreamError: cdnError, expiredMessage: "the upstream's link to the video expired before it was downloaded" });
  }

  /**
   * The task an earlier submit of this task created (its answer lost), or undefined when Kling has
   * none or refuses both forms of the lookup as a request (no retry changes that: the create goes
   * ahead as before lookups; Kling's refusal of a taken external_task_id, and the lookup after it,
   * still stand guard). A blocked lookup (`lookupBlocked`) is thrown as it is: no create was sent,
   * so only what the lookup's own answer says (a 2xx that cannot be read, a timeout) marks it as
   * maybe accepted; a resubmit is asked of this member again whatever it throws (VideoRunner).
   */
  private async earlierTask(account: UpstreamAccount, endpoint: KlingVideoEndpoint, externalId: string, signal: AbortSignal): Promise<string | undefined> {
    const found = await lookUpExternalId(this.tokens, account, `/v1/videos/${endpoint}`, externalId, signal, 'video lookup');
    if (found.state === 'found') return found.taskId;
    if (found.state === 'failed' && lookupBlocked(found.error)) throw found.error;
    return undefined;
  }

  /**
   * The task id of the task created with `externalId` on `endpoint`, after Kling refused its create;
   * undefined only when Kling says there is no such task. Any other failure of the lookup is thrown:
   * the refusal it follows may be of a duplicate, so the task may be running there
   * (`maybeAccepted`: asked again on this member).
   */
  private async findByExternalId(account: UpstreamAccount, endpoint: KlingVideoEndpoint, externalId: string, signal: AbortSignal): Promise<string | undefined> {
    const found = await lookUpExternalId(this.tokens, account, `/v1/videos/${endpoint}`, externalId, signal, 'video lookup');
    if (found.state === 'found') return found.taskId;
    if (found.state === 'unknown') return undefined;
    throw possiblyAccepted(found.error);
  }
}

export function parseJobId(jobId: string): { endpoint: KlingVideoEndpoint; taskId: string } {
  const slash = jobId.indexOf('/');
  const endpoint = jobId.slice(0, slash) as KlingVideoEndpoint;
  if (slash < 0 || !ENDPOINTS.includes(endpoint)) throw new ProviderError('failed', `'${jobId}' is not a Kling video job id`);
  return { endpoint, taskId: jobId.slice(slash + 1) };
}

/** A CDN's error answer (the only one downloadOutput hands back: 5xx and 429) by its status. */
async function cdnError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  res.discard();
  const kind = kindOfStatus(res.status);
  const wait = kind === 'rate_limited' ? retryAfterMs(res.headers) : undefined;
  return new ProviderError(kind, `the upstream ${what} answered HTTP ${res.status}`, { upstreamStatus: res.status, ...(wait !== undefined && { retryAfterMs: wait }) });
}

interface JobImages {
  first?: Base64Source;
  last?: Base64Source;
  references: Base64Source[];
}

/** The job's images as Kling takes them: raw base64 of a JPEG or PNG within Kling's limits. */
async function inputsOf(job: VideoJob): Promise<JobImages> {
  const one = (input: MediaInput, what: string) => klingImage(input, what);
  return {
    ...(job.firstFrame && { first: await one(job.firstFrame, 'the first frame') }),
    ...(job.lastFrame && { last: await one(job.lastFrame, 'the last frame') }),
    references: await Promise.all(job.referenceImages.map((r, i) => one(r, `reference image ${i + 1}`))),
  };
}

async function klingImage(input: MediaInput, what: string): Promise<Base64Source> {
  const { width, height } = input;
  if (width !== null && height !== null) {
    if (Math.min(width, height) < MIN_IMAGE_SIDE) throw new ProviderError('invalid_request', `Kling needs images of at least ${MIN_IMAGE_SIDE} px a side; ${what} is ${width}x${height}`);
    if (Math.max(width, height) / Math.min(width, height) > MAX_IMAGE_RATIO) throw new ProviderError('invalid_request', `Kling needs images between 1:2.5 and 2.5:1; ${what} is ${width}x${height}`);
  }
  if (input.contentType === 'image/png' || input.contentType === 'image/jpeg') {
    if (input.bytes > MAX_IMAGE_BYTES) throw new ProviderError('invalid_request', `Kling takes images of at most 10 MB; ${what} has ${input.bytes} bytes`);
    return inlineBase64(input);
  }
  // Kling takes JPEG and PNG only: anything else is converted (read as a stream).
  const convert = sharp().png();
  const source = input.open();
  source.once('error', (err) => convert.destroy(err));
  const png = await source.pipe(convert).toBuffer();
  if (png.length > MAX_IMAGE_BYTES) throw new ProviderError('invalid_request', `Kling takes images of at most 10 MB; ${what} converted to PNG has ${png.length} bytes`);
  return new Base64Source(() => bufferStream(png), png.length);
}

function bufferStream(data: Buffer) {
  return Readable.from([data]);
}

/**
 * Omni's prompt: the client's prompt and, as omni has no `negative_prompt`, the negative prompt after
 * it as "Avoid: …", within Kling's 2,500 characters for `prompt` (which the two fields elsewhere have
 * each): the suffix is cut at the last separator that fits, or left out when none does. The
 * client's own prompt is never cut (over the limit, Kling refuses it as on any endpoint). Counted in
 * UTF-16 units, never fewer than the characters Kling counts.
 */
function omniPrompt(prompt: string, negativePrompt: string | null | undefined): string {
  if (!negativePrompt) return prompt;
  const head = `${prompt}\n\nAvoid: `;
  const room = MAX_PROMPT_CHARS - head.length;
  if (negativePrompt.length <= room) return head + negativePrompt;
  // The last separator (space, comma, semicolon, Chinese list marks) within the room: no word is split.
  const cut = room > 0 ? negativePrompt.slice(0, room + 1).search(/[\s,;，、；][^\s,;，、；]*$/) : -1;
  const kept = cut > 0 ? negativePrompt.slice(0, cut).replace(/[\s,;，、；]+$/, '') : '';
  return kept ? head + kept : prompt;
}

/** The endpoint's JSON body (§6.2, §6.3, §10.2). */
function bodyOf(endpoint: KlingVideoEndpoint, name: string, mode: 'std' | 'pro' | undefined, job: VideoJob, inputs: JobImages): Record<string, unknown> {
  const body: Record<string, unknown> = { model_name: name };
  const omni = endpoint === 'omni-video';
  body.prompt = omni ? omniPrompt(job.prompt, job.negativePrompt) : job.prompt;
  if (!omni && job.negativePrompt) body.negative_prompt = job.negativePrompt;
  if (mode) body.mode = mode;
  body.duration = String(job.durationSeconds);
  switch (endpoint) {
    case 'text2video':
      body.aspect_ratio = job.aspectRatio;
      break;
    case 'image2video':
      body.image = inputs.first;
      if (inputs.last) body.image_tail = inputs.last;
      break;
    case 'multi-image2video':
      body.image_list = inputs.references.map((image) => ({ image }));
      body.aspect_ratio = job.aspectRatio;
      break;
    case 'omni-video': {
      const list: Record<string, unknown>[] = [];
      if (inputs.first) list.push({ image_url: inputs.first, type: 'first_frame' });
      if (inputs.last) list.push({ image_url: inputs.last, type: 'end_frame' });
      for (const image of inputs.references) list.push({ image_url: image });
      if (list.length > 0) body.image_list = list;
      // With a first frame Kling takes the frame's ratio and refuses one of its own.
      if (!inputs.first) body.aspect_ratio = job.aspectRatio;
      break;
    }
  }
  // Omni takes `sound` with every request (ComfyUI's omni requests always carry it): said either
  // way there; elsewhere only `on`, which 2.6+ models take (Kling's default is off).
  if (omni) body.sound = job.generateAudio ? 'on' : 'off';
  else if (job.generateAudio) body.sound = 'on';
  body.external_task_id = job.taskId;
  return body;
}
