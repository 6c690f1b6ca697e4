/**
 * A fake ByteDance ModelArk (BytePlus ModelArk / Volcengine Ark) serving Seedream images and
 * Seedance video tasks, after ../shared/reference/upstream-apis.md §0, §5 and §10.3, with every
 * "⚠ DISAGREE" handled as the reference says:
 *
 *   POST   {base}/images/generations             Seedream (§5.1): JSON `data[]` of images and
 *                                                per-image errors, or (`stream: true`) SSE
 *   POST   {base}/contents/generations/tasks     Seedance create (§5.2) → `{"id":"cgt-…"}`
 *   GET    {base}/contents/generations/tasks/{id} the task: queued → running → succeeded |
 *                                                failed | expired | cancelled
 *   DELETE {base}/contents/generations/tasks/{id} cancel (queued only) or delete the record
 *   GET    {storage}/…?X-Tos-Expires=…&X-Tos-Signature=…  result files (images, videos) on another
 *                                                origin, valid `urlTtlMs` (24 h) after they were made
 *
 * `{base}` is `/api/v3`. Auth: `Authorization: Bearer <ARK_API_KEY>`; a missing or unknown key is
 * 401 AuthenticationError (the body the reference observed live). Errors are the OpenAI-like
 * envelope `{"error":{"code","message","param","type"}}` with `Request id: …` at the end of the
 * message and an `x-request-id` header; statuses and codes as §5.3 lists them: 400 InvalidParameter /
 * MissingParameter / *SensitiveContentDetected, 401 AuthenticationError, 403 AccountOverdueError,
 * 404 InvalidEndpointOrModel.NotFound / ModelNotOpen / UnsupportedModel / ResourceNotFound, 429
 * RateLimitExceeded.EndpointRPMExceeded (`rateLimitNext`), 500 InternalServiceError.
 *
 * Rows of Volcengine's error-code table (https://www.volcengine.com/docs/82379/1299023, "推理错误码",
 * read from a stored copy) that depend on the account's state or Ark's own services, answered on
 * demand (`errorNext(route, name)`) with the table's status, type, code and English message:
 * 400 BadRequest ContentSecurityDetectionError (its risk-detection service failed), 403 Forbidden
 * OperationDenied.ServiceNotOpen, 429 TooManyRequests SetLimitExceeded, and 429 QuotaExceeded in its
 * three wordings (a model's free trial used up; "The request has exceeded the quota." = too many
 * queued tasks; a 5-hour/weekly/monthly usage quota). `%s` is the account id (ASSUMPTION: digits, as
 * Volcengine account ids are) and the model as asked; `{{id}}` the request id, where the table puts
 * one (none in ServiceNotOpen's or the usage quota's); `{{reset_time}}` an ISO time (ASSUMPTION: the
 * table does not show its format); CSDcode/CSDmessage stay `{}` as the table shows them. They come
 * after the request is validated, before any work (ASSUMPTION: the table does not say when). §5.3
 * names QuotaExceeded only (not its three meanings) and none of the others; no source disagrees.
 *
 * Accounts (`accounts`): each API key is an account with the models it has activated; a model the
 * account has not activated answers 404 `ModelNotOpen` (§10.3), whatever is asked of it. Platforms
 * (`platform`): BytePlus ids (`seedream-4-0-250828`, `dreamina-seedance-2-0-260128`) or Volcengine
 * ids (`doubao-…`, §5.1); the other platform's ids are unknown models. Endpoint ids `ep-…`
 * (`endpoints`) stand for a model.
 *
 * Seedream (§5.1): models 4.0, 4.5 and 5.0 lite with their `size` tiers and pixel ranges (a tier
 * keyword or `WxH`, never both), `image` as one string or a list of up to 14 data URLs
 * (`data:image/<lowercase format>;base64,`: jpeg, png, webp, bmp, tiff, gif; sides > 14 px, ratio
 * [1/16, 16], ≤ 10 MB, ≤ 36 MP: the reference's limits) or https URLs (recorded, not fetched),
 * `sequential_image_generation` `auto` | `disabled` with `max_images` 1–15 and inputs + max_images
 * ≤ 15, `response_format` `url` (default, a storage URL) | `b64_json`, `output_format` on 5.0 lite
 * only (jpeg default; 4.x always jpeg), `watermark` (default true), `stream`. No `n`: unknown
 * fields are ignored (recorded). Outputs are real JPEG (or PNG) files of the asked size; with a
 * tier keyword the model picks the size (ASSUMPTION: square). The answer is
 * `{model, created, data[], usage{generated_images, output_tokens = round(Σ w·h / 256), total_tokens}}`;
 * `data[]` holds `{url|b64_json, size}` or `{error:{code,message}}` per image. Prompt markers
 * (the model's own decisions, which a test cannot otherwise reach):
 *   `[ark:images=K]`           with `auto`, the model decides on K images (≤ max_images)
 *   `[ark:unsafe-image=I,J]`   images I, J fail moderation (OutputImageSensitiveContentDetected);
 *                              the batch goes on with the next image (§5.1)
 *   `[ark:broken-image=I]`     image I fails with InternalServiceError, which stops the batch
 *   `[ark:unsafe-prompt]`      400 InputTextSensitiveContentDetected before anything is made
 * With zero images made the answer is a top-level error (§5.1): 400 for a moderation failure, 500
 * for an internal one (ASSUMPTION: the statuses). Streams (§5.1, verbatim shapes): `event:` =
 * `data.type`, single-line JSON frames `image_generation.partial_succeeded` (`image_index`, `url` or
 * `b64_json`, `size`) / `partial_failed` (`error`) / `completed` (`usage`), then `data: [DONE]`;
 * headers are sent when the first image is done (§5.1 [3P-LIVE]); parameter errors are a plain 400
 * JSON before any SSE; `streamErrorNext` breaks a stream off with an `error` event.
 *
 * Seedance (§5.2, §10.3): models 1.0 pro, 1.0 pro fast, 1.0 lite t2v / i2v, 1.5 pro, 2.0 and 2.0
 * fast, each with its durations (1.0: 2–12; 1.5 pro: 4–12 or -1; 2.0: 4–15 or -1), resolutions
 * (2.0: 480p and 720p only — Comfy-Org/docs router-schemas/byteplus/dreamina-seedance-2-0-260128.json
 * and two 3P billing pages agree; §5.2 lists 1080p for the family), ratios (16:9, 4:3, 1:1, 3:4,
 * 9:16, 21:9, adaptive — not for 1.0 pro text-to-video nor lite reference/text-to-video), and
 * inputs: `content[]` with one `text`, `image_url` items with `role` `first_frame` (or none) /
 * `last_frame` / `reference_image` (1–4 on lite i2v, 1–9 on 2.0; modes exclusive; lite i2v needs an
 * image, lite t2v takes none, 1.0 pro fast no last frame, lite i2v no 1080p with reference images),
 * images as data URLs or https URLs with ratio (0.4, 2.5), sides (300, 6000) px and < 30 MB;
 * `video_url` / `audio_url` items on 2.0 only; `camera_fixed` not with reference images;
 * `generate_audio` ignored before 1.5 pro; `service_tier` `flex` not on 2.0;
 * `execution_expires_after` an integer in [3600, 259200] (default 172800). A task is `queued`
 * for `queuedMs`, `running` for `runningMs`, then by prompt: `[ark:unsafe-video]` → failed
 * OutputVideoSensitiveContentDetected,
 * `[ark:fail]` → failed InternalServiceError, `[ark:expire]` → `expired` (its execution time ran
 * out in the queue; ASSUMPTION: `error` stays null), else succeeded with `content.video_url` (a
 * storage URL of an MP4, valid `urlTtlMs`) and `usage`. `[ark:stay-queued]` / `[ark:stay-running]`
 * never move on. A task still queued `execution_expires_after` seconds after its creation is
 * `expired` (§5.2; `error` null as above) and never runs; one running by then runs on (ASSUMPTION:
 * the reference names the expiry for the queue only). A test moves a task's clock by moving its
 * `createdAt` back. In-flight tasks have no `content` or `usage` (§5.2: the callback example). DELETE
 * (https://docs.ai-tokenhub.com and docs.powertokens.ai copies of BytePlus's table agree): queued →
 * `cancelled`; succeeded, failed, expired → the record is deleted (later GETs answer 404
 * ResourceNotFound); running or cancelled → refused (ASSUMPTION: 400 InvalidParameter, the code of
 * a request the task's state does not allow). Answers `{}`.
 *
 * Rate limits: Ark documents no rate-limit headers and its Python SDK reads none
 * (volcengine/volcengine-python-sdk @b5be43b5 `volcenginesdkarkruntime/_base_client.py`:
 * `_calculate_retry_timeout` ignores Retry-After, unlike the OpenAI SDK it forks). A 429 here has
 * no Retry-After unless a test asks for one (`rateLimitNext(route, seconds)`), standing for a proxy
 * in front of Ark that adds it (ASSUMPTION).
 *
 * Checked in vendor sources: volcengine/volcengine-python-sdk @b5be43b5 (the commit §5 cites):
 * `resources/images/images.py` (request fields), `types/images/{images,image_gen_generating_event,
 * image_gen_completed_event}.py` (answers; the completed event may carry `error`),
 * `resources/content_generation/tasks.py` (create fields, DELETE), `types/content_generation/
 * {content_generation_task,create_task_content_param}.py` (roles, `video_url`/`audio_url`/`draft_task`
 * items, `error {code,message}`), `_streaming.py` (frames with `error` data), `_constants.py`;
 * WHQ25/rawgenai @b3f9cef1 `docs/research/seed/video/video.md` and
 * `docs/research/seed/image/seedream4-4.5.md` (copies of Volcengine's tutorials: per-model tables,
 * input limits, 24 h retention, the webhook body); Comfy-Org/docs `router-schemas/byteplus/*.json`
 * (per-model notes; its 4.0 minimum of 1024x1024 px disagrees with the reference's 1280x720 — the
 * official 1K table has sizes under 1024x1024, so the fake keeps the reference's).
 *
 * Faults per route through `faults.push(route, fault)`: `images`, `submit`, `poll`, `cancel`,
 * `storage` (checked after auth). Logs: `imageCalls`, `tasks` (a request refused before its work
 * is in neither: see `requests`).
 */
import { createHash, createHmac, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import sharp, { type Metadata } from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type ArkRoute = 'images' | 'submit' | 'poll' | 'cancel' | 'storage';
export type ArkPlatform = 'byteplus' | 'volcengine';
export type SeedanceStatus = 'queued' | 'running' | 'succeeded' | 'failed' | 'expired' | 'cancelled';

export interface ArkAccount {
  /** Canonical model names (`seedream-4-0-250828`, `seedance-2-0-260128`) the account has activated; default: all. */
  models?: string[];
  /** In arrears: every call answers 403 AccountOverdueError. */
  overdue?: boolean;
}

export interface ArkImageInput {
  /** `data` (a data URL) or `url`. */
  kind: 'data' | 'url';
  mimeType?: string;
  width?: number;
  height?: number;
  bytes?: number;
}

export interface ArkImageCall {
  apiKey: string;
  model: string;
  body: Record<string, unknown>;
  prompt: string;
  images: ArkImageInput[];
  stream: boolean;
  size: string;
  /** Per image made or refused, in order: its size, or its error code. */
  outcomes: ({ size: string } | { error: string })[];
  status: number;
}

export interface ArkFrame extends ArkImageInput {
  role: string;
}

export interface ArkTask {
  id: string;
  /** The model as the client named it, and its canonical name. */
  model: string;
  canonical: string;
  apiKey: string;
  body: Record<string, unknown>;
  prompt: string;
  images: ArkFrame[];
  /** Creation time (ms); a test moves it back to make the task as old as it would be later. */
  createdAt: number;
  queuedMs: number;
  runningMs: number;
  /** `execution_expires_after` in ms: a task still queued this long after its creation is `expired`. */
  expiresAfterMs: number;
  outcome: 'succeeded' | 'unsafe' | 'fail' | 'expire';
  cancelled: boolean;
  deleted: boolean;
  /** The result file's token, once made. */
  file?: string;
  polls: number;
}

export interface ArkFakeOptions {
  /** API key → account (default `{ 'ark-test': {} }`: one account with every model). */
  accounts?: Record<string, ArkAccount>;
  platform?: ArkPlatform;
  /** Endpoint ids (`ep-…`) → canonical model names. */
  endpoints?: Record<string, string>;
  /** Time a Seedance task is queued, then running (default 50 ms and 100 ms; mutable on the fake). */
  queuedMs?: number;
  runningMs?: number;
  /** Per-prompt override of the two. */
  timing?: (prompt: string) => { queuedMs?: number; runningMs?: number } | undefined;
  /** How long result URLs stay valid (default 24 h; mutable as `fake.urlTtlMs`). */
  urlTtlMs?: number;
  /** Wait this long before each image of a Seedream answer (mutable as `fake.imageMs`). */
  imageMs?: number;
  /** Size of the MP4 bytes (default 40 KiB). */
  videoBytes?: number;
}

export interface ArkFake extends FakeServer {
  storageUrl: string;
  accounts: Map<string, ArkAccount>;
  imageCalls: ArkImageCall[];
  tasks: Map<string, ArkTask>;
  queuedMs: number;
  runningMs: number;
  urlTtlMs: number;
  imageMs: number;
  /** Requests of the storage origin that carried an Authorization header (they must not). */
  storageSawAuth: number;
  /** The task's status as a GET would answer it now. */
  statusOf(id: string): SeedanceStatus | undefined;
  /** The result file of a task (or the file named by a result URL) is gone from now on: 403 as after 24 h. */
  expire(idOrUrl: string): void;
  /** The next `times` requests of `route` get 429 RateLimitExceeded.EndpointRPMExceeded (Retry-After only when `retryAfterSeconds` is given). */
  rateLimitNext(route: ArkRoute, retryAfterSeconds?: number, times?: number): void;
  /** The next `times` requests of `route` get 500 InternalServiceError. */
  serverErrorNext(route: ArkRoute, times?: number): void;
  /** The next streamed Seedream answer sends `afterImages` images, then an `error` event with `code`, and ends. */
  streamErrorNext(afterImages: number, code?: string): void;
  /** The next `times` valid requests of `route` get the error-code table's answer `name` (see the header); `faults.clear()` leaves them. */
  errorNext(route: 'images' | 'submit', name: ArkTableError, times?: number): void;
}

// ---------------------------------------------------------------------------------------------
// Models (§5.1, §5.2, §10.3)

interface SeedreamSpec {
  kind: 'image';
  /** Tier keywords and the square side the model picks for them (ASSUMPTION: square). */
  tiers: Record<string, number>;
  minPixels: number;
  maxPixels: number;
  /** `output_format` accepted (5.0 lite). */
  outputFormat: boolean;
}

interface SeedanceSpec {
  kind: 'video';
  durations: [number, number];
  /** Duration -1 (the model decides). */
  autoDuration: boolean;
  resolutions: string[];
  firstFrame: boolean;
  lastFrame: boolean;
  maxReferences: number;
  /** At least one image (i2v). */
  needsImage: boolean;
  /** Reference videos and audios (2.0). */
  media: boolean;
  audio: boolean;
  flex: boolean;
  /** `adaptive` refused without images (1.0 pro) or also with reference images (1.0 lite). */
  adaptive: 'always' | 'with-frames';
  /** `frames` instead of `duration` (1.0). */
  frames: boolean;
}

const SEEDREAM_4_0: SeedreamSpec = { kind: 'image', tiers: { '1K': 1024, '2K': 2048, '4K': 4096 }, minPixels: 921_600, maxPixels: 16_777_216, outputFormat: false };
const SEEDREAM_4_5: SeedreamSpec = { kind: 'image', tiers: { '2K': 2048, '4K': 4096 }, minPixels: 3_686_400, maxPixels: 16_777_216, outputFormat: false };
const SEEDREAM_5_0_LITE: SeedreamSpec = { kind: 'image', tiers: { '2K': 2048, '3K': 3072 }, minPixels: 3_686_400, maxPixels: 10_404_496, outputFormat: true };

const seedance = (o: Partial<SeedanceSpec>): SeedanceSpec => ({
  kind: 'video',
  durations: [2, 12],
  autoDuration: false,
  resolutions: ['480p', '720p', '1080p'],
  firstFrame: true,
  lastFrame: true,
  maxReferences: 0,
  needsImage: false,
  media: false,
  audio: false,
  flex: true,
  adaptive: 'with-frames',
  frames: true,
  ...o,
});
const SEEDANCE_2_0 = seedance({ durations: [4, 15], autoDuration: true, resolutions: ['480p', '720p'], maxReferences: 9, media: true, audio: true, flex: false, adaptive: 'always', frames: false });

/** Canonical names (BytePlus's, without the `dreamina-` of 2.0) → spec. */
const MODELS: Record<string, SeedreamSpec | SeedanceSpec> = {
  'seedream-4-0-250828': SEEDREAM_4_0,
  'seedream-4-5-251128': SEEDREAM_4_5,
  'seedream-5-0-260128': SEEDREAM_5_0_LITE,
  'seedance-1-0-pro-250528': seedance({}),
  'seedance-1-0-pro-fast-251015': seedance({ lastFrame: false }),
  'seedance-1-0-lite-t2v-250428': seedance({ firstFrame: false, lastFrame: false }),
  'seedance-1-0-lite-i2v-250428': seedance({ maxReferences: 4, needsImage: true }),
  'seedance-1-5-pro-251215': seedance({ durations: [4, 12], autoDuration: true, audio: true, adaptive: 'always', frames: false }),
  'seedance-2-0-260128': SEEDANCE_2_0,
  'seedance-2-0-fast-260128': SEEDANCE_2_0,
};

/** The id a platform uses for a canonical name (§5.1: `doubao-` on Volcengine; BytePlus names 2.0 `dreamina-`). */
function platformId(canonical: string, platform: ArkPlatform): string {
  if (platform === 'volcengine') return `doubao-${canonical}`;
  return canonical.startsWith('seedance-2-') ? `dreamina-${canonical}` : canonical;
}

const RATIOS = ['16:9', '4:3', '1:1', '3:4', '9:16', '21:9'];
const IMAGE_FORMATS = ['jpeg', 'png', 'webp', 'bmp', 'tiff', 'gif'];

// ---------------------------------------------------------------------------------------------
// Errors (§5.3)

const TYPES: Record<number, string> = { 400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 429: 'TooManyRequests', 500: 'InternalServerError' };

class ArkError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly param = '',
    /** Set when `message` is the table's own wording, which places the request id itself (or has none). */
    readonly requestId?: string,
  ) {
    super(message);
  }
}

const requestId = () => `0217${Date.now()}${randomBytes(10).toString('hex')}`;

/** The error-code table's answers `errorNext` gives; the part after `:` tells QuotaExceeded's three rows apart. */
export type ArkTableError = 'ContentSecurityDetectionError' | 'OperationDenied.ServiceNotOpen' | 'SetLimitExceeded' | 'QuotaExceeded:free-trial' | 'QuotaExceeded:queued-tasks' | 'QuotaExceeded:usage-quota';

/** Each answer's status, code and message, verbatim from the table but for its placeholders. */
const TABLE_ERRORS: Record<ArkTableError, (at: { id: string; account: string; model: string }) => { status: number; code: string; message: string }> = {
  ContentSecurityDetectionError: ({ id }) => ({ status: 400, code: 'ContentSecurityDetectionError', message: `Internal error.ARKRequest ID:${id};CSDRequestId:${randomBytes(8).toString('hex')};CSDcode:{};CSDmessage:{}` }),
  'OperationDenied.ServiceNotOpen': () => ({
    status: 403,
    code: 'OperationDenied.ServiceNotOpen',
    message: 'Operation is denied because the model service is unavailable, please go to the Volcano Ark console activation management page to activate the corresponding model service, or submit a work order to contact us.',
  }),
  SetLimitExceeded: ({ id, account, model }) => ({
    status: 429,
    code: 'SetLimitExceeded',
    message: `Your account [${account}] has reached the set inference limit for the [${model}] model, and the model service has been paused. To continue using this model, please visit the Model Activation page to adjust or close the "Safe Experience Mode". Request ID: ${id}`,
  }),
  'QuotaExceeded:free-trial': ({ id, account, model }) => ({ status: 429, code: 'QuotaExceeded', message: `Your account [${account}] has exhausted its free trial quota for the [${model}] model. Request ID: ${id}` }),
  'QuotaExceeded:queued-tasks': ({ id }) => ({ status: 429, code: 'QuotaExceeded', message: `The request has exceeded the quota. Request ID: ${id}` }),
  'QuotaExceeded:usage-quota': () => ({ status: 429, code: 'QuotaExceeded', message: `You have exceeded the 5-hour/weekly/monthly usage quota. It will reset at ${new Date(Date.now() + 3600_000).toISOString()}.` }),
};

/** A Volcengine-like account id for an API key (stable, digits). */
const accountIdOf = (apiKey: string) => String(parseInt(createHash('sha256').update(apiKey).digest('hex').slice(0, 8), 16)).padStart(10, '0');

/** An error body as Ark answers it (also for tests that push faults). */
export function arkErrorBody(status: number, code: string, message: string, param = '', id = requestId()): { error: { code: string; message: string; param: string; type: string } } {
  return { error: { code, message: `${message} Request id: ${id}`, param, type: TYPES[status] ?? 'BadRequest' } };
}

const invalid = (param: string, message: string) => new ArkError(400, 'InvalidParameter', message, param);
const missing = (param: string) => new ArkError(400, 'MissingParameter', `The request failed because it is missing one or multiple required parameters. Request parameter: ${param}.`, param);

// ---------------------------------------------------------------------------------------------
// Helpers

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function markers(prompt: string, name: string): number[] | undefined {
  const m = new RegExp(`\\[ark:${name}=(\\d+(?:,\\d+)*)\\]`).exec(prompt);
  return m ? m[1]!.split(',').map(Number) : undefined;
}

/** An input image: a data URL (decoded and measured) or a URL (recorded only). */
async function inputImage(value: unknown, param: string, limits: { minSide: number; maxSide: number; minRatio: number; maxRatio: number; maxBytes: number; maxPixels?: number; exclusive: boolean }): Promise<ArkImageInput> {
  if (typeof value !== 'string' || value === '') throw invalid(param, `The parameter \`${param}\` specified in the request is not valid: an image URL or data URL is required.`);
  if (/^https?:\/\//i.test(value)) return { kind: 'url' };
  const m = /^data:image\/([a-z]+);base64,/.exec(value.slice(0, 40));
  if (!m || !IMAGE_FORMATS.includes(m[1]!)) {
    throw invalid(param, `The parameter \`${param}\` specified in the request is not valid: image data must be data:image/<format>;base64,<data> with a lowercase format of ${IMAGE_FORMATS.join(', ')}.`);
  }
  const bytes = Buffer.from(value.slice(m[0].length), 'base64');
  let meta: Metadata;
  try {
    meta = await sharp(bytes).metadata();
  } catch {
    throw invalid(param, `The parameter \`${param}\` specified in the request is not valid: the image cannot be decoded.`);
  }
  const width = meta.width ?? 0;
  const height = meta.height ?? 0;
  const ratio = width / Math.max(1, height);
  const sideOk = limits.exclusive ? Math.min(width, height) > limits.minSide && Math.max(width, height) < limits.maxSide : Math.min(width, height) > limits.minSide;
  const ratioOk = limits.exclusive ? ratio > limits.minRatio && ratio < limits.maxRatio : ratio >= limits.minRatio && ratio <= limits.maxRatio;
  if (!sideOk || !ratioOk || bytes.length > limits.maxBytes || (limits.maxPixels !== undefined && width * height > limits.maxPixels)) {
    throw invalid(param, `The parameter \`${param}\` specified in the request is not valid: image of ${width}x${height} px and ${bytes.length} bytes is outside the supported range.`);
  }
  return { kind: 'data', mimeType: `image/${m[1]}`, width, height, bytes: bytes.length };
}

const renderCache = new Map<string, Promise<Buffer>>();

/** A real image of the size: a colour from the seed with a centred block. */
function render(width: number, height: number, seed: string, format: 'jpeg' | 'png'): Promise<Buffer> {
  const key = `${width}x${height}:${seed}:${format}`;
  let image = renderCache.get(key);
  if (!image) {
    const h = createHash('sha256').update(seed).digest();
    const background = { r: h[0]!, g: h[1]!, b: h[2]! };
    const block = { width: Math.max(1, width >> 1), height: Math.max(1, height >> 1), channels: 3 as const, background: { r: 255 - h[0]!, g: 255 - h[1]!, b: 255 - h[2]! } };
    const img = sharp({ create: { width, height, channels: 3, background } }).composite([{ input: { create: block }, gravity: 'centre' }]);
    image = (format === 'png' ? img.png({ compressionLevel: 1 }) : img.jpeg({ quality: 80 })).toBuffer();
    renderCache.set(key, image);
    if (renderCache.size > 32) renderCache.delete(renderCache.keys().next().value!);
  }
  return image;
}

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.writeUInt32BE(0x200, 12);
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 37) & 0xff;
  return out;
}

/** `cgt-20250629201507-n6k56`: the creation time and five characters (§5.2). */
function taskId(now: number): string {
  const stamp = new Date(now).toISOString().replace(/[-:T]/g, '').slice(0, 14);
  const tail = Array.from(randomBytes(5), (b) => 'abcdefghijklmnopqrstuvwxyz0123456789'[b % 36]).join('');
  return `cgt-${stamp}-${tail}`;
}

// ---------------------------------------------------------------------------------------------
// The fake

interface StoredFile {
  data: Buffer;
  contentType: string;
  madeAt: number;
  expired: boolean;
}

export async function startArkFake(options: ArkFakeOptions = {}): Promise<ArkFake> {
  const base = '/api/v3';
  const platform = options.platform ?? 'byteplus';
  const accounts = new Map(Object.entries(options.accounts ?? { 'ark-test': {} }));
  const endpoints = options.endpoints ?? {};
  const ids = new Map(Object.keys(MODELS).map((canonical) => [platformId(canonical, platform), canonical]));
  const video = mp4Bytes(options.videoBytes ?? 40 * 1024);
  const signingKey = randomBytes(16);
  const files = new Map<string, StoredFile>();
  const imageCalls: ArkImageCall[] = [];
  const tasks = new Map<string, ArkTask>();
  const streamErrors: { afterImages: number; code: string }[] = [];
  let fake: ArkFake;

  const signature = (path: string, date: string) => createHmac('sha256', signingKey).update(`${path}\n${date}`).digest('hex');

  // The object storage result URLs point to: another origin, which must never see the API key.
  const storage = await startFakeServer(async (req, res, recorded, self) => {
    if (req.headers.authorization !== undefined) fake.storageSawAuth++;
    if (await applyFault(res, self.faults.take('storage'))) return;
    const token = /^\/ark-results\/([a-f0-9]+)\.(?:jpeg|png|mp4)$/.exec(recorded.path)?.[1];
    const file = token ? files.get(token) : undefined;
    const date = recorded.query.get('X-Tos-Date') ?? '';
    // ASSUMPTION: object storage answers like TOS, JSON errors with Code/Message.
    const refuse = (status: number, code: string, message: string) => sendJson(res, status, { Code: code, Message: message, RequestId: requestId() });
    if (!file) return refuse(404, 'NoSuchKey', 'The specified key does not exist.');
    if (recorded.query.get('X-Tos-Signature') !== signature(recorded.path, date)) return refuse(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided.');
    if (file.expired || Date.now() - file.madeAt > fake.urlTtlMs) return refuse(403, 'AccessDenied', 'Request has expired.');
    res.writeHead(200, { 'content-type': file.contentType, 'content-length': String(file.data.length) });
    res.end(file.data);
  });

  /** Keeps a result file; its token. */
  const store = (data: Buffer, contentType: string): string => {
    const token = randomBytes(12).toString('hex');
    files.set(token, { data, contentType, madeAt: Date.now(), expired: false });
    return token;
  };

  /** The signed URL of a stored file, dated when the file was made (its age is the file's). */
  const urlOf = (token: string): string => {
    const file = files.get(token)!;
    const path = `/ark-results/${token}.${file.contentType === 'video/mp4' ? 'mp4' : file.contentType === 'image/png' ? 'png' : 'jpeg'}`;
    const date = new Date(file.madeAt).toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
    const query = new URLSearchParams({ 'X-Tos-Algorithm': 'TOS4-HMAC-SHA256', 'X-Tos-Date': date, 'X-Tos-Expires': '86400', 'X-Tos-Signature': signature(path, date) });
    return `${storage.url}${path}?${query}`;
  };

  const answerError = (res: ServerResponse, err: ArkError) => {
    const id = err.requestId ?? requestId();
    const body = err.requestId ? { error: { code: err.code, message: err.message, param: err.param, type: TYPES[err.status] ?? 'BadRequest' } } : arkErrorBody(err.status, err.code, err.message, err.param, id);
    sendJson(res, err.status, body, { 'x-request-id': id });
  };

  const tableErrors: Record<'images' | 'submit', ArkTableError[]> = { images: [], submit: [] };
  /** Throws the table's answer a test queued for `route`, if any. */
  const tableError = (route: 'images' | 'submit', apiKey: string, model: string) => {
    const name = tableErrors[route].shift();
    if (!name) return;
    const id = requestId();
    const { status, code, message } = TABLE_ERRORS[name]({ id, account: accountIdOf(apiKey), model });
    throw new ArkError(status, code, message, '', id);
  };

  /** The account of the request's bearer key. */
  const authenticate = (req: IncomingMessage): { key: string; account: ArkAccount } => {
    const key = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const account = key === undefined ? undefined : accounts.get(key);
    if (key === undefined || !account) throw new ArkError(401, 'AuthenticationError', 'the API key or AK/SK in the request is missing or invalid.');
    if (account.overdue) throw new ArkError(403, 'AccountOverdueError', 'The request failed because your account has an overdue balance. Top up your account and try again.');
    return { key, account };
  };

  /** The canonical model a request names, checked against the account. */
  const modelOf = (value: unknown, account: ArkAccount, kind: 'image' | 'video'): { name: string; canonical: string } => {
    if (typeof value !== 'string' || value === '') throw missing('model');
    const canonical = value.startsWith('ep-') ? endpoints[value] : ids.get(value);
    const spec = canonical ? MODELS[canonical] : undefined;
    if (!canonical || !spec) throw new ArkError(404, 'InvalidEndpointOrModel.NotFound', `The model or endpoint ${value} does not exist or you do not have access to it.`, 'model');
    if (account.models && !account.models.includes(canonical)) {
      throw new ArkError(404, 'ModelNotOpen', `Your account has not activated the model ${value}. Please activate the model service in the Ark Console.`, 'model');
    }
    if (spec.kind !== kind) throw new ArkError(404, 'UnsupportedModel', `The model ${value} does not support this API.`, 'model');
    return { name: value, canonical };
  };

  const server = await startFakeServer(async (req, res, recorded) => {
    const route = routeOf(recorded.method, recorded.path, base);
    if (!route) return answerError(res, new ArkError(404, 'ResourceNotFound', `The requested resource ${recorded.method} ${recorded.path} was not found.`));
    try {
      const { key, account } = authenticate(req);
      if (await applyFault(res, server.faults.take(route.name))) return;
      if (route.name === 'images') return await images(res, recorded, key, account);
      if (route.name === 'submit') return await submit(res, recorded, key, account);
      if (route.name === 'poll') return poll(res, key, route.id);
      return cancel(res, key, route.id);
    } catch (err) {
      if (err instanceof ArkError) return answerError(res, err);
      throw err;
    }
  });

  // -------------------------------------------------------------------------------------------
  // Seedream

  function imageSize(value: unknown, spec: SeedreamSpec): { width: number; height: number } {
    if (value === undefined) return { width: 2048, height: 2048 };
    const message = `The parameter \`size\` specified in the request is not valid: use one of ${Object.keys(spec.tiers).join(', ')} or WIDTHxHEIGHT with ${spec.minPixels}–${spec.maxPixels} pixels and a ratio within [1/16, 16].`;
    if (typeof value !== 'string') throw invalid('size', message);
    const side = spec.tiers[value];
    if (side) return { width: side, height: side };
    const m = /^(\d+)x(\d+)$/.exec(value);
    if (!m) throw invalid('size', message);
    const width = Number(m[1]);
    const height = Number(m[2]);
    const pixels = width * height;
    if (pixels < spec.minPixels || pixels > spec.maxPixels || width / height > 16 || height / width > 16) throw invalid('size', message);
    return { width, height };
  }

  async function images(res: ServerResponse, recorded: RecordedRequest, apiKey: string, account: ArkAccount): Promise<void> {
    const body = recorded.json;
    if (!isObject(body)) throw invalid('', 'The request body is not valid JSON.');
    const { name, canonical } = modelOf(body.model, account, 'image');
    const spec = MODELS[canonical] as SeedreamSpec;
    if (typeof body.prompt !== 'string' || body.prompt.trim() === '') throw missing('prompt');
    const prompt = body.prompt;
    const { width, height } = imageSize(body.size, spec);
    const rawImages = body.image === undefined ? [] : Array.isArray(body.image) ? body.image : [body.image];
    if (rawImages.length > 14) throw invalid('image', 'The parameter `image` specified in the request is not valid: at most 14 reference images are supported.');
    const inputs: ArkImageInput[] = [];
    for (const [i, value] of rawImages.entries()) {
      inputs.push(await inputImage(value, `image[${i}]`, { minSide: 14, maxSide: Infinity, minRatio: 1 / 16, maxRatio: 16, maxBytes: 10 * 1024 * 1024, maxPixels: 36_000_000, exclusive: false }));
    }
    const sequential = body.sequential_image_generation ?? 'disabled';
    if (sequential !== 'auto' && sequential !== 'disabled') throw invalid('sequential_image_generation', 'The parameter `sequential_image_generation` specified in the request is not valid: auto or disabled.');
    const options = isObject(body.sequential_image_generation_options) ? body.sequential_image_generation_options : {};
    const maxImages = options.max_images ?? 15 - inputs.length;
    if (typeof maxImages !== 'number' || !Number.isInteger(maxImages) || maxImages < 1 || maxImages > 15) throw invalid('sequential_image_generation_options.max_images', 'The parameter `max_images` specified in the request is not valid: an integer from 1 to 15.');
    if (sequential === 'auto' && inputs.length + maxImages > 15) {
      throw invalid('sequential_image_generation_options.max_images', 'The parameter `max_images` specified in the request is not valid: reference images plus generated images must not exceed 15.');
    }
    const responseFormat = body.response_format ?? 'url';
    if (responseFormat !== 'url' && responseFormat !== 'b64_json') throw invalid('response_format', 'The parameter `response_format` specified in the request is not valid: url or b64_json.');
    // ASSUMPTION: a parameter the model does not take is refused (the API's "strong validation").
    if (body.output_format !== undefined && !spec.outputFormat) throw invalid('output_format', `The parameter \`output_format\` specified in the request is not supported by the model ${name}.`);
    const outputFormat = body.output_format ?? 'jpeg';
    if (outputFormat !== 'jpeg' && outputFormat !== 'png') throw invalid('output_format', 'The parameter `output_format` specified in the request is not valid: png or jpeg.');
    for (const flag of ['stream', 'watermark'] as const) {
      if (body[flag] !== undefined && typeof body[flag] !== 'boolean') throw invalid(flag, `The parameter \`${flag}\` specified in the request is not valid: a boolean is required.`);
    }
    const stream = body.stream === true;
    if (prompt.includes('[ark:unsafe-prompt]')) {
      throw new ArkError(400, 'InputTextSensitiveContentDetected', 'The request failed because the input text may contain sensitive information.');
    }
    tableError('images', apiKey, name);

    const call: ArkImageCall = { apiKey, model: name, body: { ...body, image: undefined }, prompt, images: inputs, stream, size: `${width}x${height}`, outcomes: [], status: 0 };
    imageCalls.push(call);
    const decided = markers(prompt, 'images')?.[0];
    const count = sequential === 'auto' ? Math.min(maxImages, decided ?? maxImages) : 1;
    const unsafe = new Set(markers(prompt, 'unsafe-image') ?? []);
    const broken = markers(prompt, 'broken-image')?.[0];
    const created = Math.floor(Date.now() / 1000);
    const format = outputFormat === 'png' ? 'png' : 'jpeg';

    type Item = { url?: string; b64_json?: string; size: string } | { error: { code: string; message: string } };
    /** Makes image `i` (after `imageMs`): its data item, or its error. */
    const make = async (i: number): Promise<Item> => {
      if (fake.imageMs > 0) await new Promise((r) => setTimeout(r, fake.imageMs));
      if (unsafe.has(i)) return { error: { code: 'OutputImageSensitiveContentDetected', message: 'The request failed because the output image may contain sensitive information.' } };
      if (broken === i) return { error: { code: 'InternalServiceError', message: 'The service encountered an unexpected internal error.' } };
      const data = await render(width, height, `${prompt}:${i}`, format);
      const size = `${width}x${height}`;
      return responseFormat === 'b64_json' ? { b64_json: data.toString('base64'), size } : { url: urlOf(store(data, `image/${format}`)), size };
    };
    const usage = () => {
      const made = call.outcomes.filter((o): o is { size: string } => 'size' in o);
      const tokens = Math.round(made.reduce((sum, o) => sum + Number(o.size.split('x')[0]) * Number(o.size.split('x')[1]), 0) / 256);
      return { generated_images: made.length, output_tokens: tokens, total_tokens: tokens };
    };

    if (!stream) {
      const data: Item[] = [];
      for (let i = 0; i < count; i++) {
        const item = await make(i);
        data.push(item);
        call.outcomes.push('error' in item ? { error: item.error.code } : { size: item.size });
        if ('error' in item && item.error.code === 'InternalServiceError') break;
      }
      const errors = data.filter((d): d is { error: { code: string; message: string } } => 'error' in d);
      if (errors.length === data.length) {
        // §5.1: a top-level error only when no image was made.
        const first = errors[0]!.error;
        call.status = first.code === 'InternalServiceError' ? 500 : 400;
        return answerError(res, new ArkError(call.status, first.code, first.message));
      }
      call.status = 200;
      return sendJson(res, 200, { model: name, created, data, usage: usage() }, { 'x-request-id': requestId() });
    }

    call.status = 200;
    const frame = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, model: name, created: Math.floor(Date.now() / 1000), ...data })}\n\n`;
    const breaksOff = streamErrors.shift();
    for (let i = 0; i < count; i++) {
      if (breaksOff?.afterImages === i) {
        // ASSUMPTION: a failure of the whole stream is an `error` event whose data is `{"error": …}`,
        // the shape Ark's SDK raises on (_streaming.py); the stream then ends.
        if (!res.headersSent) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': requestId() });
        const status = breaksOff.code === 'InternalServiceError' ? 500 : breaksOff.code.includes('RateLimit') || breaksOff.code === 'ServerOverloaded' ? 429 : 400;
        res.end(`event: error\ndata: ${JSON.stringify(arkErrorBody(status, breaksOff.code, `The request failed with ${breaksOff.code}.`))}\n\n`);
        return;
      }
      const item = await make(i);
      // Headers go out with the first image (§5.1: they arrive when it is done).
      if (!res.headersSent) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': requestId() });
      call.outcomes.push('error' in item ? { error: item.error.code } : { size: item.size });
      res.write(frame('error' in item ? 'image_generation.partial_failed' : 'image_generation.partial_succeeded', { image_index: i, ...item }));
      if ('error' in item && item.error.code === 'InternalServiceError') break;
    }
    if (!res.headersSent) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': requestId() });
    res.write(frame('image_generation.completed', { usage: usage() }));
    res.end('data: [DONE]\n\n');
  }

  // -------------------------------------------------------------------------------------------
  // Seedance

  async function submit(res: ServerResponse, recorded: RecordedRequest, apiKey: string, account: ArkAccount): Promise<void> {
    const body = recorded.json;
    if (!isObject(body)) throw invalid('', 'The request body is not valid JSON.');
    const { name, canonical } = modelOf(body.model, account, 'video');
    const spec = MODELS[canonical] as SeedanceSpec;
    if (!Array.isArray(body.content) || body.content.length === 0) throw missing('content');
    let prompt = '';
    const images: ArkFrame[] = [];
    let videos = 0;
    let audios = 0;
    for (const [i, item] of body.content.entries()) {
      const at = `content[${i}]`;
      if (!isObject(item)) throw invalid(at, `The parameter \`${at}\` specified in the request is not valid.`);
      if (item.type === 'text') {
        if (typeof item.text !== 'string') throw invalid(`${at}.text`, `The parameter \`${at}.text\` specified in the request is not valid.`);
        prompt += item.text;
      } else if (item.type === 'image_url') {
        const role = item.role ?? 'first_frame';
        if (role !== 'first_frame' && role !== 'last_frame' && role !== 'reference_image') throw invalid(`${at}.role`, `The parameter \`${at}.role\` specified in the request is not valid.`);
        const url = isObject(item.image_url) ? item.image_url.url : undefined;
        const image = await inputImage(url, `${at}.image_url.url`, { minSide: 300, maxSide: 6000, minRatio: 0.4, maxRatio: 2.5, maxBytes: 30 * 1024 * 1024, exclusive: true });
        images.push({ ...image, role });
      } else if (item.type === 'video_url' || item.type === 'audio_url') {
        if (!spec.media) throw invalid(`${at}.type`, `The parameter \`${at}.type\` specified in the request is not supported by the model ${name}.`);
        if (item.type === 'video_url') videos++;
        else audios++;
      } else throw invalid(`${at}.type`, `The parameter \`${at}.type\` specified in the request is not valid.`);
    }
    const first = images.filter((i) => i.role === 'first_frame').length;
    const last = images.filter((i) => i.role === 'last_frame').length;
    const references = images.filter((i) => i.role === 'reference_image').length;
    const refuse = (why: string) => invalid('content', `The parameter \`content\` specified in the request is not valid: ${why} for the model ${name}.`);
    if (first > 1 || last > 1) throw refuse('at most one first frame and one last frame');
    if (references > 0 && first + last > 0) throw refuse('reference images cannot be combined with frames');
    if (first > 0 && !spec.firstFrame) throw refuse('image input is not supported');
    if (last > 0 && (!spec.lastFrame || first === 0)) throw refuse('a last frame is not supported without a first frame');
    if (references > spec.maxReferences) throw refuse(`at most ${spec.maxReferences} reference images are supported`);
    if (spec.needsImage && images.length === 0) throw refuse('an image is required');
    if (audios > 0 && images.length + videos === 0) throw refuse('audio needs at least one image or video');
    if (!prompt && images.length === 0) throw missing('content.text');

    // ASSUMPTION: 720p when absent (the reference's default; Comfy's notes say 1080p for 1.0 pro).
    const resolution = body.resolution ?? '720p';
    if (typeof resolution !== 'string' || !spec.resolutions.includes(resolution)) throw invalid('resolution', `The parameter \`resolution\` specified in the request is not valid for the model ${name}: ${spec.resolutions.join(', ')}.`);
    if (resolution === '1080p' && references > 0) throw invalid('resolution', `The parameter \`resolution\` specified in the request is not valid: 1080p is not supported with reference images for the model ${name}.`);
    const ratio = body.ratio ?? (images.length > 0 ? 'adaptive' : '16:9');
    if (typeof ratio !== 'string' || (ratio !== 'adaptive' && !RATIOS.includes(ratio))) throw invalid('ratio', 'The parameter `ratio` specified in the request is not valid.');
    if (ratio === 'adaptive' && spec.adaptive === 'with-frames' && first === 0) throw invalid('ratio', `The parameter \`ratio\` specified in the request is not valid: adaptive needs a first frame for the model ${name}.`);
    if (body.frames !== undefined && (!spec.frames || body.duration !== undefined)) throw invalid('frames', 'The parameter `frames` specified in the request is not valid.');
    const duration = body.duration ?? 5;
    const [min, max] = spec.durations;
    if (typeof duration !== 'number' || !Number.isInteger(duration) || !((duration >= min && duration <= max) || (duration === -1 && spec.autoDuration))) {
      throw invalid('duration', `The parameter \`duration\` specified in the request is not valid for the model ${name}: ${min}–${max} seconds.`);
    }
    for (const flag of ['camera_fixed', 'watermark', 'generate_audio', 'return_last_frame', 'draft'] as const) {
      if (body[flag] !== undefined && typeof body[flag] !== 'boolean') throw invalid(flag, `The parameter \`${flag}\` specified in the request is not valid: a boolean is required.`);
    }
    if (body.camera_fixed === true && references > 0) throw invalid('camera_fixed', 'The parameter `camera_fixed` specified in the request is not supported with reference images.');
    if (body.seed !== undefined && (typeof body.seed !== 'number' || !Number.isInteger(body.seed) || body.seed < -1 || body.seed > 4_294_967_295)) throw invalid('seed', 'The parameter `seed` specified in the request is not valid.');
    if (body.service_tier !== undefined && body.service_tier !== 'default' && !(body.service_tier === 'flex' && spec.flex)) throw invalid('service_tier', 'The parameter `service_tier` specified in the request is not valid.');
    const expiresAfter = body.execution_expires_after ?? 172_800;
    if (typeof expiresAfter !== 'number' || !Number.isInteger(expiresAfter) || expiresAfter < 3600 || expiresAfter > 259_200) throw invalid('execution_expires_after', 'The parameter `execution_expires_after` specified in the request is not valid.');
    if (prompt.includes('[ark:unsafe-prompt]')) throw new ArkError(400, 'InputTextSensitiveContentDetected', 'The request failed because the input text may contain sensitive information.');
    tableError('submit', apiKey, name);

    const now = Date.now();
    const timing = options.timing?.(prompt) ?? {};
    const stayQueued = prompt.includes('[ark:stay-queued]');
    const stayRunning = prompt.includes('[ark:stay-running]');
    const task: ArkTask = {
      id: taskId(now),
      model: name,
      canonical,
      apiKey,
      body,
      prompt,
      images,
      createdAt: now,
      queuedMs: stayQueued ? Infinity : (timing.queuedMs ?? fake.queuedMs),
      runningMs: stayRunning ? Infinity : (timing.runningMs ?? fake.runningMs),
      expiresAfterMs: expiresAfter * 1000,
      outcome: prompt.includes('[ark:unsafe-video]') ? 'unsafe' : prompt.includes('[ark:fail]') ? 'fail' : prompt.includes('[ark:expire]') ? 'expire' : 'succeeded',
      cancelled: false,
      deleted: false,
      polls: 0,
    };
    tasks.set(task.id, task);
    sendJson(res, 200, { id: task.id }, { 'x-request-id': requestId() });
  }

  function statusOf(task: ArkTask, now = Date.now()): SeedanceStatus {
    if (task.cancelled) return 'cancelled';
    const age = now - task.createdAt;
    // Ark's queue keeps a task `execution_expires_after` seconds at most: past it, it never runs.
    if (age >= task.expiresAfterMs && age < task.queuedMs) return 'expired';
    if (age < task.queuedMs) return 'queued';
    if (task.outcome === 'expire') return 'expired';
    if (age < task.queuedMs + task.runningMs) return 'running';
    if (task.outcome === 'unsafe' || task.outcome === 'fail') return 'failed';
    return 'succeeded';
  }

  /** The task of the key (another account's task is not found either). */
  function taskOf(key: string, id: string): ArkTask {
    const task = tasks.get(id);
    if (!task || task.deleted || task.apiKey !== key) throw new ArkError(404, 'ResourceNotFound', `The specified task ${id} is not found.`);
    return task;
  }

  function poll(res: ServerResponse, key: string, id: string): void {
    const task = taskOf(key, id);
    task.polls++;
    const status = statusOf(task);
    const spec = MODELS[task.canonical] as SeedanceSpec;
    const body = task.body;
    const seconds = typeof body.duration === 'number' && body.duration > 0 ? body.duration : 5;
    const answer: Record<string, unknown> = {
      id: task.id,
      model: task.model,
      status,
      error: null,
      created_at: Math.floor(task.createdAt / 1000),
      updated_at: Math.floor(Date.now() / 1000),
      seed: typeof body.seed === 'number' && body.seed >= 0 ? body.seed : 58944,
      resolution: body.resolution ?? '720p',
      ratio: body.ratio ?? '16:9',
      duration: seconds,
      framespersecond: 24,
      service_tier: body.service_tier ?? 'default',
      execution_expires_after: body.execution_expires_after ?? 172_800,
      ...(spec.audio && { generate_audio: body.generate_audio ?? true }),
    };
    if (status === 'failed') {
      answer.error =
        task.outcome === 'unsafe'
          ? { code: 'OutputVideoSensitiveContentDetected', message: 'The request failed because the output video may contain sensitive information.' }
          : { code: 'InternalServiceError', message: 'The service encountered an unexpected internal error.' };
    }
    if (status === 'succeeded') {
      task.file ??= store(video, 'video/mp4');
      const url = urlOf(task.file);
      const tokens = Math.round((1280 * 720 * 24 * seconds) / 1024);
      answer.content = { video_url: url };
      answer.usage = { completion_tokens: tokens, total_tokens: tokens };
    }
    sendJson(res, 200, answer, { 'x-request-id': requestId() });
  }

  function cancel(res: ServerResponse, key: string, id: string): void {
    const task = taskOf(key, id);
    const status = statusOf(task);
    if (status === 'queued') task.cancelled = true;
    else if (status === 'running' || status === 'cancelled') {
      throw invalid('id', `The task ${id} is ${status} and cannot be cancelled or deleted; only queued tasks can be cancelled.`);
    } else task.deleted = true;
    sendJson(res, 200, {}, { 'x-request-id': requestId() });
  }

  fake = Object.assign(server, {
    storageUrl: storage.url,
    accounts,
    imageCalls,
    tasks,
    queuedMs: options.queuedMs ?? 50,
    runningMs: options.runningMs ?? 100,
    urlTtlMs: options.urlTtlMs ?? 24 * 3600_000,
    imageMs: options.imageMs ?? 0,
    storageSawAuth: 0,
    statusOf(id: string) {
      const task = tasks.get(id);
      return task && !task.deleted ? statusOf(task) : undefined;
    },
    expire(idOrUrl: string) {
      const token = tasks.get(idOrUrl)?.file ?? /\/ark-results\/([a-f0-9]+)\./.exec(idOrUrl)?.[1];
      const file = token ? files.get(token) : undefined;
      if (file) file.expired = true;
    },
    rateLimitNext(route: ArkRoute, retryAfterSeconds?: number, times = 1) {
      const fault: Fault = {
        status: 429,
        body: arkErrorBody(429, 'RateLimitExceeded.EndpointRPMExceeded', 'The request has exceeded the rate limit of the endpoint (RPM). Please try again later.'),
        ...(retryAfterSeconds !== undefined && { headers: { 'retry-after': String(retryAfterSeconds) } }),
      };
      (route === 'storage' ? storage : server).faults.push(route, fault, times);
    },
    streamErrorNext(afterImages: number, code = 'InternalServiceError') {
      streamErrors.push({ afterImages, code });
    },
    errorNext(route: 'images' | 'submit', name: ArkTableError, times = 1) {
      for (let i = 0; i < times; i++) tableErrors[route].push(name);
    },
    serverErrorNext(route: ArkRoute, times = 1) {
      const fault: Fault = { status: 500, body: arkErrorBody(500, 'InternalServiceError', 'The service encountered an unexpected internal error.') };
      (route === 'storage' ? storage : server).faults.push(route, fault, times);
    },
  });
  const closeMain = server.close;
  fake.close = async () => {
    await Promise.all([closeMain(), storage.close()]);
  };
  return fake;
}

type Route = { name: 'images' } | { name: 'submit' } | { name: 'poll'; id: string } | { name: 'cancel'; id: string };

function routeOf(method: string, path: string, base: string): Route | undefined {
  if (method === 'POST' && path === `${base}/images/generations`) return { name: 'images' };
  if (method === 'POST' && path === `${base}/contents/generations/tasks`) return { name: 'submit' };
  const id = new RegExp(`^${base}/contents/generations/tasks/([^/]+)$`).exec(path)?.[1];
  if (id && method === 'GET') return { name: 'poll', id: decodeURIComponent(id) };
  if (id && method === 'DELETE') return { name: 'cancel', id: decodeURIComponent(id) };
  return undefined;
}
