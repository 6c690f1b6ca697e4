/**
 * A fake fal.ai queue (queue.fal.run) and its media CDN, after ../shared/reference/upstream-apis.md
 * §7.1, §8, §9 and §10.1, with fal's own sources read where the reference is thin:
 *
 *   POST {base}/{owner}/{app}[/{path}]               submit → `{request_id, gateway_request_id,
 *                                                    response_url, status_url, cancel_url, status:
 *                                                    IN_QUEUE, queue_position}` (URLs under owner/app)
 *   GET  {base}/{owner}/{app}/requests/{id}/status   IN_QUEUE (queue_position) → IN_PROGRESS (logs
 *                                                    when `?logs=1`, else null) → COMPLETED (metrics)
 *   GET  {base}/{owner}/{app}/requests/{id}          the result: the model's output JSON, or its error
 *   PUT  {base}/{owner}/{app}/requests/{id}/cancel   202 CANCELLATION_REQUESTED | 400 ALREADY_COMPLETED
 *                                                    | 404 NOT_FOUND
 *   GET  {cdn}/files/{id}/{name}?expires=&sig=       an output, on another origin, no credentials; a link
 *                                                    past `expires` or `expire()`d answers 403
 *
 * Status and result live under `owner/app` only (§10.1): a GET or PUT under the submit's sub-path
 * (`fal-ai/kling-video/v2.1/pro/image-to-video/requests/{id}/status`) answers 405 Method Not Allowed,
 * as LiteLLM's fal adapter reports the real one does. fal-js (`parseEndpointId`, queue.ts) builds
 * the same prefix; `workflows/` and `comfy/` keep their namespace.
 *
 * Auth: `Authorization: Key <key>` (a key may be `id:secret`); none or an unknown key → 401
 * `{detail}`; a key of a locked account (`lockKey`) → 403 "User is locked. Reason: Exhausted
 * balance…" as fal answers an account without credit. An app the fake does not serve → 404.
 *
 * Inputs are validated as fal's model runners do, after the queue accepted the request (§7.1:
 * "Failed requests still reach COMPLETED; the failure surfaces when fetching the result"): the
 * result then answers 422 with `X-Fal-Retryable: false` and a `detail` list: pydantic's `[{loc:
 * ["body", field], msg, type}]` for the input's shape (a missing field, an enum), or fal's typed
 * model errors `[{loc, msg, type, url: "https://docs.fal.ai/errors/#<type>", ctx?}]` as fal's
 * "Model Errors" reference lists them (docs.fal.ai/errors, fal.ai/docs/documentation/model-apis/
 * errors, its copy of 2025-10-27). A prompt with `[fal:nsfw]` is refused by the content checker
 * (`content_policy_violation`). Media fields (`image_url`, `tail_image_url`, `image_urls[]`) are
 * URLs fal downloads — the fake really
 * fetches them (a Mediagate signed URL must serve the bytes; a download that fails is
 * `file_download_error`) — or data URLs; an image that cannot be read is `image_load_error`, and
 * one outside the model's limits `image_too_small` (ctx min_width, min_height), `file_too_large`
 * (ctx max_size) or `unsupported_image_format` (ctx supported_formats).
 *
 * Failures of a request that ran, checked (through the docs search) in fal's "Model
 * Errors" page (fal.ai/docs/documentation/model-apis/errors: "the error response consists of" an
 * HTTP status, "e.g. 500 for internal errors, 504 for timeouts", "required headers like
 * X-Fal-Retryable", and a body whose `detail` "is an array of Error objects") and its "Request
 * Error Types" page (…/model-apis/request-errors: infrastructure errors are a flat `{detail:
 * <string>, error_type}` with the same value in `X-Fal-Error-Type`, which model errors do not
 * carry; `runner_disconnected` "typical status code" 503, `request_timeout` 504, `bad_request` 400
 * "e.g., invalid timeout header"). The result of such a request answers the same every time:
 *   `[fal:model-error]`            500 `[{loc: ["body"], msg, type: "internal_server_error", url}]`
 *   `[fal:generation-timeout]`     504 … `generation_timeout`
 *   `[fal:downstream-unavailable]` 500 … `downstream_service_unavailable`
 *                                  (all three `X-Fal-Retryable: false`, no `X-Fal-Error-Type`; the
 *                                  status code of the third is from the page's list as recalled,
 *                                  not re-read)
 *   `[fal:fail]`                   503 `{detail: "Runner disconnected …", error_type:
 *                                  "runner_disconnected"}` with `X-Fal-Error-Type` (the runner died
 *                                  through fal's own retries; ASSUMPTION: `X-Fal-Retryable: false`
 *                                  too, which the request-errors page does not mention)
 * and its status says COMPLETED (or FAILED) with `error` and `error_type`.
 *
 * Start timeout (fal's "Platform Headers" page, …/model-apis/common-parameters): a submit's
 * `X-Fal-Request-Timeout: <seconds>` (> 0.1; anything else is 400 `bad_request`) bounds the time
 * until a runner starts the request (queue wait and retries), never the run itself. A request
 * still queued then ends: its result answers 504 with `X-Fal-Request-Timeout-Type: user` (as the
 * page says), `{detail: "Request timed out", error_type: "request_timeout"}` (ASSUMPTION: the error
 * type of that case is not documented). The fake's requests start after `queueMs`.
 *
 * ⚠ DISAGREE (§10.1): fal-js knows only IN_QUEUE / IN_PROGRESS / COMPLETED; LiteLLM also reads
 * FAILED and CANCELLED. `failureWords` (default false) makes a failed request's status `FAILED`
 * and a cancelled one `CANCELLED` instead of COMPLETED with `error`. ASSUMPTION: the status answers
 * 202 while the request is pending and 200 once it completed (§9: unverified).
 *
 * Models served, with their real input names (fal's model pages, fal.ai/models/<id>/api and
 * llms.txt, read November 2026):
 *   fal-ai/kling-video/v2.1/pro/image-to-video   prompt*, image_url*, duration "5"|"10",
 *                                                negative_prompt, cfg_scale 0–1, tail_image_url
 *                                                → {video: {url, content_type, file_name, file_size}};
 *                                                frames as Kling takes them (upstream-apis.md §6.3:
 *                                                jpg/png, ≤ 10 MB, ≥ 300 px a side)
 *   fal-ai/wan-25-preview/text-to-video          prompt*, aspect_ratio 16:9|9:16|1:1, resolution
 *                                                480p|720p|1080p, duration "5"|"10", negative_prompt,
 *                                                enable_prompt_expansion, seed → {video: {url}, seed}
 *   fal-ai/flux/dev                              prompt*, image_size (square_hd, square,
 *                                                portrait_4_3, portrait_16_9, landscape_4_3,
 *                                                landscape_16_9 or {width, height}), num_images 1–4,
 *                                                output_format jpeg|png, seed, num_inference_steps,
 *                                                guidance_scale, enable_safety_checker
 *                                                → {images: [{url, width, height, content_type}], seed, has_nsfw_concepts}
 *   fal-ai/bytedance/seedream/v4/text-to-image   prompt*, image_size ({width, height} 1024–4096, or
 *                                                an enum), num_images 1–6, max_images 1–6, seed,
 *                                                enable_safety_checker, sync_mode → {images: [{url}], seed}
 *   fal-ai/bytedance/seedream/v4/edit            the same, and image_urls* (1–10); input images as
 *                                                Seedream takes them (upstream-apis.md §5.1: over 14
 *                                                px a side, ≤ 10 MB; ASSUMPTION: fal passes
 *                                                ByteDance's limits on)
 * Seedream's images with `sync_mode: true` come inside the result as data URLs (fal's model pages:
 * "the media will be returned as a data URI"), at the size asked for and of seeded noise
 * (test/support/noise-png.ts), so that they weigh what a real image of that size does (MBs); its
 * CDN links are to small flat images (seedreamOutput says why).
 * Unknown fields are ignored, as pydantic's default models do.
 *
 * Faults per route (`submit`, `status`, `result`, `cancel`, `cdn`): `rateLimitNext` (429 with
 * `Retry-After` and `{detail}`), `serverErrorNext` (a 503 of fal's edge), `faults.push`. Logs:
 * `requests` (the queue's), `jobs`, `counts`.
 */
import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import sharp from 'sharp';
import { noisePng } from '../support/noise-png.ts';
import { applyFault, sendJson, startFakeServer, type FakeServer, type RecordedRequest } from './fake-http.ts';

export type FalRoute = 'submit' | 'status' | 'result' | 'cancel' | 'cdn';

export interface FalMedia {
  field: string;
  form: 'url' | 'data';
  mimeType: string;
  width: number;
  height: number;
}

export interface FalJob {
  id: string;
  /** The endpoint submitted to, and the `owner/app` its status lives under. */
  endpoint: string;
  app: string;
  apiKey: string;
  input: Record<string, unknown>;
  media: FalMedia[];
  createdAt: number;
  durationMs: number;
  /** `X-Fal-Request-Timeout` of its submit, in ms: the request ends if no runner started it by then. */
  startTimeoutMs?: number;
  /**
   * Set once the runner validated the input (at the first look after the queue). `errorType`: a
   * request error's (`error_type`, `X-Fal-Error-Type`); `timeoutType`: `X-Fal-Request-Timeout-Type`.
   */
  outcome?: { ok: true; output: Record<string, unknown> } | { ok: false; status: number; detail: unknown; errorType?: string; timeoutType?: 'user' };
  cancelled: boolean;
  expired: boolean;
  statusChecks: number;
  downloads: number;
}

export interface FalFakeOptions {
  apiKeys?: string[];
  queueMs?: number;
  jobDurationMs?: number;
  durationFor?: (prompt: string) => number | 'never' | undefined;
  urlTtlMs?: number;
  failureWords?: boolean;
}

export interface FalFake extends FakeServer {
  cdnUrl: string;
  jobs: Map<string, FalJob>;
  counts: Record<FalRoute, number>;
  urlTtlMs: number;
  failureWords: boolean;
  /** CDN requests that carried an Authorization header (they must not). */
  cdnSawAuth: number;
  rateLimitNext(route: FalRoute, seconds: number, times?: number): void;
  serverErrorNext(route: FalRoute, times?: number): void;
  /** The account of `key` is locked (no balance): every call answers 403. */
  lockKey(key: string, locked: boolean): void;
  expire(jobId: string): void;
  /** Submits whose input reached the fake, by endpoint. */
  submitsTo(endpoint: string): FalJob[];
}

type Loc = (string | number)[];

class Invalid extends Error {
  constructor(
    readonly detail: { loc: Loc; msg: string; type: string; url?: string; ctx?: Record<string, unknown>; input?: unknown }[],
    readonly status = 422,
  ) {
    super(detail.map((d) => d.msg).join('; '));
  }
}

const invalid = (field: string, msg: string, type = 'value_error') => new Invalid([{ loc: ['body', field], msg, type }]);
/** A model that failed on fal's side (docs.fal.ai/errors): not about any field of the input. */
const serverModelError = (status: number, type: string, msg: string) => new Invalid([{ loc: ['body'], msg, type, url: `https://docs.fal.ai/errors/#${type}` }], status);
/** The model errors a prompt asks for, and the status fal answers each with. */
const MODEL_FAILURES: Record<string, () => Invalid> = {
  '[fal:model-error]': () => serverModelError(500, 'internal_server_error', 'Internal server error'),
  '[fal:generation-timeout]': () => serverModelError(504, 'generation_timeout', 'Generation timeout'),
  '[fal:downstream-unavailable]': () => serverModelError(500, 'downstream_service_unavailable', 'Downstream service unavailable'),
};
/** One of fal's typed model errors (docs.fal.ai/errors), with its documentation link and context. */
const modelError = (loc: Loc, type: string, msg: string, ctx?: Record<string, unknown>) => new Invalid([{ loc: ['body', ...loc], msg, type, url: `https://docs.fal.ai/errors/#${type}`, ...(ctx && { ctx }) }]);
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 37) & 0xff;
  return out;
}

/** pydantic-like field checks. */
const check = {
  required(input: Record<string, unknown>, field: string): void {
    if (input[field] === undefined || input[field] === null) throw new Invalid([{ loc: ['body', field], msg: 'field required', type: 'value_error.missing' }]);
  },
  string(input: Record<string, unknown>, field: string): void {
    if (input[field] !== undefined && typeof input[field] !== 'string') throw invalid(field, 'str type expected', 'type_error.str');
  },
  enumOf(input: Record<string, unknown>, field: string, values: string[]): void {
    if (input[field] !== undefined && !values.includes(input[field] as string)) {
      throw new Invalid([{ loc: ['body', field], msg: `value is not a valid enumeration member; permitted: ${values.map((v) => `'${v}'`).join(', ')}`, type: 'type_error.enum', input: input[field] }]);
    }
  },
  number(input: Record<string, unknown>, field: string, min: number, max: number, integer = false): void {
    const v = input[field];
    if (v === undefined) return;
    if (typeof v !== 'number' || (integer && !Number.isInteger(v))) throw invalid(field, integer ? 'value is not a valid integer' : 'value is not a valid float', integer ? 'type_error.integer' : 'type_error.float');
    if (v < min) throw invalid(field, `ensure this value is greater than or equal to ${min}`, 'value_error.number.not_ge');
    if (v > max) throw invalid(field, `ensure this value is less than or equal to ${max}`, 'value_error.number.not_le');
  },
  boolean(input: Record<string, unknown>, field: string): void {
    if (input[field] !== undefined && typeof input[field] !== 'boolean') throw invalid(field, 'value could not be parsed to a boolean', 'type_error.bool');
  },
};

const IMAGE_SIZES: Record<string, [number, number]> = {
  square_hd: [1024, 1024],
  square: [512, 512],
  portrait_4_3: [768, 1024],
  portrait_16_9: [576, 1024],
  landscape_4_3: [1024, 768],
  landscape_16_9: [1024, 576],
};

function imageSize(input: Record<string, unknown>, fallback: string, limits: { min: number; max: number }): [number, number] {
  const v = input.image_size ?? fallback;
  if (typeof v === 'string') {
    const size = IMAGE_SIZES[v];
    if (!size) throw new Invalid([{ loc: ['body', 'image_size'], msg: `value is not a valid enumeration member; permitted: ${Object.keys(IMAGE_SIZES).map((k) => `'${k}'`).join(', ')}`, type: 'type_error.enum' }]);
    return size;
  }
  if (!isObject(v) || !Number.isInteger(v.width) || !Number.isInteger(v.height)) throw invalid('image_size', 'value is not a valid image size: an enumeration member or {width, height}', 'type_error');
  for (const side of ['width', 'height'] as const) {
    const n = v[side] as number;
    if (n < limits.min || n > limits.max) throw new Invalid([{ loc: ['body', 'image_size', side], msg: `ensure this value is between ${limits.min} and ${limits.max}`, type: 'value_error.number' }]);
  }
  return [v.width as number, v.height as number];
}

/** What a model takes of an input image. */
interface ImageLimits {
  minSide: number;
  maxBytes: number;
  formats: string[];
}

interface Model {
  /** Media fields (URLs fal downloads; a list field's every item). */
  media: string[];
  imageLimits?: ImageLimits;
  validate(input: Record<string, unknown>): void;
  /** The output, given a function that publishes a file on the CDN. */
  output(input: Record<string, unknown>, publish: (bytes: Buffer, name: string, type: string) => string): Promise<Record<string, unknown>>;
}

const VIDEO = mp4Bytes(24 * 1024);
const videoOutput = (publish: (b: Buffer, n: string, t: string) => string) => ({ video: { url: publish(VIDEO, 'output.mp4', 'video/mp4'), content_type: 'video/mp4', file_name: 'output.mp4', file_size: VIDEO.length } });

async function png(width: number, height: number, format: 'png' | 'jpeg' = 'png'): Promise<Buffer> {
  const img = sharp({ create: { width, height, channels: 3, background: { r: (width * 3) % 256, g: 120, b: (height * 5) % 256 } } });
  return format === 'png' ? img.png().toBuffer() : img.jpeg().toBuffer();
}

/**
 * Seedream's images. With `sync_mode`, data URLs of noise at the full size: a result weighs what
 * fal's does (MBs an image). Otherwise CDN links to small flat images, a quarter of the size: a
 * download is fetched the same whatever it weighs, and a full-size render per result would make
 * the enumeration of every accepted size (images-capabilities-upstreams.test.ts) take minutes.
 */
async function seedreamOutput(input: Record<string, unknown>, publish: (b: Buffer, n: string, t: string) => string): Promise<Record<string, unknown>> {
  const [width, height] = imageSize(input, 'square_hd', { min: 1024, max: 4096 });
  const n = (input.num_images as number | undefined) ?? 1;
  const images = [];
  for (let i = 0; i < n; i++) {
    if (input.sync_mode === true) images.push({ url: `data:image/png;base64,${(await noisePng(width, height, 7 + i)).toString('base64')}`, content_type: 'image/png' });
    else images.push({ url: publish(await png(Math.round(width / 4), Math.round(height / 4)), `${i}.png`, 'image/png'), content_type: 'image/png' });
  }
  return { images, seed: input.seed ?? 777 };
}

function seedreamValidate(input: Record<string, unknown>): void {
  check.required(input, 'prompt');
  check.string(input, 'prompt');
  imageSize(input, 'square_hd', { min: 1024, max: 4096 });
  check.number(input, 'num_images', 1, 6, true);
  check.number(input, 'max_images', 1, 6, true);
  check.number(input, 'seed', 0, 2 ** 31 - 1, true);
  check.boolean(input, 'enable_safety_checker');
  check.boolean(input, 'sync_mode');
}

const MODELS: Record<string, Model> = {
  'fal-ai/kling-video/v2.1/pro/image-to-video': {
    media: ['image_url', 'tail_image_url'],
    imageLimits: { minSide: 300, maxBytes: 10 * 1024 * 1024, formats: ['jpeg', 'png'] },
    validate(input) {
      check.required(input, 'prompt');
      check.string(input, 'prompt');
      check.required(input, 'image_url');
      check.enumOf(input, 'duration', ['5', '10']);
      check.string(input, 'negative_prompt');
      check.number(input, 'cfg_scale', 0, 1);
      if (typeof input.prompt === 'string' && input.prompt.length > 2500) throw invalid('prompt', 'ensure this value has at most 2500 characters', 'value_error.any_str.max_length');
    },
    output: async (_input, publish) => videoOutput(publish),
  },
  'fal-ai/wan-25-preview/text-to-video': {
    media: [],
    validate(input) {
      check.required(input, 'prompt');
      check.string(input, 'prompt');
      check.enumOf(input, 'aspect_ratio', ['16:9', '9:16', '1:1']);
      check.enumOf(input, 'resolution', ['480p', '720p', '1080p']);
      check.enumOf(input, 'duration', ['5', '10']);
      check.string(input, 'negative_prompt');
      check.boolean(input, 'enable_prompt_expansion');
      check.number(input, 'seed', 0, 2 ** 31 - 1, true);
    },
    output: async (input, publish) => ({ ...videoOutput(publish), seed: input.seed ?? 42, actual_prompt: input.prompt }),
  },
  'fal-ai/flux/dev': {
    media: [],
    validate(input) {
      check.required(input, 'prompt');
      check.string(input, 'prompt');
      imageSize(input, 'landscape_4_3', { min: 256, max: 14142 });
      check.number(input, 'num_images', 1, 4, true);
      check.enumOf(input, 'output_format', ['jpeg', 'png']);
      check.number(input, 'seed', 0, 2 ** 31 - 1, true);
      check.number(input, 'num_inference_steps', 1, 50, true);
      check.number(input, 'guidance_scale', 1, 20);
      check.boolean(input, 'enable_safety_checker');
    },
    output: async (input, publish) => {
      const [width, height] = imageSize(input, 'landscape_4_3', { min: 256, max: 14142 });
      const format = (input.output_format as 'jpeg' | 'png' | undefined) ?? 'jpeg';
      const n = (input.num_images as number | undefined) ?? 1;
      const images = [];
      for (let i = 0; i < n; i++) images.push({ url: publish(await png(width, height, format), `${i}.${format === 'png' ? 'png' : 'jpg'}`, `image/${format}`), width, height, content_type: `image/${format}` });
      return { images, timings: { inference: 1.2 }, seed: input.seed ?? 1234, has_nsfw_concepts: images.map(() => false), prompt: input.prompt };
    },
  },
  'fal-ai/bytedance/seedream/v4/text-to-image': {
    media: [],
    validate: seedreamValidate,
    output: seedreamOutput,
  },
  'fal-ai/bytedance/seedream/v4/edit': {
    media: ['image_urls'],
    imageLimits: { minSide: 15, maxBytes: 10 * 1024 * 1024, formats: ['jpeg', 'png', 'webp'] },
    validate(input) {
      seedreamValidate(input);
      check.required(input, 'image_urls');
      const urls = input.image_urls;
      if (!Array.isArray(urls) || urls.length < 1 || urls.length > 10) throw invalid('image_urls', 'ensure this value has between 1 and 10 items', 'value_error.list');
    },
    output: seedreamOutput,
  },
};

const NAMESPACES = ['workflows', 'comfy'];
const appOf = (endpoint: string) => {
  const parts = endpoint.split('/');
  return parts.slice(0, NAMESPACES.includes(parts[0]!) ? 3 : 2).join('/');
};

/** A media field's value (a list field's items in turn), read as the model's runner does, checked against its limits. */
async function readMedia(value: unknown, field: string, limits: ImageLimits | undefined, index?: number): Promise<FalMedia[]> {
  if (Array.isArray(value) && index === undefined) {
    const all: FalMedia[] = [];
    for (let i = 0; i < value.length; i++) all.push(...(await readMedia(value[i], field, limits, i)));
    return all;
  }
  const loc: Loc = index === undefined ? [field] : [field, index];
  if (typeof value !== 'string' || value === '') throw new Invalid([{ loc: ['body', ...loc], msg: 'str type expected', type: 'type_error.str' }]);
  let bytes: Buffer;
  let form: FalMedia['form'];
  if (value.startsWith('data:')) {
    const m = /^data:image\/(png|jpeg|jpg|webp);base64,/i.exec(value.slice(0, 40));
    if (!m) throw modelError(loc, 'file_download_error', 'Unsupported data URL');
    form = 'data';
    bytes = Buffer.from(value.slice(m[0].length), 'base64');
  } else {
    form = 'url';
    try {
      const res = await fetch(value, { signal: AbortSignal.timeout(10_000) });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      bytes = Buffer.from(await res.arrayBuffer());
    } catch {
      throw modelError(loc, 'file_download_error', 'Failed to download the file. Please check if the URL is accessible.');
    }
  }
  let meta: Awaited<ReturnType<ReturnType<typeof sharp>['metadata']>>;
  try {
    meta = await sharp(bytes).metadata();
  } catch {
    throw modelError(loc, 'image_load_error', 'The file is not a valid image.');
  }
  const media: FalMedia = { field: index === undefined ? field : `${field}[${index}]`, form, mimeType: `image/${meta.format}`, width: meta.width ?? 0, height: meta.height ?? 0 };
  if (limits) {
    if (!limits.formats.includes(meta.format ?? '')) {
      const extensions = limits.formats.flatMap((f) => (f === 'jpeg' ? ['.jpg', '.jpeg'] : [`.${f}`]));
      throw modelError(loc, 'unsupported_image_format', `Unsupported image format. Supported formats are ${extensions.join(', ')}.`, { supported_formats: extensions });
    }
    if (bytes.length > limits.maxBytes) throw modelError(loc, 'file_too_large', `File too large. Maximum size is ${limits.maxBytes} bytes.`, { max_size: limits.maxBytes });
    if (Math.min(media.width, media.height) < limits.minSide) {
      throw modelError(loc, 'image_too_small', `Image dimensions are too small. Minimum dimensions are ${limits.minSide}x${limits.minSide} pixels.`, { min_height: limits.minSide, min_width: limits.minSide });
    }
  }
  return [media];
}

export async function startFalFake(options: FalFakeOptions = {}): Promise<FalFake> {
  const keys = new Set(options.apiKeys ?? ['fal-test:secret']);
  const locked = new Set<string>();
  const queueMs = options.queueMs ?? 60;
  const jobDurationMs = options.jobDurationMs ?? 250;
  const jobs = new Map<string, FalJob>();
  const files = new Map<string, { bytes: Buffer; type: string; job: FalJob }>();
  const counts: Record<FalRoute, number> = { submit: 0, status: 0, result: 0, cancel: 0, cdn: 0 };
  const signKey = randomBytes(16);
  let fake!: FalFake;

  const sign = (path: string, expires: number) => createHmac('sha256', signKey).update(`${path}\n${expires}`).digest('hex').slice(0, 32);

  const cdn = await startFakeServer(async (req, res, recorded, self) => {
    counts.cdn++;
    if (req.headers.authorization !== undefined) fake.cdnSawAuth++;
    if (await applyFault(res, self.faults.take('cdn'))) return;
    const file = files.get(recorded.path);
    const expires = Number(recorded.query.get('expires'));
    const deny = (status: number, text: string) => {
      res.writeHead(status, { 'content-type': 'text/plain' });
      res.end(text);
    };
    if (!file) return deny(404, 'Not Found');
    if (recorded.query.get('sig') !== sign(recorded.path, expires)) return deny(403, 'Forbidden');
    if (file.job.expired || !(expires * 1000 > Date.now())) return deny(403, 'Request has expired');
    file.job.downloads++;
    res.writeHead(200, { 'content-type': file.type, 'content-length': String(file.bytes.length) });
    res.end(file.bytes);
  });

  const publisher = (job: FalJob) => (bytes: Buffer, name: string, type: string) => {
    const path = `/files/${randomBytes(6).toString('hex')}/${name}`;
    files.set(path, { bytes, type, job });
    const expires = Math.floor((Date.now() + fake.urlTtlMs) / 1000);
    return `${cdn.url}${path}?${new URLSearchParams({ expires: String(expires), sig: sign(path, expires) })}`;
  };

  const detail = (res: ServerResponse, status: number, text: unknown, headers: Record<string, string> = {}) => sendJson(res, status, { detail: text }, headers);

  /** Its start timeout passes while it is queued: no runner ever takes it. */
  const neverStarts = (job: FalJob) => job.startTimeoutMs !== undefined && job.startTimeoutMs < queueMs;

  /** Runs the model's validation and output once the request leaves the queue. */
  async function run(job: FalJob): Promise<void> {
    if (job.outcome) return;
    if (neverStarts(job)) {
      job.outcome = { ok: false, status: 504, detail: 'Request timed out', errorType: 'request_timeout', timeoutType: 'user' };
      return;
    }
    const model = MODELS[job.endpoint]!;
    try {
      model.validate(job.input);
      for (const field of model.media) if (job.input[field] !== undefined) job.media.push(...(await readMedia(job.input[field], field, model.imageLimits)));
      const prompt = typeof job.input.prompt === 'string' ? job.input.prompt : '';
      if (prompt.includes('[fal:nsfw]')) throw modelError(['prompt'], 'content_policy_violation', 'The content could not be processed because it contained material flagged by a content checker.');
      for (const [marker, failure] of Object.entries(MODEL_FAILURES)) if (prompt.includes(marker)) throw failure();
      if (prompt.includes('[fal:fail]')) {
        job.outcome = { ok: false, status: 503, detail: 'Runner disconnected while processing the request', errorType: 'runner_disconnected' };
        return;
      }
      job.outcome = { ok: true, output: await model.output(job.input, publisher(job)) };
    } catch (err) {
      if (!(err instanceof Invalid)) throw err;
      job.outcome = { ok: false, status: err.status, detail: err.detail };
    }
  }

  function phaseOf(job: FalJob): 'queued' | 'running' | 'done' {
    if (job.cancelled) return 'done';
    const age = Date.now() - job.createdAt;
    if (neverStarts(job)) return age < job.startTimeoutMs! ? 'queued' : 'done';
    if (age < queueMs) return 'queued';
    if (age < job.durationMs) return 'running';
    return 'done';
  }

  const server = await startFakeServer(async (req, res, recorded, self) => {
    const route = routeOf(recorded);
    if (!route) return detail(res, 404, 'Not Found');
    if (route.name === 'wrong-path') return detail(res, 405, 'Method Not Allowed');
    // Auth first, as fal's gateway.
    const header = req.headers.authorization;
    const key = header && /^Key\s+(\S+)$/.exec(header)?.[1];
    if (!header) return detail(res, 401, 'Missing authorization header');
    if (!key || !keys.has(key)) return detail(res, 401, 'No user found for Key ID and Secret');
    if (locked.has(key)) return detail(res, 403, 'User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing.');
    counts[route.name]++;
    if (await applyFault(res, self.faults.take(route.name))) return;

    if (route.name === 'submit') {
      if (!MODELS[route.endpoint]) return detail(res, 404, `Application '${route.endpoint}' not found`);
      if (!isObject(recorded.json)) return detail(res, 422, [{ loc: ['body'], msg: 'value is not a valid dict', type: 'type_error.dict' }]);
      const timeout = req.headers['x-fal-request-timeout'];
      const startTimeout = timeout === undefined ? undefined : Number(timeout);
      if (startTimeout !== undefined && !(startTimeout > 0.1)) return sendJson(res, 400, { detail: `Invalid X-Fal-Request-Timeout header: '${String(timeout)}'`, error_type: 'bad_request' }, { 'x-fal-error-type': 'bad_request' });
      const prompt = typeof recorded.json.prompt === 'string' ? recorded.json.prompt : '';
      const planned = options.durationFor?.(prompt);
      const job: FalJob = {
        id: randomUUID(),
        endpoint: route.endpoint,
        app: appOf(route.endpoint),
        apiKey: key,
        input: recorded.json,
        media: [],
        createdAt: Date.now(),
        durationMs: planned === 'never' ? Number.POSITIVE_INFINITY : (planned ?? jobDurationMs),
        ...(startTimeout !== undefined && { startTimeoutMs: startTimeout * 1000 }),
        cancelled: false,
        expired: false,
        statusChecks: 0,
        downloads: 0,
      };
      jobs.set(job.id, job);
      const base = `${fake.url}/${job.app}/requests/${job.id}`;
      const queued = [...jobs.values()].filter((j) => j.apiKey === key && phaseOf(j) === 'queued').length - 1;
      return sendJson(res, 200, { request_id: job.id, gateway_request_id: job.id, response_url: base, status_url: `${base}/status`, cancel_url: `${base}/cancel`, status: 'IN_QUEUE', queue_position: Math.max(0, queued) });
    }

    const job = jobs.get(route.id);
    if (!job || job.app !== route.app || job.apiKey !== key) {
      if (route.name === 'cancel') return sendJson(res, 404, { status: 'NOT_FOUND' });
      return detail(res, 404, 'Request not found');
    }
    const phase = phaseOf(job);
    if (route.name === 'cancel') {
      if (phase === 'done') return sendJson(res, 400, { status: 'ALREADY_COMPLETED' });
      job.cancelled = true;
      job.outcome = { ok: false, status: 400, detail: 'Request was cancelled', errorType: 'request_cancelled' };
      return sendJson(res, 202, { status: 'CANCELLATION_REQUESTED' });
    }
    if (route.name === 'status') {
      job.statusChecks++;
      const urls = { request_id: job.id, response_url: `${fake.url}/${job.app}/requests/${job.id}`, status_url: `${fake.url}/${job.app}/requests/${job.id}/status`, cancel_url: `${fake.url}/${job.app}/requests/${job.id}/cancel` };
      const logs = recorded.query.get('logs') === '1';
      if (phase === 'queued') {
        const ahead = [...jobs.values()].filter((j) => j.apiKey === key && j.createdAt < job.createdAt && phaseOf(j) === 'queued').length;
        return sendJson(res, 202, { status: 'IN_QUEUE', queue_position: ahead, ...urls });
      }
      if (phase === 'running') {
        return sendJson(res, 202, { status: 'IN_PROGRESS', logs: logs ? [{ message: 'Generating...', level: 'INFO', source: 'USER', timestamp: new Date().toISOString() }] : null, ...urls });
      }
      await run(job);
      const failed = job.outcome && !job.outcome.ok ? job.outcome : undefined;
      const errorFields = failed ? { error: typeof failed.detail === 'string' ? failed.detail : `Invalid status code: ${failed.status}`, error_type: failed.errorType ?? (failed.status === 422 ? 'validation_error' : 'internal_error') } : {};
      const word = failed && fake.failureWords ? (job.cancelled ? 'CANCELLED' : 'FAILED') : 'COMPLETED';
      return sendJson(res, 200, { status: word, logs: logs ? [] : null, metrics: { inference_time: job.durationMs / 1000 }, ...errorFields, ...urls });
    }
    // result
    if (phase !== 'done') return detail(res, 400, 'Request is still in progress');
    await run(job);
    const outcome = job.outcome!;
    if (outcome.ok) return sendJson(res, 200, outcome.output, { 'x-fal-request-id': job.id });
    const headers: Record<string, string> = {
      'x-fal-request-id': job.id,
      'x-fal-retryable': 'false',
      ...(outcome.errorType && { 'x-fal-error-type': outcome.errorType }),
      ...(outcome.timeoutType && { 'x-fal-request-timeout-type': outcome.timeoutType }),
    };
    // A request error is flat (`detail` a sentence, `error_type`); a model error is the `detail` list alone.
    return sendJson(res, outcome.status, { detail: outcome.detail, ...(outcome.errorType && { error_type: outcome.errorType }) }, headers);
  });

  fake = Object.assign(server, {
    cdnUrl: cdn.url,
    jobs,
    counts,
    urlTtlMs: options.urlTtlMs ?? 7 * 24 * 3_600_000,
    failureWords: options.failureWords ?? false,
    cdnSawAuth: 0,
    rateLimitNext(route: FalRoute, seconds: number, times = 1) {
      const queue = route === 'cdn' ? cdn.faults : server.faults;
      queue.push(route, { status: 429, body: { detail: 'Rate limit exceeded. Please try again later.' }, headers: { 'retry-after': String(seconds) } }, times);
    },
    serverErrorNext(route: FalRoute, times = 1) {
      (route === 'cdn' ? cdn.faults : server.faults).push(route, { status: 503, body: { detail: 'Service Unavailable' } }, times);
    },
    lockKey(key: string, on: boolean) {
      if (on) locked.add(key);
      else locked.delete(key);
    },
    expire(jobId: string) {
      const job = jobs.get(jobId);
      if (job) job.expired = true;
    },
    submitsTo(endpoint: string) {
      return [...jobs.values()].filter((j) => j.endpoint === endpoint);
    },
    close: async () => {
      await cdn.close();
      server.server.closeAllConnections();
      await new Promise<void>((resolve) => server.server.close(() => resolve()));
    },
  }) as FalFake;
  return fake;
}

type Route = { name: 'submit'; endpoint: string } | { name: 'status' | 'result' | 'cancel'; app: string; id: string } | { name: 'wrong-path' };

function routeOf(r: RecordedRequest): Route | undefined {
  const path = r.path.replace(/^\/+/, '');
  const m = /^(.+)\/requests\/([^/]+)(\/status|\/cancel)?$/.exec(path);
  if (m) {
    const [, prefix, id, tail] = m as unknown as [string, string, string, string | undefined];
    const name = tail === '/status' ? 'status' : tail === '/cancel' ? 'cancel' : 'result';
    if ((name === 'cancel') !== (r.method === 'PUT') || (name !== 'cancel' && r.method !== 'GET')) return { name: 'wrong-path' };
    // Status, result and cancel live under owner/app only: a deeper path is not a route of the queue.
    if (appOf(prefix) !== prefix) return { name: 'wrong-path' };
    return { name, app: prefix, id: decodeURIComponent(id) };
  }
  if (r.method === 'POST' && path.split('/').length >= 2) return { name: 'submit', endpoint: path };
  return undefined;
}
