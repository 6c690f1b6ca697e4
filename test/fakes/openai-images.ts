/**
 * A fake OpenAI Images upstream (`gpt-image-*` models; the same wire format is served by
 * OpenAI-compatible gateways), after ../shared/reference/upstream-apis.md §0, §1.1–§1.5 and §8,
 * with field rules cross-checked against the openai-node SDK types (`resources/images.d.ts`).
 *
 *   POST {basePath}/images/generations   JSON (§1.1)
 *   POST {basePath}/images/edits         multipart/form-data (§1.2): `image` or `image[]` parts
 *                                        (1–16; png/jpeg/webp, decoded with sharp), optional `mask`
 *   GET  /dalle-files/{id}.png           the `url` of a dall-e answer with response_format=url
 *
 * Answers (§1.3): `{created, data:[{b64_json}], background, output_format, quality, size, usage}`
 * for GPT image models, with real PNG/JPEG/WebP images of the resolved size; dall-e models get
 * `{created, data:[{url}|{b64_json}, revised_prompt (dall-e-3)]}` only. With `stream: true` (JSON
 * `true` or multipart `"true"`) the answer is `text/event-stream` (§1.4): per image
 * `partial_images` frames `image_generation.partial_image` / `image_edit.partial_image`, then a
 * `*.completed` frame with `usage`; each frame is `event: <type>` + `data: <json>`. Usage checked
 * against the platform reference (images-streaming `image_generation.completed`: `usage` required,
 * "for the GPT image models only") and the SDK's `ImageGenCompletedEvent.usage` (required; no
 * `output_tokens_details`); a JSON answer's `usage` is that of the whole request (SDK
 * `ImagesResponse.usage`). Neither says what one `completed` frame of an n>1 stream reports: see the
 * ASSUMPTION at the stream.
 *
 * Errors always use `{"error":{"message","type","param","code"}}` (§1.5) and every answer has
 * `x-request-id`. Bad key: 401 `invalid_api_key`. Moderation: 400 `moderation_blocked` with type
 * `image_generation_user_error` and param `""` (§1.5). Rate limits through helpers (§1.5): 429
 * `rate_limit_exceeded` (type `requests`) with `retry-after` and the six `x-ratelimit-*` headers
 * (requests and tokens), optionally `retry-after-ms` and `x-should-retry` (both read by the SDK),
 * or 429 `insufficient_quota`.
 *
 * Options (all optional):
 * - `apiKeys` (default `['sk-test']`): accepted `Authorization: Bearer <key>` keys.
 * - `basePath` (default `/v1`).
 * - `models`: extra model ids accepted as GPT image models with the standard sizes (for
 *   OpenAI-compatible gateways that serve other names).
 * - `moderate(prompt, call)` → true blocks the request (default: the prompt contains "moderate-me").
 * - `holdMs`: keep each valid request open this long before answering (a slow upstream); also the
 *   mutable `fake.holdMs`, and `fake.pause()` / `fake.resume()` to hold requests until released.
 * - `streamDone` (default false): end streams with `data: [DONE]` (§9: unknown whether OpenAI does).
 * - `streamEventDelayMs` (default 0): pause between stream frames.
 * - `streamError: { afterEvents, error? }`: every stream emits an `event: error` frame after
 *   `afterEvents` frames and ends (per-request: `fake.streamErrorNext`).
 * - `completedAfterPartials` (default none): each image's `*.completed` frame is sent after this
 *   many of its partials, the remaining partials after it (§1.1: "final may arrive before all
 *   partials"); mutable as `fake.completedAfterPartials`.
 * - `record` (default true): false keeps no request/call log (benchmarks).
 * - `texture` (default `flat`): `noise` renders images that weigh what photos do (memory benchmarks).
 *
 * Helpers: `faults.push('generations' | 'edits', fault)` (status/body/delay/reset, checked after
 * auth, before validation), `rateLimitNext`, `quotaExhaustedNext`, `serverErrorNext`,
 * `streamErrorNext`; counters `counts`, `inFlight`, `maxInFlight`, `inFlightByKey`,
 * `maxInFlightByKey`; log `calls` (parsed parameters, received files with decoded dimensions, usage,
 * final status) next to the raw `requests` (multipart bodies also in `requests[i].form`).
 *
 * Decisions the reference leaves open are marked `ASSUMPTION:`; some error texts come from live
 * reports in issue threads, marked `[3P-LIVE]`.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import busboy from 'busboy';
import sharp from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type ImagesRoute = 'generations' | 'edits';

/** The `error` member of the OpenAI envelope. */
export interface OpenAIErrorBody {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

/** `usage` of §1.3 (streamed `*.completed` frames carry it without `output_tokens_details`). */
export interface ImageUsage {
  input_tokens: number;
  output_tokens: number;
  total_tokens: number;
  input_tokens_details: { text_tokens: number; image_tokens: number };
  output_tokens_details?: { image_tokens: number; text_tokens: number };
}

/** A file part the fake received on `/images/edits`. */
export interface ReceivedImage {
  /** The multipart field name: `image`, `image[]` or `mask`. */
  field: string;
  filename: string;
  mimeType: string;
  data: Buffer;
  /** Filled when sharp decoded the file. */
  width?: number;
  height?: number;
  /** sharp's format name (`png`, `jpeg`, `webp`, …). */
  format?: string;
  hasAlpha?: boolean;
}

/** One request to `generations` or `edits`, as the fake understood it. */
export interface ImageCall {
  route: ImagesRoute;
  requestId: string;
  apiKey: string;
  /** Parameters as sent: JSON values, or multipart text fields (strings; last one wins). */
  params: Record<string, unknown>;
  /** Resolved model (the default when none was sent); undefined when validation failed first. */
  model?: string;
  prompt?: string;
  n?: number;
  stream: boolean;
  /** Input images of an edit in the order received. */
  images: ReceivedImage[];
  mask?: ReceivedImage;
  /** Resolved settings of a successful answer. */
  resolved?: { size: string; quality?: string; background?: string; output_format: string };
  usage?: ImageUsage;
  /** HTTP status, set when the answer was sent (0 while in flight or after a reset). */
  status: number;
  outcome: 'pending' | 'ok' | 'error' | 'fault' | 'stream-error' | 'reset';
  error?: OpenAIErrorBody;
  /** Stream frames written (partials + completed + error). */
  streamEvents: number;
  request: RecordedRequest;
  startedAt: number;
  finishedAt?: number;
}

export interface StreamErrorSpec {
  /** Frames to send before the error (0: right after the headers). */
  afterEvents: number;
  /** The error frame's body, or `reset` to drop the connection instead. */
  error?: OpenAIErrorBody | 'reset';
}

export interface OpenAIImagesFakeOptions {
  apiKeys?: string[];
  basePath?: string;
  models?: string[];
  moderate?: (prompt: string, call: ImageCall) => boolean;
  holdMs?: number;
  streamDone?: boolean;
  streamEventDelayMs?: number;
  streamError?: StreamErrorSpec;
  completedAfterPartials?: number;
  record?: boolean;
  /** `noise`: images with photo-like weight instead of flat colours (see RenderSpec.texture). */
  texture?: 'flat' | 'noise';
}

/** Extra signals of an error answer that the OpenAI SDK reads (§1.5). */
export interface RetrySignals {
  /** `retry-after-ms`: the SDK prefers it to `retry-after`. */
  retryAfterMs?: number;
  /** `x-should-retry: true|false`: overrides the SDK's own retry decision. */
  shouldRetry?: boolean;
}

export interface OpenAIImagesFake extends FakeServer {
  /** Parsed log of `generations` / `edits` requests (empty with `record: false`). */
  calls: ImageCall[];
  /** Authenticated requests per route (faulted ones included). */
  counts: Record<ImagesRoute, number>;
  /** Requests currently open (after auth, until the answer ends), overall and per API key. */
  inFlight: number;
  maxInFlight: number;
  inFlightByKey: Record<string, number>;
  maxInFlightByKey: Record<string, number>;
  resetInFlightStats(): void;
  /** Hold each valid request this long before answering (mutable). */
  holdMs: number;
  /** Holds requests (before answering) until `resume()`. */
  pause(): void;
  resume(): void;
  /** End streams with `data: [DONE]` (mutable). */
  streamDone: boolean;
  /** Send each `*.completed` frame after this many partials (mutable; undefined: after all). */
  completedAfterPartials: number | undefined;
  /** The next `times` requests of `route` get a 429 `rate_limit_exceeded` with `retry-after` and `x-ratelimit-*`. */
  rateLimitNext(route: ImagesRoute, retryAfterSeconds: number, times?: number, signals?: RetrySignals): void;
  /** The next `times` requests of `route` get a 429 `insufficient_quota`. */
  quotaExhaustedNext(route: ImagesRoute, times?: number): void;
  /** The next `times` requests of `route` get a `status` (default 500) `server_error` envelope. */
  serverErrorNext(route: ImagesRoute, status?: number, times?: number, signals?: RetrySignals): void;
  /** The next streamed answer of `route` breaks after `afterEvents` frames (error frame or reset). */
  streamErrorNext(route: ImagesRoute, afterEvents?: number, error?: OpenAIErrorBody | 'reset'): void;
}

// ---------------------------------------------------------------------------------------------
// Models and parameters (§1.1, §1.2)

const GPT_IMAGE_MODELS = ['gpt-image-1', 'gpt-image-1-mini', 'gpt-image-1.5', 'gpt-image-2', 'gpt-image-2-2026-04-21', 'chatgpt-image-latest'];
/** Models with arbitrary `WxH` sizes (§1.1 size row). */
const FLEX_SIZE_MODELS = new Set(['gpt-image-2', 'gpt-image-2-2026-04-21']);
/** Models without transparent backgrounds (SDK `background` doc). */
const NO_TRANSPARENT_MODELS = FLEX_SIZE_MODELS;
/** "optional, newer models" (§1.3). ASSUMPTION: every GPT image model except gpt-image-1 and -mini. */
const OUTPUT_DETAILS_MODELS = new Set(['gpt-image-1.5', 'gpt-image-2', 'gpt-image-2-2026-04-21', 'chatgpt-image-latest']);
// §1.1 marks `chatgpt-image-latest` "(edits)"; the SDK's generations doc does not list it.
const GENERATION_MODELS = [...GPT_IMAGE_MODELS.filter((m) => m !== 'chatgpt-image-latest'), 'dall-e-2', 'dall-e-3'];
const EDIT_MODELS = [...GPT_IMAGE_MODELS, 'dall-e-2'];
const STANDARD_SIZES = ['1024x1024', '1536x1024', '1024x1536'];
const DALLE_SIZES: Record<string, string[]> = { 'dall-e-2': ['256x256', '512x512', '1024x1024'], 'dall-e-3': ['1024x1024', '1792x1024', '1024x1792'] };

const PARAMS: Record<ImagesRoute, Set<string>> = {
  generations: new Set(['prompt', 'model', 'n', 'size', 'quality', 'background', 'output_format', 'output_compression', 'moderation', 'response_format', 'style', 'stream', 'partial_images', 'user']),
  // §1.2: no `style`, `moderation` treated as unsupported on edits; `input_fidelity` added.
  edits: new Set(['prompt', 'model', 'n', 'size', 'quality', 'background', 'output_format', 'output_compression', 'input_fidelity', 'response_format', 'stream', 'partial_images', 'user']),
};
/** Parameters "specific to the GPT image models" (§1.1). */
const GPT_ONLY_PARAMS = ['background', 'output_format', 'output_compression', 'moderation', 'stream', 'partial_images', 'input_fidelity'];

const MAX_IMAGES = 16;
const MAX_IMAGE_BYTES = 50 * 1024 * 1024;
const DALLE2_MAX_BYTES = 4 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Errors

class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: OpenAIErrorBody,
  ) {
    super(body.message);
  }
}

const envelope = (message: string, type: string, param: string | null, code: string | null): { error: OpenAIErrorBody } => ({ error: { message, type, param, code } });
const invalid = (message: string, param: string | null, code: string | null) => new ApiError(400, { message, type: 'invalid_request_error', param, code });

/** `'a', 'b', and 'c'` as in OpenAI's "Supported values are: …" messages [3P-LIVE pollinations/pollinations#5037]. */
function oxford(values: readonly string[]): string {
  const q = values.map((v) => `'${v}'`);
  if (q.length <= 2) return q.join(' and ');
  return `${q.slice(0, -1).join(', ')}, and ${q.at(-1)}`;
}

const invalidValue = (param: string, value: unknown, supported: readonly string[]) =>
  invalid(`Invalid value: '${String(value)}'. Supported values are: ${oxford(supported)}.`, param, 'invalid_value');

function describeType(value: unknown): string {
  if (typeof value === 'string') return 'a string';
  if (typeof value === 'boolean') return 'a boolean';
  if (typeof value === 'number') return Number.isInteger(value) ? 'an integer' : 'a decimal';
  if (Array.isArray(value)) return 'an array';
  return 'an object';
}

// ASSUMPTION: type/range messages follow the wording OpenAI uses on its other endpoints
// (`invalid_type`, `integer_below_min_value`, `integer_above_max_value`, `string_above_max_length`).
const invalidType = (param: string, expected: string, value: unknown) => invalid(`Invalid type for '${param}': expected ${expected}, but got ${describeType(value)} instead.`, param, 'invalid_type');

const SERVER_ERROR: OpenAIErrorBody = { message: 'The server had an error while processing your request. Sorry about that!', type: 'server_error', param: null, code: null };

// ---------------------------------------------------------------------------------------------
// Parameter parsing

interface Parsed {
  model: string;
  gpt: boolean;
  prompt: string;
  n: number;
  /** Requested settings (may be `auto`). */
  size: string;
  quality: string;
  background: string;
  outputFormat: 'png' | 'jpeg' | 'webp';
  compression: number;
  responseFormat: 'url' | 'b64_json';
  style?: string;
  stream: boolean;
  partialImages: number;
  inputFidelity: string;
}

function asString(name: string, v: unknown): string {
  if (typeof v !== 'string') throw invalidType(name, 'a string', v);
  return v;
}

function asInteger(name: string, v: unknown, multipart: boolean, min: number, max: number): number {
  let n: number | undefined;
  if (typeof v === 'number' && Number.isInteger(v)) n = v;
  else if (multipart && typeof v === 'string' && /^-?\d+$/.test(v.trim())) n = Number(v.trim());
  if (n === undefined) throw invalidType(name, 'an integer', v);
  if (n < min) throw invalid(`Invalid '${name}': integer below minimum value. Expected a value >= ${min}, but got ${n} instead.`, name, 'integer_below_min_value');
  if (n > max) throw invalid(`Invalid '${name}': integer above maximum value. Expected a value <= ${max}, but got ${n} instead.`, name, 'integer_above_max_value');
  return n;
}

function asBoolean(name: string, v: unknown, multipart: boolean): boolean {
  if (typeof v === 'boolean') return v;
  // Multipart values are strings; the SDK sends `"true"` / `"false"` (§1.2 "multipart string values").
  if (multipart && typeof v === 'string' && (v === 'true' || v === 'false')) return v === 'true';
  throw invalidType(name, 'a boolean', v);
}

function oneOf(name: string, v: unknown, allowed: readonly string[]): string {
  const s = asString(name, v);
  if (!allowed.includes(s)) throw invalidValue(name, s, allowed);
  return s;
}

/** gpt-image-2 sizes: `WxH`, both divisible by 16, ratio 1:3..3:1, max 3840x2160 (§1.1). */
function checkFlexSize(size: string): void {
  const m = /^(\d+)x(\d+)$/.exec(size);
  if (!m) throw invalidValue('size', size, [...STANDARD_SIZES, 'auto']);
  const w = Number(m[1]);
  const h = Number(m[2]);
  // [3P-LIVE jezweb/claude-skills#91] exact text of the divisibility error.
  if (w % 16 !== 0 || h % 16 !== 0) throw invalid(`Invalid size '${size}'. Width and height must both be divisible by 16.`, 'size', 'invalid_value');
  // ASSUMPTION: texts of the other size errors. The limits: max edge 3840 and 655,360–8,294,400
  // pixels [3P: MicrosoftDocs/azure-ai-docs#779, openclaw/openclaw#118476]; max 3840x2160 per §1.1.
  if (Math.max(w, h) / Math.min(w, h) > 3) throw invalid(`Invalid size '${size}'. The aspect ratio must be between 1:3 and 3:1.`, 'size', 'invalid_value');
  if (Math.max(w, h) > 3840) throw invalid(`Invalid size '${size}'. Width and height must be at most 3840 pixels.`, 'size', 'invalid_value');
  if (w * h < 655_360 || w * h > 8_294_400) throw invalid(`Invalid size '${size}'. The total pixel count must be between 655360 and 8294400.`, 'size', 'invalid_value');
}

function parseParams(route: ImagesRoute, raw: Record<string, unknown>, multipart: boolean, extraModels: Set<string>): Parsed {
  // JSON null is "not sent" (the SDK types allow null for every optional field).
  const p = Object.fromEntries(Object.entries(raw).filter(([, v]) => v !== null && v !== undefined));
  // ASSUMPTION: any other parameter gets OpenAI's usual `unknown_parameter` 400.
  for (const key of Object.keys(p)) {
    if (!PARAMS[route].has(key)) throw invalid(`Unknown parameter: '${key}'.`, key, 'unknown_parameter');
  }
  if (p.prompt === undefined) throw invalid("Missing required parameter: 'prompt'.", 'prompt', 'missing_required_parameter');
  const prompt = asString('prompt', p.prompt);

  const models = route === 'generations' ? GENERATION_MODELS : EDIT_MODELS;
  let model: string;
  if (p.model === undefined) {
    // §1.1: generations default to dall-e-2 "unless a parameter specific to the GPT image models
    // is used" — ASSUMPTION: then gpt-image-1. Edits default to gpt-image-1.5 (2026 SDK docs).
    model = route === 'edits' ? 'gpt-image-1.5' : GPT_ONLY_PARAMS.some((k) => p[k] !== undefined) ? 'gpt-image-1' : 'dall-e-2';
  } else {
    model = asString('model', p.model);
    // ASSUMPTION: an unknown model is a 400 `invalid_value` listing the models of the endpoint.
    if (!models.includes(model) && !extraModels.has(model)) throw invalidValue('model', model, models);
  }
  const gpt = !model.startsWith('dall-e');

  // response_format on GPT image models: 400 unknown_parameter [3P-LIVE vercel/ai#6102,
  // lofcz/LLMTornado#155]. ASSUMPTION: the other family-specific parameters are refused the same way.
  const foreign = gpt ? ['response_format', 'style'] : GPT_ONLY_PARAMS.concat(model === 'dall-e-3' ? [] : ['style']);
  for (const key of foreign) if (p[key] !== undefined) throw invalid(`Unknown parameter: '${key}'.`, key, 'unknown_parameter');

  const maxPrompt = gpt ? 32000 : model === 'dall-e-2' ? 1000 : 4000;
  if (prompt.length > maxPrompt) {
    throw invalid(`Invalid 'prompt': string too long. Expected a string with maximum length ${maxPrompt}, but got a string with length ${prompt.length} instead.`, 'prompt', 'string_above_max_length');
  }

  const n = p.n === undefined ? 1 : asInteger('n', p.n, multipart, 1, 10);
  // ASSUMPTION: text of the dall-e-3 n=1 rule.
  if (model === 'dall-e-3' && n !== 1) throw invalid(`Invalid 'n': integer above maximum value. Expected a value <= 1, but got ${n} instead.`, 'n', 'integer_above_max_value');

  let size = p.size === undefined ? (gpt ? 'auto' : '1024x1024') : asString('size', p.size);
  if (!gpt) {
    if (!DALLE_SIZES[model]!.includes(size)) throw invalidValue('size', size, DALLE_SIZES[model]!);
  } else if (size !== 'auto' && !STANDARD_SIZES.includes(size)) {
    if (FLEX_SIZE_MODELS.has(model)) checkFlexSize(size);
    else throw invalidValue('size', size, [...STANDARD_SIZES, 'auto']);
  }

  // §1.1: GPT image auto|low|medium|high, dall-e-3 hd|standard, dall-e-2 standard; §1.2 adds
  // `standard` to every model on edits.
  const qualities = gpt ? ['auto', 'low', 'medium', 'high', ...(route === 'edits' ? ['standard'] : [])] : model === 'dall-e-3' ? ['standard', 'hd'] : ['standard'];
  const quality = p.quality === undefined ? (gpt ? 'auto' : 'standard') : oneOf('quality', p.quality, qualities);

  const outputFormat = (p.output_format === undefined ? 'png' : oneOf('output_format', p.output_format, ['png', 'jpeg', 'webp'])) as Parsed['outputFormat'];
  const background = p.background === undefined ? 'auto' : oneOf('background', p.background, ['transparent', 'opaque', 'auto']);
  if (background === 'transparent' && NO_TRANSPARENT_MODELS.has(model)) {
    // ASSUMPTION: text; the rule is in the SDK `background` doc ("will return an error for these models").
    throw invalid(`Transparent background is not supported for model '${model}'. Use 'opaque' or 'auto' instead.`, 'background', 'invalid_value');
  }
  if (background === 'transparent' && outputFormat === 'jpeg') {
    // ASSUMPTION: text; the rule is §1.1 ("Transparent requires output_format png or webp").
    throw invalid("Transparent background is not supported for output format 'jpeg'. Use 'png' or 'webp' instead.", 'background', 'invalid_value');
  }
  // ASSUMPTION: output_compression with png is accepted and ignored (§1.1 only says it applies to webp/jpeg).
  const compression = p.output_compression === undefined ? 100 : asInteger('output_compression', p.output_compression, multipart, 0, 100);
  if (p.moderation !== undefined) oneOf('moderation', p.moderation, ['low', 'auto']);
  const responseFormat = (p.response_format === undefined ? 'url' : oneOf('response_format', p.response_format, ['url', 'b64_json'])) as Parsed['responseFormat'];
  const style = p.style === undefined ? undefined : oneOf('style', p.style, ['vivid', 'natural']);
  const stream = p.stream === undefined ? false : asBoolean('stream', p.stream, multipart);
  // ASSUMPTION: partial_images without stream is validated and then ignored.
  const partialImages = p.partial_images === undefined ? 0 : asInteger('partial_images', p.partial_images, multipart, 0, 3);
  const inputFidelity = p.input_fidelity === undefined ? 'low' : oneOf('input_fidelity', p.input_fidelity, ['high', 'low']);
  if (p.input_fidelity !== undefined && model === 'gpt-image-1-mini') {
    // ASSUMPTION: text; the rule is §1.2 ("not gpt-image-1-mini").
    throw invalid(`The 'input_fidelity' parameter is not supported for model 'gpt-image-1-mini'.`, 'input_fidelity', 'unsupported_parameter');
  }
  if (p.user !== undefined) asString('user', p.user);

  return { model, gpt, prompt, n, size, quality, background, outputFormat, compression, responseFormat, style, stream, partialImages, inputFidelity };
}

// ---------------------------------------------------------------------------------------------
// Images

const PALETTE: [number, number, number][] = [
  [214, 69, 65],
  [67, 160, 71],
  [30, 136, 229],
  [251, 192, 45],
  [142, 36, 170],
  [0, 172, 193],
  [244, 81, 30],
  [117, 117, 117],
];

interface RenderSpec {
  width: number;
  height: number;
  format: 'png' | 'jpeg' | 'webp';
  compression: number;
  transparent: boolean;
  color: number;
  /** 0: the final image; k (1..3) of `of`: partial k−1. */
  stage: number;
  of: number;
  /**
   * `flat` (default): solid colours, which compress to almost nothing (a 3840x2160 PNG is 170 KiB).
   * `noise`: every channel of every pixel jitters by up to ±24 levels (a seeded generator), so the
   * images weigh what real ones do (a 3840x2160 PNG about 16 MB): for memory benchmarks.
   */
  texture: 'flat' | 'noise';
}

/** Raw RGB(A) pixels of `background` with seeded per-channel noise of ±24. */
function noisyPixels(width: number, height: number, channels: 3 | 4, background: { r: number; g: number; b: number; alpha?: number }, seed: number): Buffer {
  const pixels = Buffer.allocUnsafe(width * height * channels);
  let x = (seed * 2654435761) >>> 0 || 1;
  const base = [background.r, background.g, background.b, Math.round((background.alpha ?? 1) * 255)];
  for (let i = 0; i < pixels.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const c = i % channels;
    pixels[i] = c === 3 ? base[3]! : Math.max(0, Math.min(255, base[c]! + ((x >>> 0) % 49) - 24));
  }
  return pixels;
}

const renderCache = new Map<string, Promise<Buffer>>();

/** A real image of the requested size: a background with a centred block (bigger as the image "progresses"). */
function renderImage(spec: RenderSpec): Promise<Buffer> {
  const key = JSON.stringify(spec);
  const hit = renderCache.get(key);
  if (hit) return hit;
  const [r, g, b] = PALETTE[spec.color % PALETTE.length]!;
  const fraction = spec.stage === 0 ? 0.5 : (0.5 * spec.stage) / (spec.of + 1);
  const bw = Math.max(1, Math.round(spec.width * fraction));
  const bh = Math.max(1, Math.round(spec.height * fraction));
  const background = spec.transparent ? { r, g, b, alpha: 0 } : spec.stage === 0 ? { r, g, b } : { r: 230, g: 230, b: 230 };
  const channels = spec.transparent ? 4 : 3;
  const base =
    spec.texture === 'noise'
      ? sharp(noisyPixels(spec.width, spec.height, channels, background, spec.color * 31 + spec.stage), { raw: { width: spec.width, height: spec.height, channels } })
      : sharp({ create: { width: spec.width, height: spec.height, channels, background } });
  let img = base.composite([
    {
      input: { create: { width: bw, height: bh, channels: 4, background: spec.transparent ? { r, g, b, alpha: 1 } : { r: 255 - r, g: 255 - g, b: 255 - b, alpha: 1 } } },
      left: Math.floor((spec.width - bw) / 2),
      top: Math.floor((spec.height - bh) / 2),
    },
  ]);
  const quality = Math.max(1, spec.compression);
  img = spec.format === 'png' ? img.png() : spec.format === 'jpeg' ? img.jpeg({ quality }) : img.webp({ quality });
  const out = img.toBuffer();
  renderCache.set(key, out);
  out.catch(() => renderCache.delete(key));
  if (renderCache.size > 256) renderCache.delete(renderCache.keys().next().value!);
  return out;
}

function dims(size: string): { width: number; height: number } {
  const [w, h] = size.split('x').map(Number);
  return { width: w!, height: h! };
}

/** ASSUMPTION: `auto` resolves to 1024x1024, or for edits to the standard size nearest the first image's aspect ratio. */
function resolveSize(size: string, first: ReceivedImage | undefined): string {
  if (size !== 'auto') return size;
  if (!first?.width || !first.height) return '1024x1024';
  const aspect = first.width / first.height;
  return aspect > 1.25 ? '1536x1024' : aspect < 0.8 ? '1024x1536' : '1024x1024';
}

// ASSUMPTION: token counts. Output tokens per image follow OpenAI's gpt-image-1 table
// (low 272/408/400, medium 1056/1584/1568, high 4160/6240/6208 for square/portrait/landscape;
// the §1.4 example shows 4160 for a high 1024x1024), scaled by area for other sizes; text tokens
// are ⌈chars/4⌉; an input image costs 85 + 170 per 512-px tile after fitting in 2048 and scaling the
// short side to 768 (the vision formula).
const OUTPUT_TOKENS: Record<string, [number, number, number]> = { low: [272, 408, 400], medium: [1056, 1584, 1568], high: [4160, 6240, 6208] };

function outputTokensPerImage(quality: string, size: string): number {
  const table = OUTPUT_TOKENS[quality] ?? OUTPUT_TOKENS.high!;
  if (size === '1024x1024') return table[0];
  if (size === '1024x1536') return table[1];
  if (size === '1536x1024') return table[2];
  const { width, height } = dims(size);
  return Math.round((table[0] * width * height) / (1024 * 1024));
}

function inputImageTokens(img: ReceivedImage): number {
  let w = img.width ?? 1024;
  let h = img.height ?? 1024;
  const fit = Math.min(1, 2048 / Math.max(w, h));
  w *= fit;
  h *= fit;
  const short = Math.min(w, h);
  if (short > 768) {
    w = (w * 768) / short;
    h = (h * 768) / short;
  }
  return 85 + 170 * Math.ceil(w / 512) * Math.ceil(h / 512);
}

function computeUsage(p: Parsed, resolved: { size: string; quality: string }, images: ReceivedImage[]): ImageUsage {
  const text = Math.max(1, Math.ceil(p.prompt.length / 4));
  const image = images.reduce((sum, img) => sum + inputImageTokens(img), 0);
  const output = outputTokensPerImage(resolved.quality, resolved.size) * p.n;
  const usage: ImageUsage = { input_tokens: text + image, output_tokens: output, total_tokens: text + image + output, input_tokens_details: { text_tokens: text, image_tokens: image } };
  if (OUTPUT_DETAILS_MODELS.has(p.model)) usage.output_tokens_details = { image_tokens: output, text_tokens: 0 };
  return usage;
}

// ---------------------------------------------------------------------------------------------
// Multipart

interface ParsedForm {
  fields: Record<string, string[]>;
  files: { field: string; filename: string; mimeType: string; data: Buffer }[];
}

async function parseForm(req: IncomingMessage, body: Buffer): Promise<ParsedForm> {
  const form: ParsedForm = { fields: {}, files: [] };
  await new Promise<void>((resolve, reject) => {
    const bb = busboy({ headers: req.headers });
    bb.on('field', (name, value) => (form.fields[name] ??= []).push(value));
    bb.on('file', (name, stream, info) => {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => form.files.push({ field: name, filename: info.filename ?? '', mimeType: info.mimeType, data: Buffer.concat(chunks) }));
    });
    bb.on('close', resolve);
    bb.on('error', reject);
    bb.end(body);
  });
  return form;
}

async function decode(file: ReceivedImage): Promise<boolean> {
  try {
    // A full decode, so a truncated file fails as it would upstream.
    const { info } = await sharp(file.data).raw().toBuffer({ resolveWithObject: true });
    const meta = await sharp(file.data).metadata();
    file.width = info.width;
    file.height = info.height;
    file.format = meta.format;
    file.hasAlpha = meta.hasAlpha;
    return true;
  } catch {
    return false;
  }
}

/** Validates the files of an edit (§1.2); fills in their decoded dimensions. */
async function checkEditFiles(form: ParsedForm, model: string, images: ReceivedImage[], mask: ReceivedImage | undefined): Promise<void> {
  // [3P-LIVE openai/openai-ruby#147] an `image` sent as a text field.
  for (const name of ['image', 'image[]']) {
    if (form.fields[name]) throw invalid(`Invalid type for '${name.replace('[]', '')}': expected one of an array of files or file, but got a string instead.`, name.replace('[]', ''), 'invalid_type');
  }
  if (form.fields.mask) throw invalidType('mask', 'a file', form.fields.mask[0]);
  if (images.length === 0) throw invalid("Missing required parameter: 'image'.", 'image', 'missing_required_parameter');
  const dalle = model === 'dall-e-2';
  const maxImages = dalle ? 1 : MAX_IMAGES;
  if (images.length > maxImages) {
    // ASSUMPTION: text (OpenAI's array-length wording); the limits are §1.2's.
    throw invalid(`Invalid 'image': array too long. Expected an array with maximum length ${maxImages}, but got an array with length ${images.length} instead.`, 'image', 'array_above_max_length');
  }
  const mimeTypes = dalle ? ['image/png'] : ['image/jpeg', 'image/png', 'image/webp'];
  for (const [i, img] of images.entries()) {
    // [3P-LIVE prism-php/prism#725] `image[0]` names a part of an array upload.
    const param = img.field === 'image[]' ? `image[${i}]` : 'image';
    // The API goes by the part's Content-Type [3P-LIVE Comfy-Org/ComfyUI#9329, openai/openai-node#1468].
    if (!mimeTypes.includes(img.mimeType)) {
      throw invalid(`Invalid file '${param}': unsupported mimetype ('${img.mimeType}'). Supported file formats are ${oxford(mimeTypes)}.`, param, 'unsupported_file_mimetype');
    }
    // ASSUMPTION: text and code of the size limit.
    const max = dalle ? DALLE2_MAX_BYTES : MAX_IMAGE_BYTES;
    if (img.data.length > max) throw invalid(`Invalid file '${param}': the file exceeds the maximum size of ${max / 1024 / 1024}MB.`, param, 'file_too_large');
    // Undecodable images: code `invalid_image_file` [3P-LIVE yuji-hatakeyama/opencode-gpt-imagegen#82]; ASSUMPTION: text.
    if (!(await decode(img)) || !['png', 'jpeg', 'webp'].includes(img.format ?? '')) {
      throw invalid(`Invalid image file or mode for image ${i + 1}, please check your image file.`, param, 'invalid_image_file');
    }
    // ASSUMPTION: text of dall-e-2's square rule (§1.2).
    if (dalle && img.width !== img.height) throw invalid('Invalid input image - image must be square.', param, 'invalid_image_file');
  }
  if (mask) {
    // §1.2: a PNG <4MB with the first image's dimensions; its transparent area is the edit region,
    // so it needs an alpha channel [3P-LIVE prism-php/prism#725]. ASSUMPTION: texts.
    if (mask.data.length > DALLE2_MAX_BYTES) throw invalid("Invalid file 'mask': the file exceeds the maximum size of 4MB.", 'mask', 'file_too_large');
    if (!(await decode(mask)) || mask.format !== 'png') throw invalid('Invalid mask image format - mask must be a valid PNG file.', 'mask', 'invalid_image_file');
    const first = images[0]!;
    if (mask.width !== first.width || mask.height !== first.height) throw invalid('Invalid mask image format - mask size does not match image size.', 'mask', 'invalid_image_file');
    if (!mask.hasAlpha) throw invalid('Invalid mask image format - mask must have an alpha channel.', 'mask', 'invalid_image_file');
  }
}

// ---------------------------------------------------------------------------------------------
// Server

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function retryHeaders(signals: RetrySignals): Record<string, string> {
  return {
    ...(signals.retryAfterMs !== undefined && { 'retry-after-ms': String(signals.retryAfterMs) }),
    ...(signals.shouldRetry !== undefined && { 'x-should-retry': String(signals.shouldRetry) }),
  };
}

function colorSeed(prompt: string): number {
  return createHash('sha1').update(prompt).digest()[0]!;
}

export async function startOpenAIImagesFake(options: OpenAIImagesFakeOptions = {}): Promise<OpenAIImagesFake> {
  const keys = new Set(options.apiKeys ?? ['sk-test']);
  const basePath = (options.basePath ?? '/v1').replace(/\/+$/, '');
  const extraModels = new Set(options.models ?? []);
  const moderate = options.moderate ?? ((prompt: string) => prompt.includes('moderate-me'));
  const record = options.record !== false;
  const texture = options.texture ?? 'flat';
  const counts: Record<ImagesRoute, number> = { generations: 0, edits: 0 };
  const calls: ImageCall[] = [];
  const streamErrors: Record<ImagesRoute, StreamErrorSpec[]> = { generations: [], edits: [] };
  /** dall-e `url` answers. */
  const files = new Map<string, Buffer>();
  let gate: { promise: Promise<void>; release: () => void } | undefined;

  let fake: OpenAIImagesFake;

  const enter = (key: string) => {
    fake.inFlight++;
    fake.maxInFlight = Math.max(fake.maxInFlight, fake.inFlight);
    const n = (fake.inFlightByKey[key] ?? 0) + 1;
    fake.inFlightByKey[key] = n;
    fake.maxInFlightByKey[key] = Math.max(fake.maxInFlightByKey[key] ?? 0, n);
  };
  const leave = (key: string) => {
    fake.inFlight--;
    fake.inFlightByKey[key] = (fake.inFlightByKey[key] ?? 1) - 1;
  };

  const sendError = (res: ServerResponse, call: ImageCall | undefined, err: ApiError) => {
    if (call) {
      call.outcome = 'error';
      call.error = err.body;
    }
    sendJson(res, err.status, { error: err.body });
  };

  const handle = async (req: IncomingMessage, res: ServerResponse, recorded: RecordedRequest) => {
    const startedAt = Date.now();
    const requestId = `req_${randomBytes(16).toString('hex')}`;
    res.setHeader('x-request-id', requestId);
    // §1.5 lists these next to x-request-id. ASSUMPTION: no x-ratelimit-* on successful answers
    // ("not every endpoint emits them").
    res.setHeader('openai-version', '2020-10-01');
    const processed = () => res.setHeader('openai-processing-ms', String(Date.now() - startedAt));

    const fileMatch = /^\/dalle-files\/([\w-]+\.png)$/.exec(recorded.path);
    if (recorded.method === 'GET' && fileMatch) {
      const bytes = files.get(fileMatch[1]!);
      if (!bytes) return sendJson(res, 404, envelope('File not found.', 'invalid_request_error', null, null));
      res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(bytes.length) });
      return void res.end(bytes);
    }

    const route: ImagesRoute | undefined =
      recorded.method === 'POST' && recorded.path === `${basePath}/images/generations` ? 'generations' : recorded.method === 'POST' && recorded.path === `${basePath}/images/edits` ? 'edits' : undefined;
    if (!route) return sendJson(res, 404, envelope(`Invalid URL (${recorded.method} ${recorded.path})`, 'invalid_request_error', null, null));

    const auth = String(req.headers.authorization ?? '');
    if (!auth) {
      // ASSUMPTION: a missing key has code null (a wrong one has `invalid_api_key`).
      return sendJson(
        res,
        401,
        envelope(
          "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY). You can obtain an API key from https://platform.openai.com/account/api-keys.",
          'invalid_request_error',
          null,
          null,
        ),
      );
    }
    const apiKey = auth.startsWith('Bearer ') ? auth.slice(7).trim() : '';
    if (!keys.has(apiKey)) {
      const shown = apiKey.length > 8 ? `${apiKey.slice(0, 3)}${'*'.repeat(Math.min(20, apiKey.length - 7))}${apiKey.slice(-4)}` : `${apiKey.slice(0, 3)}***`;
      return sendJson(res, 401, envelope(`Incorrect API key provided: ${shown}. You can find your API key at https://platform.openai.com/account/api-keys.`, 'invalid_request_error', null, 'invalid_api_key'));
    }

    counts[route]++;
    enter(apiKey);
    const call: ImageCall = { route, requestId, apiKey, params: {}, stream: false, images: [], status: 0, outcome: 'pending', streamEvents: 0, request: recorded, startedAt };
    if (record) calls.push(call);
    res.on('close', () => {
      leave(apiKey);
      call.finishedAt = Date.now();
      if (res.writableFinished) call.status = res.statusCode;
      else if (call.outcome !== 'stream-error') call.outcome = 'reset';
    });

    try {
      // Parse the body first, so even faulted requests are logged with their parameters.
      let form: ParsedForm | undefined;
      const type = String(req.headers['content-type'] ?? '');
      if (route === 'edits') {
        if (!type.startsWith('multipart/form-data')) {
          // ASSUMPTION: edits are multipart only (§1.2); text of the refusal.
          throw invalid(`Invalid Content-Type header (${type || 'none'}), expected multipart/form-data.`, null, null);
        }
        try {
          form = await parseForm(req, recorded.body);
        } catch {
          // ASSUMPTION: text for a malformed multipart body.
          throw invalid('Could not parse multipart form data.', null, null);
        }
        recorded.form = form;
        call.params = Object.fromEntries(Object.entries(form.fields).filter(([k]) => !['image', 'image[]', 'mask'].includes(k)).map(([k, v]) => [k, v.at(-1)]));
        for (const f of form.files) {
          const file: ReceivedImage = { field: f.field, filename: f.filename, mimeType: f.mimeType, data: f.data };
          if (f.field === 'image' || f.field === 'image[]') call.images.push(file);
          else if (f.field === 'mask' && !call.mask) call.mask = file;
        }
      } else {
        let json = recorded.json;
        if (json === undefined && recorded.body.length > 0) {
          try {
            json = JSON.parse(recorded.body.toString('utf8'));
          } catch {
            json = undefined;
          }
        }
        if (json === undefined || typeof json !== 'object' || json === null || Array.isArray(json)) {
          throw invalid(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)",
            null,
            null,
          );
        }
        call.params = json as Record<string, unknown>;
      }

      processed();
      if (await applyFault(res, fake.faults.take(route))) {
        call.outcome = 'fault';
        return;
      }

      // File parts named other than image/image[]/mask are unknown parameters too.
      const strayFile = form?.files.find((f) => !['image', 'image[]', 'mask'].includes(f.field));
      if (strayFile) throw invalid(`Unknown parameter: '${strayFile.field}'.`, strayFile.field, 'unknown_parameter');
      const p = parseParams(route, call.params, route === 'edits', extraModels);
      call.model = p.model;
      call.prompt = p.prompt;
      call.n = p.n;
      call.stream = p.stream;
      if (p.stream && !p.gpt) throw invalid(`Unknown parameter: 'stream'.`, 'stream', 'unknown_parameter');
      if (form) await checkEditFiles(form, p.model, call.images, call.mask);

      if (moderate(p.prompt, call)) {
        // §1.5 [3P-LIVE]; ASSUMPTION: the rest of the message.
        throw new ApiError(400, {
          message: `Your request was rejected by the safety system. If you believe this is an error, contact us at help.openai.com and include the request ID ${requestId}.`,
          type: 'image_generation_user_error',
          param: '',
          code: 'moderation_blocked',
        });
      }

      // The "generation": a slow upstream holds here.
      if (fake.holdMs > 0) await sleep(fake.holdMs);
      while (gate) await gate.promise;
      if (res.destroyed) return;

      const size = resolveSize(p.size, call.images[0]);
      // ASSUMPTION: `auto` (and on edits `standard`) quality resolves to `high`, `auto` background to `opaque`.
      const quality = p.quality === 'auto' || p.quality === 'standard' ? 'high' : p.quality;
      const background = p.background === 'auto' ? 'opaque' : p.background;
      const transparent = background === 'transparent';
      const { width, height } = dims(size);
      const seed = colorSeed(p.prompt);
      const finals = await Promise.all(
        Array.from({ length: p.n }, (_, i) => renderImage({ width, height, format: p.gpt ? p.outputFormat : 'png', compression: p.gpt ? p.compression : 100, transparent, color: seed + i, stage: 0, of: 0, texture })),
      );
      const created = Math.floor(Date.now() / 1000);

      if (!p.gpt) {
        // dall-e (§1.3): url (default) or b64_json; revised_prompt for dall-e-3; no usage.
        call.resolved = { size, output_format: 'png' };
        const data = finals.map((img) => {
          const item: Record<string, string> = {};
          if (p.responseFormat === 'b64_json') item.b64_json = img.toString('base64');
          else {
            const name = `img-${randomBytes(12).toString('hex')}.png`;
            files.set(name, img);
            // ASSUMPTION: the fake serves the URL itself (OpenAI's are signed blob-storage URLs valid 60 min).
            item.url = `${fake.url}/dalle-files/${name}?se=${encodeURIComponent(new Date(Date.now() + 3600_000).toISOString())}&sig=${randomBytes(8).toString('hex')}`;
          }
          // ASSUMPTION: text of the revised prompt.
          if (p.model === 'dall-e-3') item.revised_prompt = `${p.prompt}, rendered in rich detail.`;
          return item;
        });
        processed();
        sendJson(res, 200, { created, data });
        call.outcome = 'ok';
        return;
      }

      const usage = computeUsage(p, { size, quality }, call.images);
      call.resolved = { size, quality, background, output_format: p.outputFormat };
      call.usage = usage;

      if (!p.stream) {
        processed();
        sendJson(res, 200, { created, data: finals.map((img) => ({ b64_json: img.toString('base64') })), background, output_format: p.outputFormat, quality, size, usage });
        call.outcome = 'ok';
        return;
      }

      // Streaming (§1.4).
      const prefix = route === 'generations' ? 'image_generation' : 'image_edit';
      const breakSpec = streamErrors[route].shift() ?? options.streamError;
      processed();
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.flushHeaders();
      let flushed: Promise<void> = Promise.resolve();
      const write = (event: string, data: unknown) => {
        flushed = new Promise<void>((resolve) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`, () => resolve()));
      };
      /** True when the stream must stop here (error frame sent or connection dropped). */
      const broken = async (): Promise<boolean> => {
        if (res.destroyed) return true;
        if (!breakSpec || call.streamEvents !== breakSpec.afterEvents) return false;
        call.outcome = 'stream-error';
        if (breakSpec.error === 'reset') {
          // The frames sent so far reach the client, then the connection drops.
          await flushed;
          res.socket?.destroy();
          return true;
        }
        const error = breakSpec.error ?? SERVER_ERROR;
        call.error = error;
        call.streamEvents++;
        write('error', { error });
        res.end();
        return true;
      };
      const gap = async () => {
        if ((options.streamEventDelayMs ?? 0) > 0) await sleep(options.streamEventDelayMs!);
      };
      // ASSUMPTION: with n>1 each image streams its partials and then its `completed` frame, image
      // after image (§1.4: interleaving undocumented); every `completed` carries the usage of the
      // whole request (identical objects — do not sum them). Streamed usage has the SDK event shape
      // (no output_tokens_details). Partials are images of the final size and format.
      const { output_tokens_details: _unused, ...streamUsage } = usage;
      const completedAfter = Math.min(fake.completedAfterPartials ?? p.partialImages, p.partialImages);
      for (let i = 0; i < p.n; i++) {
        const completed = async (): Promise<boolean> => {
          if (await broken()) return false;
          write(`${prefix}.completed`, {
            type: `${prefix}.completed`,
            b64_json: finals[i]!.toString('base64'),
            created_at: Math.floor(Date.now() / 1000),
            size,
            quality,
            background,
            output_format: p.outputFormat,
            usage: streamUsage,
          });
          call.streamEvents++;
          return true;
        };
        for (let k = 0; k < p.partialImages; k++) {
          if (k === completedAfter && !(await completed())) return;
          if (await broken()) return;
          const partial = await renderImage({ width, height, format: p.outputFormat, compression: p.compression, transparent, color: seed + i, stage: k + 1, of: p.partialImages, texture });
          if (res.destroyed) return;
          // Partial frames carry the requested settings (may be `auto`), §1.4 notes.
          write(`${prefix}.partial_image`, {
            type: `${prefix}.partial_image`,
            b64_json: partial.toString('base64'),
            partial_image_index: k,
            created_at: Math.floor(Date.now() / 1000),
            size: p.size,
            quality: p.quality,
            background: p.background,
            output_format: p.outputFormat,
          });
          call.streamEvents++;
          await gap();
        }
        if (completedAfter === p.partialImages && !(await completed())) return;
        if (i < p.n - 1) await gap();
      }
      if (await broken()) return;
      // §9: unknown whether OpenAI ends with [DONE]; the SDK tolerates both.
      if (fake.streamDone) res.write('data: [DONE]\n\n');
      res.end();
      call.outcome = 'ok';
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      processed();
      sendError(res, call, err);
    }
  };

  const server = await startFakeServer(handle);
  const push = (route: ImagesRoute, fault: Fault, times: number) => server.faults.push(route, fault, times);
  fake = Object.assign(server, {
    calls,
    counts,
    inFlight: 0,
    maxInFlight: 0,
    inFlightByKey: {} as Record<string, number>,
    maxInFlightByKey: {} as Record<string, number>,
    holdMs: options.holdMs ?? 0,
    streamDone: options.streamDone ?? false,
    completedAfterPartials: options.completedAfterPartials,
    resetInFlightStats() {
      fake.maxInFlight = fake.inFlight;
      for (const key of Object.keys(fake.maxInFlightByKey)) fake.maxInFlightByKey[key] = fake.inFlightByKey[key] ?? 0;
    },
    pause() {
      if (gate) return;
      let release!: () => void;
      const promise = new Promise<void>((r) => (release = r));
      gate = { promise, release };
    },
    resume() {
      const g = gate;
      gate = undefined;
      g?.release();
    },
    rateLimitNext(route: ImagesRoute, retryAfterSeconds: number, times = 1, signals: RetrySignals = {}) {
      // §1.5: code rate_limit_exceeded, type `requests` [UNVERIFIED in the reference]; headers per
      // §1.5: the request and token limits (ASSUMPTION: the token figures; resets are durations).
      push(
        route,
        {
          status: 429,
          headers: {
            'retry-after': String(retryAfterSeconds),
            'x-ratelimit-limit-requests': '50',
            'x-ratelimit-remaining-requests': '0',
            'x-ratelimit-reset-requests': `${retryAfterSeconds}s`,
            'x-ratelimit-limit-tokens': '100000',
            'x-ratelimit-remaining-tokens': '95840',
            'x-ratelimit-reset-tokens': '2m29.76s',
            ...retryHeaders(signals),
          },
          body: envelope(
            `Rate limit reached for images per min (RPM): Limit 50, Used 50, Requested 1. Please try again in ${retryAfterSeconds}s. Visit https://platform.openai.com/account/rate-limits to learn more.`,
            'requests',
            null,
            'rate_limit_exceeded',
          ),
        },
        times,
      );
    },
    quotaExhaustedNext(route: ImagesRoute, times = 1) {
      push(
        route,
        {
          status: 429,
          body: envelope(
            'You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.',
            'insufficient_quota',
            null,
            'insufficient_quota',
          ),
        },
        times,
      );
    },
    serverErrorNext(route: ImagesRoute, status = 500, times = 1, signals: RetrySignals = {}) {
      push(route, { status, body: { error: SERVER_ERROR }, headers: retryHeaders(signals) }, times);
    },
    streamErrorNext(route: ImagesRoute, afterEvents = 1, error?: OpenAIErrorBody | 'reset') {
      streamErrors[route].push({ afterEvents, error });
    },
  }) as OpenAIImagesFake;
  // Benchmarks keep no request log.
  if (!record) server.requests.push = () => 0;
  const close = server.close;
  fake.close = async () => {
    fake.resume();
    await close();
  };
  return fake;
}
