/**
 * Provider kind `kling`, images: Kling's image generation (upstream-apis.md §10.2, the Kling image
 * API), asynchronous like its videos, run within the synchronous image request:
 *
 *   POST /v1/images/generations        {model_name, prompt, n, aspect_ratio, resolution "1k"|"2k",
 *                                      external_task_id}
 *   GET  /v1/images/generations/{id}   until `succeed` (→ `task_result.images[] {index, url}`) or
 *                                      `failed` (→ `task_status_msg`), every `pollIntervalMs`
 *
 * bounded by the request's signal and `timeoutMs` (from the start of the call, submit included).
 *
 * One request, one paid Kling task: Kling has no cancel, so a task it accepted runs and is billed
 * whatever the gateway does next, and an error out of here may send the request to another member
 * (or a later attempt) with a new task. So:
 *   - a status call that fails in passing (no connection, a timeout, an unreadable answer, a 5xx or
 *     rate limit, a status word not known) is asked again until `timeoutMs`, honouring Retry-After,
 *     as the queued image upstreams are (kit/queued-images.ts); any other failure once the task
 *     exists, and the deadline itself, is thrown as `maybeAccepted` (the runner does not move it to
 *     another member); Kling saying it has no such task (1203 in its envelope; a bare 404 passes) fails
 *     it (`failed`: nothing runs, and a resumed task's next try starts afresh), as for videos;
 *   - a failure once the task exists that does not end it (a status call that keeps failing, the
 *     deadline, an image the CDN fails to serve in passing) is thrown as `jobKept` too: the task
 *     goes on, or is done and billed, and a background task's next try collects it (it was recorded,
 *     `events.submitted`) instead of paying for another. Not so the task's own end: it failed, Kling
 *     no longer knows it, or its images' links are gone;
 *   - the submit's `external_task_id` is the gateway's task id (`ImageJob.taskId`), the same on every
 *     try: Kling keeps it unique per account, and its single-task query takes it instead of the task
 *     id (image-generation.md; asked as a query parameter, then in the path: `lookUpExternalId`).
 *     A submit Kling refuses as an invalid parameter (how it answers an id it has: a try of this
 *     task that stopped before recording its task, or a failover to a member on the same account)
 *     is looked up by it, once (twice after a lookup failing in passing): found,
 *     that task is this one's and is collected; anything else, the refusal stands, blamed on the
 *     request (it answered this create: nothing is on its way from it). Such an earlier task found
 *     gone (Kling no longer knows it, or its images' links answer 403/404/410: a try gave it up, and
 *     the runner forgot it) is replaced by a new task under the next id, `<taskId>-2`, `-3`, ...
 *     (each looked up the same way first): Kling would refuse the first id for good;
 *   - a submit without a usable answer (a timeout or a connection lost after sending, a 2xx without
 *     the envelope or the task id) is looked up by it on the same member: found, the task is collected
 *     (and recorded) as if the submit had answered. Kling saying there is no such task is believed
 *     only once `lookupGraceMs` have passed since the submit was sent (Kling may still be carrying out
 *     a create it has not answered): until then it is asked again, more and more slowly; after it,
 *     the submit's error is thrown as not accepted (safe to try elsewhere). A lookup failing in
 *     passing is asked again until `timeoutMs`; it fails otherwise (or the deadline passes): thrown
 *     as `maybeAccepted`.
 *
 * Each image is then downloaded from Kling's CDN (no credentials; a transient failure is tried
 * again, up to three times, then thrown as `jobKept`: failing over would pay for the images a second
 * time), fitted to the size and format the client asked for (`fitImage`) and reported in index
 * order. `n` images are one task (Kling takes 1–9); a task that returns fewer is reported as it is
 * (only delivered images are charged).
 *
 * `aspect_ratio` is the request's when Kling has it, else the nearest of Kling's eight; `resolution`
 * is `2k` for 2K and 4K tiers, else `1k`. Kling has no mask and its reference-image input is a
 * different operation per model: edits are refused before any call.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { fitImage } from '../image-output.ts';
import { ProviderError, asProviderError, downloadWithRetries, jobStatus, keptJob, sanitizeMessage } from '../kit.ts';
import type { ImageEvents, ImageJob, ImageProvider, UpstreamAccount } from '../kit.ts';
import { UPSTREAM_TIMEOUT_MS } from '../upstream-http.ts';
import { KlingTokens } from './kling-auth.ts';
import { isUnknownTask, klingCall, lookUpExternalId, outcomeOf, possiblyAccepted, statusCallError, type KlingOutcome } from './kling-api.ts';

export const KLING_IMAGE_POLL_MS = 2_000;
export const KLING_IMAGE_TIMEOUT_MS = 600_000;
/** How much longer than its call's timeout a submit without an answer may take to show its task. */
export const KLING_IMAGE_LOOKUP_GRACE_MS = 30_000;
/** Where Kling keeps image tasks: created by a POST here, queried by id (or external id) under it. */
const IMAGE_TASKS = '/v1/images/generations';

/** The longest pause between two lookups of a task that is not there yet. */
const MAX_LOOKUP_PAUSE_MS = 5_000;
/** Lookups of a task whose create Kling refused (a duplicate id?): a second only after one failing in passing. */
const DUPLICATE_LOOKUPS = 2;

/** `aspect_ratio` values of the image API. */
const RATIOS = ['16:9', '9:16', '1:1', '4:3', '3:4', '3:2', '2:3', '21:9'];

const status = jobStatus({ running: ['submitted', 'processing'], succeeded: ['succeed'], failed: ['failed'] }, 'image');

interface KlingImageTask {
  task_id?: unknown;
  task_status?: unknown;
  task_status_msg?: unknown;
  task_info?: { external_task_id?: unknown };
  task_result?: { images?: { index?: unknown; url?: unknown }[] };
}

/** What one status call saw of the task. */
type Seen = { state: 'running' } | { state: 'failed'; error: ProviderError } | { state: 'succeeded'; urls: string[] };

/** The nearest ratio Kling knows (on a log scale). */
export function klingImageRatio(aspectRatio: string, width: number, height: number): string {
  if (RATIOS.includes(aspectRatio)) return aspectRatio;
  const target = Math.log(width / height);
  const distance = (r: string) => {
    const [w, h] = r.split(':').map(Number) as [number, number];
    return Math.abs(Math.log(w / h) - target);
  };
  return RATIOS.reduce((best, r) => (distance(r) < distance(best) ? r : best));
}

export interface KlingImageOptions {
  pollIntervalMs?: number;
  timeoutMs?: number;
  /** How long one call to Kling's API may take (default: the gateway's upstream timeout, 60 s). */
  callTimeoutMs?: number;
  /**
   * How long after a submit without an answer was sent Kling's "no such task" is believed (default:
   * the call's timeout plus KLING_IMAGE_LOOKUP_GRACE_MS): Kling may still be carrying out the create.
   */
  lookupGraceMs?: number;
  tokens?: KlingTokens;
}

export class KlingImageProvider implements ImageProvider {
  private readonly pollIntervalMs: number;
  private readonly timeoutMs: number;
  private readonly callTimeoutMs: number | undefined;
  private readonly lookupGraceMs: number;
  private readonly tokens: KlingTokens;

  constructor(options: KlingImageOptions = {}) {
    this.pollIntervalMs = options.pollIntervalMs ?? KLING_IMAGE_POLL_MS;
    this.timeoutMs = options.timeoutMs ?? KLING_IMAGE_TIMEOUT_MS;
    this.callTimeoutMs = options.callTimeoutMs;
    this.lookupGraceMs = options.lookupGraceMs ?? (options.callTimeoutMs ?? UPSTREAM_TIMEOUT_MS) + KLING_IMAGE_LOOKUP_GRACE_MS;
    this.tokens = options.tokens ?? new KlingTokens();
  }

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    if (job.operation === 'edit') throw new ProviderError('invalid_request', 'Kling image models here generate from a prompt only (no image edits)');
    const deadline = Date.now() + this.timeoutMs;
    const p = job.params;
    const fields = {
      model_name: job.model,
      prompt: job.prompt,
      n: job.n,
      aspect_ratio: klingImageRatio(p.aspectRatio, p.width, p.height),
      resolution: p.resolution === '2K' || p.resolution === '4K' ? '2k' : '1k',
    };
    // A task an earlier run of this one submitted is collected, not submitted again (ImageJob.resume).
    // A job without a task (the adapter called on its own) has nothing to be submitted again for.
    const externalId = job.taskId ?? randomUUID();
    let { taskId, earlier } = typeof job.resume === 'string' && job.resume !== '' ? { taskId: job.resume, earlier: false } : await this.submit(account, externalId, fields, deadline, signal, events);
    for (let generation = 2; ; generation++) {
      const collected = await this.collect(account, taskId, deadline, signal).catch((err: unknown) => {
        // An earlier create's task that is gone (a resumed try met its expired links, and the
        // runner forgot it) can deliver nothing, yet Kling keeps its external_task_id: a new task
        // goes under the next one (`<taskId>-2`, ...), itself first looked up if Kling has it (a try
        // that stopped before recording it). Never a task this call created, or may have: a CDN
        // refusing every link would otherwise have a task paid for again and again.
        if (earlier && isGone(err)) return undefined;
        throw err;
      });
      if (collected) {
        for (const [i, url] of collected.urls.slice(0, job.n).entries()) {
          const data = i === 0 ? collected.first : await downloadWithRetries(url, signal, 'Kling').catch(keptJob);
          await events.image(i, { image: await fitImage(data, p) });
        }
        return;
      }
      ({ taskId, earlier } = await this.submit(account, `${externalId}-${generation}`, fields, deadline, signal, events));
    }
  }

  /**
   * Waits for the task and downloads its first image (Kling's CDN: no credentials, redirects
   * followed anywhere, a passing failure tried again, then left for a later try to fetch: the task
   * is done and billed); its images' URLs in index order.
   */
  private async collect(account: UpstreamAccount, taskId: string, deadline: number, signal: AbortSignal): Promise<{ urls: string[]; first: Buffer }> {
    const urls = await this.waitForImages(account, taskId, deadline, signal);
    return { urls, first: await downloadWithRetries(urls[0]!, signal, 'Kling').catch(keptJob) };
  }

  /**
   * Creates the image task with `externalId`; its id, recorded for a later run (Kling has no cancel:
   * a task is always left to finish). A submit that got no usable answer, or that Kling refused as
   * an invalid parameter (a duplicate id), is looked up by its external_task_id. `earlier`: the task
   * is one an earlier create made, found after Kling refused this one.
   */
  private async submit(account: UpstreamAccount, externalId: string, fields: Record<string, unknown>, deadline: number, signal: AbortSignal, events: ImageEvents): Promise<{ taskId: string; earlier: boolean }> {
    const text = JSON.stringify({ ...fields, external_task_id: externalId });
    const sentAt = Date.now();
    let taskId: string;
    let earlier = false;
    try {
      const created = outcomeOf(
        await klingCall<KlingImageTask>(this.tokens, account, { method: 'POST', path: IMAGE_TASKS, body: () => ({ body: text, length: Buffer.byteLength(text) }), timeoutMs: this.callTimeoutMs }, signal, 'image generation'),
        'image generation',
      );
      if (!created.ok) throw created.error;
      const id = created.data?.task_id;
      if (typeof id !== 'string' || id === '') throw new ProviderError('retryable', 'the upstream accepted the image task without returning its id', { maybeAccepted: true });
      taskId = id;
    } catch (err) {
      if (signal.aborted || !(err instanceof ProviderError)) throw err;
      if (err.maybeAccepted) {
        // Sent, but what Kling did is unknown: ask it, on this member, before anything is sent
        // elsewhere. "No such task" is final only once the create can no longer be under way.
        const notAccepted = err.with({ maybeAccepted: false, jobKept: false });
        taskId = await this.findByExternalId(account, externalId, notAccepted, sentAt + this.lookupGraceMs, deadline, signal);
      } else if (err.kind === 'invalid_request') {
        // Kling refuses an external_task_id it has (as an invalid parameter): a submit of this task
        // made it (a try that stopped before recording it, a failover to a member on the same
        // account), and that task is this one's.
        taskId = await this.findDuplicate(account, externalId, err, signal);
        earlier = true;
      } else throw err;
    }
    await events.submitted?.(taskId);
    return { taskId, earlier };
  }

  /**
   * The task an earlier create made with `externalId`, after Kling refused this one as an invalid
   * parameter. Kling does not document how it answers a duplicate, so every such refusal is looked
   * up (one cheap call; its message is not relied on). The refusal answered this create: nothing is
   * on its way from it, so only a lookup that finds the task overrides it; anything else (no such
   * task, the lookup refused or failing) leaves `refusal` to stand as the client's (a lookup failing
   * in passing is asked once more, never until the deadline: an invalid prompt is answered at once).
   */
  private async findDuplicate(account: UpstreamAccount, externalId: string, refusal: ProviderError, signal: AbortSignal): Promise<string> {
    for (let lookup = 1; ; lookup++) {
      const found = await lookUpExternalId(this.tokens, account, IMAGE_TASKS, externalId, signal, 'image lookup', this.callTimeoutMs);
      if (found.state === 'found') return found.taskId;
      if (found.state !== 'failed' || !found.error.transient || lookup >= DUPLICATE_LOOKUPS) throw refusal;
      await sleep(this.pollIntervalMs, undefined, { signal });
    }
  }

  /**
   * The id of the task created with `externalId`. Kling saying there is no such task is asked again
   * until `unknownFinalAt` (a create may still be under way: its task shows up later), with pauses
   * growing from `pollIntervalMs`, the last look at that time; after it, `notCreated` is thrown
   * (nothing runs: another member may take the request). A lookup failing in passing is asked again
   * until the deadline; any other failure, or the deadline, is thrown as maybe accepted.
   */
  private async findByExternalId(account: UpstreamAccount, externalId: string, notCreated: ProviderError, unknownFinalAt: number, deadline: number, signal: AbortSignal): Promise<string> {
    for (let unknownPause = this.pollIntervalMs; ; ) {
      const found = await lookUpExternalId(this.tokens, account, IMAGE_TASKS, externalId, signal, 'image lookup', this.callTimeoutMs);
      if (found.state === 'found') return found.taskId;
      if (found.state === 'absent') throw possiblyAccepted(found.error);
      const { error } = found;
      const now = Date.now();
      const left = deadline - now;
      let pause: number;
      if (found.state === 'unknown') {
        if (now >= unknownFinalAt) throw notCreated;
        // The deadline before Kling could be believed: the task may yet appear (not the member's fault).
        if (left <= 0) throw new ProviderError('retryable', 'the upstream did not show the image task it was sent before the deadline', { upstreamStatus: error.upstreamStatus, upstreamCode: error.upstreamCode, cause: error, maybeAccepted: true });
        pause = Math.min(unknownPause, unknownFinalAt - now);
        unknownPause = Math.min(unknownPause * 2, MAX_LOOKUP_PAUSE_MS);
      } else {
        if (!error.transient || left <= 0) throw possiblyAccepted(error);
        pause = Math.max(this.pollIntervalMs, error.retryAfterMs ?? 0);
      }
      await sleep(Math.min(pause, left), undefined, { signal });
    }
  }

  /**
   * Polls the task until it is done; its images' URLs in index order. The task runs (and is paid
   * for) whatever a status call meets: a passing failure is asked again, a lasting one is thrown
   * as maybe accepted.
   */
  private async waitForImages(account: UpstreamAccount, taskId: string, deadline: number, signal: AbortSignal): Promise<string[]> {
    for (let wait = this.pollIntervalMs; ; ) {
      await sleep(wait, undefined, { signal });
      wait = this.pollIntervalMs;
      let seen: Seen;
      try {
        seen = await this.look(account, taskId, signal);
      } catch (err) {
        if (signal.aborted) throw err;
        // An unreadable answer of an error status, or anything unclassified: a look that failed, not the task.
        const error = asProviderError(err, 'the upstream image status failed');
        if (!error.transient || Date.now() >= deadline) throw possiblyAccepted(error, true);
        wait = Math.max(wait, error.retryAfterMs ?? 0);
        seen = { state: 'running' };
      }
      if (seen.state === 'failed') throw seen.error;
      if (seen.state === 'succeeded') return seen.urls;
      // A long Retry-After never holds the request past the deadline: one last look at its end.
      const left = deadline - Date.now();
      if (left <= 0) throw new ProviderError('retryable', `the upstream image task did not finish within ${Math.round(this.timeoutMs / 1000)} s`, { maybeAccepted: true, jobKept: true });
      wait = Math.min(wait, left);
    }
  }

  /** One status call: the task's state; throws when the call (not the task) failed. */
  private async look(account: UpstreamAccount, taskId: string, signal: AbortSignal): Promise<Seen> {
    const outcome = await this.query(account, taskId, signal, 'image status');
    if (!outcome.ok) {
      // The task itself failed (risk control answers its code with the task): it is over.
      if (outcome.data?.task_status === 'failed') return { state: 'failed', error: outcome.error };
      // Kling does not know the task (any more): nothing runs, and asking again cannot help.
      if (isUnknownTask(outcome.error)) {
        return { state: 'failed', error: new ProviderError('failed', 'the upstream no longer knows this image task', { upstreamStatus: outcome.error.upstreamStatus, upstreamCode: outcome.error.upstreamCode }) };
      }
      throw statusCallError(outcome.error);
    }
    const task = outcome.data;
    // An unknown word throws (retryable): asked again, never guessed.
    const state = status(task?.task_status);
    if (state === 'failed') return { state, error: new ProviderError('failed', sanitizeMessage(task?.task_status_msg, 'the upstream reported the image task as failed')) };
    if (state === 'running') return { state };
    const images = (task?.task_result?.images ?? [])
      .filter((img): img is { index?: unknown; url: string } => typeof img?.url === 'string' && img.url !== '')
      .sort((a, b) => Number(a.index ?? 0) - Number(b.index ?? 0));
    if (images.length === 0) return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the image task without an image') };
    return { state, urls: images.map((img) => img.url) };
  }

  /** The single-task query of a task by its id. */
  private async query(account: UpstreamAccount, id: string, signal: AbortSignal, what: string): Promise<KlingOutcome<KlingImageTask>> {
    const answer = await klingCall<KlingImageTask>(this.tokens, account, { method: 'GET', path: `${IMAGE_TASKS}/${encodeURIComponent(id)}`, timeoutMs: this.callTimeoutMs }, signal, what);
    return outcomeOf(answer, what);
  }
}

/**
 * The task, or its images' links, gone upstream (Kling no longer knows it; a link expired or
 * removed): the runner's own test of a job given up (image-runner.ts `jobGone`).
 */
function isGone(err: unknown): boolean {
  return err instanceof ProviderError && err.kind === 'failed' && [403, 404, 410].includes(err.upstreamStatus ?? 0);
}


