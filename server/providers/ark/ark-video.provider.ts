/**
 * Provider kind `ark`, videos: Seedance tasks on ModelArk (upstream-apis.md §5.2, §10.3).
 *
 *   submit    POST {base}/contents/generations/tasks, a JSON body streamed with its inputs: model,
 *             `content[]` — the prompt as `{type: text}`, then the frames as `{type: image_url,
 *             image_url: {url: <data URL>}, role: first_frame | last_frame}` or the reference images
 *             with `role: reference_image` — and `resolution`, `ratio`, an integer `duration`,
 *             `generate_audio` (ignored before 1.5 pro), `watermark` (false unless the member's
 *             base URL says `?watermark=true`), `execution_expires_after` (see below). No `seed` or
 *             `camera_fixed` (the contract has neither: the upstream draws a seed, the camera
 *             moves). Ark documents no idempotency key: a resubmit after a crash is the runner's
 *             intent marker's business. → `cgt-…`
 *   poll      GET {base}/contents/generations/tasks/{id}: queued | running → running; succeeded →
 *             `content.video_url`; failed (with `error {code, message}`), expired (its
 *             `execution_expires_after` ran out in the queue), cancelled, or no longer known (404
 *             `ResourceNotFound`: records are kept 7 days) → failed; any other error answer is
 *             thrown by its code or status, never as the client's refusal (`taskGone`)
 *   download  the `video_url` (signed object storage, another host: the key is not sent), streamed;
 *             it lives 24 hours, and a link that is gone fails the task (refunded)
 *   cancel    DELETE {base}/contents/generations/tasks/{id}. Ark cancels only `queued` tasks; a
 *             `running` one cannot be stopped and runs to its end upstream (its result is never
 *             collected): Ark's refusal is reported as a permanent failure of the cancel, which the
 *             runner logs. A task that already ended has its record deleted; one Ark no longer knows
 *             (404 `ResourceNotFound`) is nothing to cancel.
 *
 * The runner cancels once, at the task's deadline, after refunding it; a cancel that gets no answer
 * (a timeout, a 5xx, a 429) would leave the task in Ark's queue for its default 48 hours, to run
 * there later, billed to the member, for a client refunded long before. So every submit gives the
 * task `execution_expires_after`: what is left of the gateway task's lifetime, rounded up, within
 * Ark's [3600, 259200] seconds; past it a task still queued is `expired` and never runs. With less
 * than an hour left, Ark's shortest (an hour) applies: such a task may outlive its deadline in the
 * queue by the difference.
 *
 * What each model takes (durations, resolutions, frames, reference images, audio) is in its catalog
 * definition, so creation refuses the rest before anything is charged; `check` refuses what no
 * Seedance model can express. The few rules a definition cannot state (lite i2v needs an image and
 * takes no 1080p with reference images) are checked here before the call.
 */
import {
  jobStatus,
  ProviderError,
  dataUrl,
  downloadOutput,
  jsonStream,
  kindOfCode,
  readJson,
  sanitizeMessage,
  shapeOf,
  upstreamFetch,
  type UpstreamAccount,
  type VideoContent,
  type VideoJob,
  type VideoOutputRef,
  type VideoProvider,
  type VideoShape,
  type VideoStatus,
} from '../kit.ts';
import { ARK_CODES, arkError, type ArkErrorBody } from './ark-errors.ts';
import { arkAuth, arkEndpoint, arkOrigin, arkUrl } from './ark-endpoint.ts';

/** Seedance tasks take half a minute to several minutes. */
export const SEEDANCE_POLL_MS = 10_000;
const RATIOS = ['16:9', '4:3', '1:1', '3:4', '9:16', '21:9'];
const RESOLUTIONS = ['480p', '720p', '1080p'];
/** 1.0 starts at 2 s, 2.0 ends at 15 s. */
const DURATIONS = { min: 2, max: 15 };
/** 2.0 takes up to 9 reference images, 1.0 lite i2v up to 4. */
const MAX_REFERENCE_IMAGES = 9;
/** What `execution_expires_after` takes, in seconds (§5.2: default 172,800, range [3600, 259200]). */
const EXPIRES_AFTER = { min: 3600, max: 259_200 };

const status = jobStatus({ running: ['queued', 'running'], succeeded: ['succeeded'], failed: ['failed', 'expired', 'cancelled'] }, 'Seedance task');

interface SeedanceTask {
  id?: unknown;
  status?: unknown;
  content?: { video_url?: unknown } | null;
  error?: ArkErrorBody | null;
}

export class ArkVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = SEEDANCE_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (!RATIOS.includes(shape.aspectRatio)) return `aspect ratios ${RATIOS.join(', ')} only`;
    if (!RESOLUTIONS.includes(shape.resolution)) return `resolutions ${RESOLUTIONS.join(', ')} only`;
    if (shape.durationSeconds < DURATIONS.min || shape.durationSeconds > DURATIONS.max) return `durations of ${DURATIONS.min} to ${DURATIONS.max} seconds only`;
    if (shape.hasNegativePrompt) return 'no negative prompt';
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    if (shape.referenceImages > MAX_REFERENCE_IMAGES) return `at most ${MAX_REFERENCE_IMAGES} reference images`;
    if (shape.hasLastFrame && !shape.hasFirstFrame) return 'a last frame only together with a first frame';
    if (shape.referenceImages > 0 && shape.hasFirstFrame) return 'frames or reference images, not both';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const unsupported = this.check(shapeOf(job)) ?? modelRule(job);
    if (unsupported) throw new ProviderError('invalid_request', `Seedance accepts ${unsupported}`);
    const content: unknown[] = [{ type: 'text', text: withoutParameterFlags(job.prompt) }];
    const image = (input: NonNullable<VideoJob['firstFrame']>, role: string) => ({ type: 'image_url', image_url: { url: dataUrl(input) }, role });
    if (job.firstFrame) content.push(image(job.firstFrame, 'first_frame'));
    if (job.lastFrame) content.push(image(job.lastFrame, 'last_frame'));
    for (const reference of job.referenceImages) content.push(image(reference, 'reference_image'));
    const { body, length } = jsonStream({
      model: job.model,
      content,
      resolution: job.resolution,
      ratio: job.aspectRatio,
      duration: job.durationSeconds,
      generate_audio: job.generateAudio,
      watermark: arkEndpoint(account).watermark,
      ...(job.deadline && { execution_expires_after: executionExpiresAfter(job.deadline) }),
    });
    const res = await upstreamFetch(
      arkUrl(account, '/contents/generations/tasks'),
      { method: 'POST', headers: { ...arkAuth(account), 'content-type': 'application/json', 'content-length': String(length) }, body, redirect: 'manual' },
      signal,
      'video submit',
    );
    if (!res.ok) throw await arkError(res, 'video submit');
    const created = (await readJson(res)) as { id?: unknown } | undefined;
    if (typeof created?.id !== 'string' || created.id === '') throw new ProviderError('retryable', 'the upstream accepted the video task without returning its id', { maybeAccepted: true });
    return created.id;
  }

  async poll(account: UpstreamAccount, taskId: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const res = await upstreamFetch(arkUrl(account, `/contents/generations/tasks/${encodeURIComponent(taskId)}`), { headers: arkAuth(account) }, signal, 'video status');
    if (!res.ok) {
      // An error body that broke off rejects as a ProviderError by its status (readJson), judged
      // here as any other; the caller's abort stays an abort.
      const err = await arkError(res, 'video status').catch((e: unknown) => e);
      if (!(err instanceof ProviderError)) throw err;
      if (taskGone(res.status, err.upstreamCode)) {
        return { state: 'failed', error: new ProviderError('failed', 'the upstream no longer has this video task (records are kept 7 days)', { upstreamStatus: 404, upstreamCode: err.upstreamCode }) };
      }
      // A status call carries nothing of the client's: a refusal of it is the member's (its base
      // URL, or a relay in front of Ark), never the request's, and the job may be running, billed.
      throw err.kind === 'invalid_request' || err.kind === 'policy' ? err.with({ kind: 'misconfigured' }) : err;
    }
    const task = (await readJson(res)) as SeedanceTask | undefined;
    if (task === undefined) throw new ProviderError('retryable', 'the upstream answered a video status that is not JSON');
    const state = status(task.status);
    if (state === 'running') return { state };
    if (state === 'failed') return { state, error: failureOf(task) };
    const url = task.content?.video_url;
    if (typeof url === 'string' && url !== '') return { state, output: { url } };
    return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video task without a video (its link is kept 24 hours)') };
  }

  async download(account: UpstreamAccount, _taskId: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.url) throw new ProviderError('failed', 'the upstream gave no video address');
    return downloadOutput(output.url, signal, {
      authHeaders: arkAuth(account),
      authOrigin: arkOrigin(account),
      upstreamError: arkError,
      expiredMessage: "the upstream's link to the video expired before it was downloaded (Seedance keeps videos 24 hours)",
    });
  }

  async cancel(account: UpstreamAccount, taskId: string, signal: AbortSignal): Promise<void> {
    const res = await upstreamFetch(arkUrl(account, `/contents/generations/tasks/${encodeURIComponent(taskId)}`), { method: 'DELETE', headers: arkAuth(account) }, signal, 'video cancel');
    if (res.ok) {
      res.discard();
      return;
    }
    const err = await arkError(res, 'video cancel');
    if (taskGone(res.status, err.upstreamCode)) return;
    // Any other 404 (a wrong base URL) cancelled nothing: the member's, not the task's state.
    if (res.status === 404 || !refusedForItsState(res.status, err.upstreamCode)) throw err;
    // The task is running (Ark cancels queued tasks only) and will finish upstream. What a refusal
    // read as `auth` by its status alone said is not quoted (it may quote the key).
    const said = err.kind === 'auth' ? [`HTTP ${res.status}`, err.upstreamCode].filter(Boolean).join(' ') : err.message;
    throw new ProviderError('failed', `the upstream cannot cancel a running Seedance task; it runs to its end (${said})`, { upstreamStatus: err.upstreamStatus, upstreamCode: err.upstreamCode });
  }
}

/**
 * Seconds from now to the deadline, rounded up, within what Ark takes: the task's
 * `execution_expires_after`.
 */
export function executionExpiresAfter(deadline: Date, now = Date.now()): number {
  return Math.min(EXPIRES_AFTER.max, Math.max(EXPIRES_AFTER.min, Math.ceil((deadline.getTime() - now) / 1000)));
}

/**
 * Whether an answer says that Ark has no such task: a 404 with `ResourceNotFound` (what Ark answers
 * a task id it does not know, §5.3: "The specified resource is not found") or the error-code table's
 * `NotFound.<parameter>` ("The specified {{ResourceType}} {{ResourceContent}} is not found"). Any
 * other 404 — no Ark error at all (a wrong base URL: a proxy's or a router's page), a model's or an
 * endpoint's code — says nothing about the task, which may be running, billed, its output to be
 * collected once the member is put right.
 */
function taskGone(status: number, code: string | undefined): boolean {
  return status === 404 && (code === 'ResourceNotFound' || code?.startsWith('NotFound.') === true);
}

/**
 * Whether Ark refused a cancel for the task's state (no longer queued). Ark documents no answer for
 * it: a 400 InvalidParameter (what the fake answers), a 409 Conflict, or a 403 Forbidden of the
 * `OperationDenied` family of Volcengine's error-code table (https://www.volcengine.com/docs/82379/1299023):
 * `OperationDenied.UnsupportedPhase` ("operation is not supported while the target is in its current
 * phase"), `OperationDenied.InvalidState`. Read by its status alone, such a 403 would take the member
 * out as if its credentials were rejected, a 409 would count towards its circuit. So any 4xx is
 * that refusal but what says something else: 401, 408 (no answer about the task), 429, and the
 * codes ARK_CODES gives the member's key or account — 403 `AccessDenied` (no permission for the
 * resource), `AccountOverdueError` and `OperationDenied.ServiceOverdue` (arrears),
 * `OperationDenied.ServiceNotOpen` — or Ark's own failure (`ContentSecurityDetectionError`).
 */
function refusedForItsState(status: number, code: string | undefined): boolean {
  if (status < 400 || status >= 500 || status === 401 || status === 408 || status === 429) return false;
  const byCode = kindOfCode(ARK_CODES, code);
  return byCode === undefined || byCode === 'invalid_request';
}

/** Why a finished task failed: its error code's kind (a refusal under the content policy, a bad input) or the upstream's failure. */
function failureOf(task: SeedanceTask): ProviderError {
  if (task.status === 'expired') return new ProviderError('failed', 'the upstream task expired in its queue before it ran', { upstreamCode: 'expired' });
  if (task.status === 'cancelled') return new ProviderError('failed', 'the upstream task was cancelled', { upstreamCode: 'cancelled' });
  const code = typeof task.error?.code === 'string' ? task.error.code : undefined;
  const kind = kindOfCode(ARK_CODES, code);
  const message = sanitizeMessage(task.error?.message, 'the upstream reported the video task as failed');
  return new ProviderError(kind === 'policy' || kind === 'invalid_request' ? kind : 'failed', message, { upstreamCode: code });
}

/** Rules of one model that its catalog definition cannot state, by the upstream's id (without `doubao-`/`dreamina-`). */
function modelRule(job: VideoJob): string | undefined {
  const id = job.model.replace(/^(doubao|dreamina)-/, '');
  const images = (job.firstFrame ? 1 : 0) + job.referenceImages.length;
  if (id.startsWith('seedance-1-0-lite-i2v')) {
    if (images === 0) return 'a first frame or reference images on its image-to-video model';
    if (job.referenceImages.length > 0 && job.resolution === '1080p') return 'no 1080p with reference images on its lite model';
  }
  return undefined;
}

/**
 * Seedance also reads parameters from flags in the prompt text (`--dur 12`, `--rs 1080p`, `--rt
 * 16:9`, `--fps`, `--wm`, `--seed`, `--cf`, `--frames` and their long names; §5.2). Which wins over
 * the body's fields is not documented: a client could be billed for 5 seconds and get 12. The
 * billed parameters go in the body only, so these flags are taken out of the prompt.
 */
export function withoutParameterFlags(prompt: string): string {
  return prompt
    .replace(/(^|\s)--(?:rs|rt|dur|fps|wm|seed|cf|resolution|ratio|duration|framespersecond|watermark|camerafixed|frames)(?:\s+|=)\S+/gi, '$1')
    .replace(/\s{2,}/g, ' ')
    .trim();
}
