/**
 * Provider kind `kling`, images: Kling's image generation (upstream-apis.md §10.2, the Kling image
 * API), asynchronous like its videos, run within the synchronous image request:
 *
 *   POST /v1/images/generations        {model_name, prompt, n, aspect_ratio, resolution "1k"|"2k"}
 *   GET  /v1/images/generations/{id}   until `succeed` (→ `task_result.images[] {index, url}`) or
 *                                      `failed` (→ `task_status_msg`), every `pollIntervalMs`
 *
 * bounded by the request's signal and `timeoutMs`. A poll answered with a rate limit or a 5xx is
 * asked again (the task runs on regardless, and is paid for); other errors end the request. Each
 * image is then downloaded from Kling's CDN (no credentials; a transient failure is tried again, up
 * to three times: failing over would pay for the images a second time), fitted to the size and
 * format the client asked for (`fitImage`) and reported in index order. `n` images are one task
 * (Kling takes 1–9); a task that returns fewer is reported as it is (only delivered images are
 * charged).
 *
 * `aspect_ratio` is the request's when Kling has it, else the nearest of Kling's eight; `resolution`
 * is `2k` for 2K and 4K tiers, else `1k`. Kling has no mask and its reference-image input is a
 * different operation per model: edits are refused before any call.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { fitImage } from '../image-output.ts';
import { ProviderError, downloadWithRetries, jobStatus, sanitizeMessage } from '../kit.ts';
import type { ImageEvents, ImageJob, ImageProvider, UpstreamAccount } from '../kit.ts';
import { KlingTokens } from './kling-auth.ts';
import { klingCall, outcomeOf } from './kling-api.ts';

export const KLING_IMAGE_POLL_MS = 2_000;
export const KLING_IMAGE_TIMEOUT_MS = 600_000;

/** `aspect_ratio` values of the image API. */
const RATIOS = ['16:9', '9:16', '1:1', '4:3', '3:4', '3:2', '2:3', '21:9'];

const status = jobStatus({ running: ['submitted', 'processing'], succeeded: ['succeed'], failed: ['failed'] }, 'image');

interface KlingImageTask {
  task_id?: unknown;
  task_status?: unknown;
  task_status_msg?: unknown;
  task_result?: { images?: { index?: unknown; url?: unknown }[] };
}

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
  tokens?: KlingTokens;
}

export class KlingImageProvider implements ImageProvider {
  private readonly pollIntervalMs: number;
  private readonly timeoutMs: number;
  private readonly tokens: KlingTokens;

  constructor(options: KlingImageOptions = {}) {
    this.pollIntervalMs = options.pollIntervalMs ?? KLING_IMAGE_POLL_MS;
    this.timeoutMs = options.timeoutMs ?? KLING_IMAGE_TIMEOUT_MS;
    this.tokens = options.tokens ?? new KlingTokens();
  }

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    if (job.operation === 'edit') throw new ProviderError('invalid_request', 'Kling image models here generate from a prompt only (no image edits)');
    const p = job.params;
    const fields = {
      model_name: job.model,
      prompt: job.prompt,
      n: job.n,
      aspect_ratio: klingImageRatio(p.aspectRatio, p.width, p.height),
      resolution: p.resolution === '2K' || p.resolution === '4K' ? '2k' : '1k',
    };
    // A task an earlier run of this one submitted is collected, not submitted again (ImageJob.resume).
    const taskId = typeof job.resume === 'string' && job.resume !== '' ? job.resume : await this.submit(account, fields, signal, events);
    const urls = await this.waitForImages(account, taskId, signal);
    for (const [i, url] of urls.slice(0, job.n).entries()) {
      // Kling's CDN: no credentials, redirects followed anywhere, a passing failure tried again.
      const data = await downloadWithRetries(url, signal, 'Kling');
      await events.image(i, { image: await fitImage(data, p) });
    }
  }

  /** Creates the image task; its id, recorded for a later run (Kling has no cancel: a task is always left to finish). */
  private async submit(account: UpstreamAccount, fields: Record<string, unknown>, signal: AbortSignal, events: ImageEvents): Promise<string> {
    const text = JSON.stringify(fields);
    const created = outcomeOf(
      await klingCall<KlingImageTask>(this.tokens, account, { method: 'POST', path: '/v1/images/generations', body: () => ({ body: text, length: Buffer.byteLength(text) }) }, signal, 'image generation'),
      'image generation',
    );
    if (!created.ok) throw created.error;
    const taskId = created.data?.task_id;
    if (typeof taskId !== 'string' || taskId === '') throw new ProviderError('retryable', 'the upstream accepted the image task without returning its id');
    await events.submitted?.(taskId);
    return taskId;
  }

  /** Polls the task until it is done; its images' URLs in index order. */
  private async waitForImages(account: UpstreamAccount, taskId: string, signal: AbortSignal): Promise<string[]> {
    const deadline = Date.now() + this.timeoutMs;
    for (;;) {
      await sleep(this.pollIntervalMs, undefined, { signal });
      const outcome = outcomeOf(
        await klingCall<KlingImageTask>(this.tokens, account, { method: 'GET', path: `/v1/images/generations/${encodeURIComponent(taskId)}` }, signal, 'image status'),
        'image status',
      );
      if (!outcome.ok) {
        if (outcome.data?.task_status === 'failed') throw outcome.error;
        if (!outcome.error.transient || Date.now() > deadline) throw outcome.error;
        if (outcome.error.retryAfterMs) await sleep(outcome.error.retryAfterMs, undefined, { signal });
        continue;
      }
      const task = outcome.data;
      const state = status(task?.task_status);
      if (state === 'failed') throw new ProviderError('failed', sanitizeMessage(task?.task_status_msg, 'the upstream reported the image task as failed'));
      if (state === 'succeeded') {
        const images = (task?.task_result?.images ?? [])
          .filter((img): img is { index?: unknown; url: string } => typeof img?.url === 'string' && img.url !== '')
          .sort((a, b) => Number(a.index ?? 0) - Number(b.index ?? 0));
        if (images.length === 0) throw new ProviderError('failed', 'the upstream finished the image task without an image');
        return images.map((img) => img.url);
      }
      if (Date.now() > deadline) throw new ProviderError('retryable', `the upstream image task did not finish within ${Math.round(this.timeoutMs / 1000)} s`);
    }
  }
}
