/**
 * A fake Gemini API (generativelanguage.googleapis.com) serving the Gemini image models and Veo,
 * after ../shared/reference/upstream-apis.md §3 (images), §3.6 (errors) and §4 (Veo), with the
 * "⚠ DISAGREE" traps reproduced as the reference says a fake should (§8):
 *
 *   POST {base}/models/{model}:generateContent              image models (§3.2 → §3.3)
 *   POST {base}/models/{model}:streamGenerateContent?alt=sse the same as SSE: bare `data:` frames,
 *                                                            no `event:` names, no `[DONE]`, whole
 *                                                            `inlineData` images (no partials);
 *                                                            frames end in `\n\n` or `\r\n\r\n`
 *                                                            (`sseFraming`, default alternating per
 *                                                            stream: the SDK splits on both, §3.1)
 *   POST {base}/models/{veo}:predictLongRunning              Veo submit (§4.1) → `{name}`
 *   GET  {base}/models/{veo}/operations/{id}                 the operation (§4.2)
 *   GET  {base}/files/{id}:download?alt=media                302 to a storage origin (another
 *                                                            listener: a different host:port)
 *   GET  {storage}/veo/{id}.mp4?sig=…                        the MP4 bytes
 *
 * Auth: `x-goog-api-key` or `?key=`. §3.6's auth statuses are 401 UNAUTHENTICATED and 403
 * PERMISSION_DENIED; `refuseKey(key, 401 | 403)` makes a known key answer one of them (a key that
 * lost access; the 403 text quotes the key, as Google's does). An unknown key answers 400
 * INVALID_ARGUMENT "API key not valid" with ErrorInfo reason `API_KEY_INVALID` (ASSUMPTION: Google's
 * observed answer, not in §3.6; `unknownKeyStatus: 401` answers it UNAUTHENTICATED instead); no
 * key at all is 403 PERMISSION_DENIED (ASSUMPTION: the text).
 * Errors are google.rpc.Status JSON (`{"error":{code,message,status,details}}`).
 * Rate limits (`rateLimitNext`) are 429 RESOURCE_EXHAUSTED with QuotaFailure (`quotaId`
 * …PerMinute… or …PerDay…) and `RetryInfo.retryDelay` in the body and **no Retry-After header**.
 *
 * Images: requests are proto3 JSON, camelCase or snake_case (`inlineData` / `inline_data`).
 * `imageConfig.aspectRatio` must be one the model knows, `imageSize` one of `512|1K|2K|4K` the
 * model takes (lowercase is refused; gemini-2.5-flash-image takes no `imageSize` at all, §3.2;
 * `512` is 3.1 Flash only, §3.1); the Vertex-only fields `outputMimeType`,
 * `outputCompressionQuality`, `personGeneration`, … are refused as unknown names. Input images are
 * limited per model (2.5 Flash 3, 3 Pro 14). An inline image is PNG, JPEG, WebP, HEIC or HEIF
 * (Google's list; GIF is not on it) and its bytes must be of the type its `mimeType` declares: GIF
 * bytes labelled `image/png` are a 400 INVALID_ARGUMENT (ASSUMPTION: the check by magic bytes and
 * its text). The answer is a real PNG of Google's official size for the ratio and size (§3.4);
 * without an aspect ratio it follows the first input image's ratio, else 1:1. gemini-3-pro-image
 * models first emit `thoughtImages` (default 2) interim images with `thought: true` (smaller, a
 * different colour, no signature); every final image carries a `thoughtSignature`. Prompt outcomes
 * (`outcome(prompt)`; default by keyword): `block-prompt` → `promptFeedback.blockReason: SAFETY`
 * and no candidates; `block-image` → finishReason `IMAGE_SAFETY` without an image; `text-only` →
 * finishReason `STOP` with text only; `no-image` → finishReason `NO_IMAGE` (§3.3, §8) with no
 * content; all at HTTP 200. A stream can fail after its 200 (`streamErrorNext`): a frame
 * `{"error":{code,message,status}}` (§3.1), then the end.
 *
 * Veo: both image shapes are accepted (`{bytesBase64Encoded, mimeType}` as the SDK sends, and the
 * REST doc's `{inlineData:{mimeType,data}}`), `durationSeconds` as a number or a string, and
 * `referenceType` in any case (§4 DISAGREE 1, 2, 4). Enforced: models and their durations (Veo 3 and
 * 3.1: 4, 6, 8; Veo 2: 5–8), 8 s with 1080p/4k, a last frame or reference images, `lastFrame` and
 * `referenceImages` (≤3, not with `image`/`lastFrame`) on Veo 3.1 only, `4k` on Veo 3.1 only,
 * ratios 16:9 and 9:16, and the Vertex-only parameters (`generateAudio`, `seed`, `fps`, …) refused.
 * Operations answer `done: false` for `pollsUntilDone` polls (default 1), then by prompt: `veo-filter`
 * → done with `raiMediaFilteredCount: 1` and a reason, no samples; `veo-fail` → done with
 * `error {code: 13 (gRPC INTERNAL), message}`; else `generateVideoResponse.generatedSamples[0].video.uri`
 * (`samplesKey: 'generatedVideos'` mimics relays that answer with the SDK's name).
 *
 * Faults per route through `faults.push(route, fault)`: `generate`, `submit`, `poll`, `download`,
 * `storage` (checked after auth). Counters: `inFlight`, `maxInFlight` of image calls; logs `calls`
 * (image calls) and `operations` (Veo).
 *
 * Decisions the reference leaves open are marked `ASSUMPTION:`.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import sharp from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type GeminiRoute = 'generate' | 'submit' | 'poll' | 'download' | 'storage';

export interface GoogleStatusBody {
  code: number;
  message: string;
  status: string;
  details?: Record<string, unknown>[];
}

export type ImageOutcome = 'ok' | 'block-prompt' | 'block-image' | 'text-only' | 'no-image';
/** How SSE frames end (§3.1: `\n\n`; the SDK also splits on `\r\n\r\n`); `alternate` switches per stream. */
export type SseFraming = 'lf' | 'crlf' | 'alternate';
export type VeoOutcome = 'ok' | 'filtered' | 'error' | 'precondition';

export interface GeminiImageCall {
  model: string;
  apiKey: string;
  stream: boolean;
  prompt: string;
  /** Input images in order, decoded. */
  images: { mimeType: string; width: number; height: number; bytes: number }[];
  imageConfig: Record<string, unknown>;
  responseModalities?: unknown;
  /** The pixel size of the final image, when one was returned. */
  size?: string;
  outcome?: ImageOutcome;
  /** Streams: how the frames ended, and whether an error frame broke the stream off. */
  framing?: 'lf' | 'crlf';
  streamError?: GoogleStatusBody;
  status: number;
  startedAt: number;
  finishedAt?: number;
  request: RecordedRequest;
}

export interface VeoImage {
  /** Which wire shape carried it. */
  shape: 'bytesBase64Encoded' | 'inlineData';
  mimeType: string;
  width: number;
  height: number;
}

export interface VeoOperation {
  name: string;
  model: string;
  apiKey: string;
  prompt: string;
  instance: Record<string, unknown>;
  parameters: Record<string, unknown>;
  image?: VeoImage;
  lastFrame?: VeoImage;
  referenceImages: (VeoImage & { referenceType: string })[];
  durationSeconds: number;
  polls: number;
  outcome: VeoOutcome;
  fileId: string;
  downloads: number;
  storageDownloads: number;
  /** Whether a storage request carried the API key (it should not: the key is for Google only). */
  storageSawKey: boolean;
}

export interface GeminiFakeOptions {
  apiKeys?: string[];
  /** Path prefix (default `/v1beta`, the SDK's default API version). */
  basePath?: string;
  /** Interim `thought: true` images of gemini-3-pro-image models (default 2). */
  thoughtImages?: number;
  outcome?: (prompt: string) => ImageOutcome;
  veoOutcome?: (prompt: string) => VeoOutcome;
  /** `done: false` answers before an operation is done (default 1). */
  pollsUntilDone?: number;
  samplesKey?: 'generatedSamples' | 'generatedVideos';
  /** Keep each image call open this long (a slow upstream; mutable as `fake.holdMs`). */
  holdMs?: number;
  /** Size of the video bytes (default 48 KiB). */
  videoBytes?: number;
  /** Frame endings of streams (default `alternate`; mutable as `fake.sseFraming`). */
  sseFraming?: SseFraming;
  /** How an unknown key is refused (default 400 API_KEY_INVALID; mutable as `fake.unknownKeyStatus`). */
  unknownKeyStatus?: 400 | 401;
}

export interface GeminiFake extends FakeServer {
  storageUrl: string;
  calls: GeminiImageCall[];
  operations: Map<string, VeoOperation>;
  counts: Record<GeminiRoute, number>;
  inFlight: number;
  maxInFlight: number;
  holdMs: number;
  sseFraming: SseFraming;
  unknownKeyStatus: 400 | 401;
  /** A known key answered with 401 UNAUTHENTICATED or 403 PERMISSION_DENIED from now on; `undefined` accepts it again. */
  refuseKey(key: string, status: 401 | 403 | undefined): void;
  /** The next streamed image answer sends `afterFrames` frames, then an `error` frame (default 500 INTERNAL), and ends. */
  streamErrorNext(afterFrames?: number, error?: GoogleStatusBody): void;
  /** The next `times` requests of `route` get 429 RESOURCE_EXHAUSTED with RetryInfo (no Retry-After). */
  rateLimitNext(route: GeminiRoute, retryDelaySeconds: number, opts?: { perDay?: boolean; times?: number }): void;
  /** The next `times` requests of `route` get `status` (default 503 UNAVAILABLE, no RetryInfo). */
  serverErrorNext(route: GeminiRoute, status?: 500 | 503 | 504, times?: number): void;
}

// ---------------------------------------------------------------------------------------------
// Models and tables (§3.1, §3.4, §4.1)

const RATIOS = ['1:1', '2:3', '3:2', '3:4', '4:3', '4:5', '5:4', '9:16', '16:9', '21:9'];
const FLASH_25: Record<string, string> = {
  '1:1': '1024x1024', '2:3': '832x1248', '3:2': '1248x832', '3:4': '864x1184', '4:3': '1184x864',
  '4:5': '896x1152', '5:4': '1152x896', '9:16': '768x1344', '16:9': '1344x768', '21:9': '1536x672',
};
const PRO_3_1K: Record<string, string> = {
  '1:1': '1024x1024', '2:3': '848x1264', '3:2': '1264x848', '3:4': '896x1200', '4:3': '1200x896',
  '4:5': '928x1152', '5:4': '1152x928', '9:16': '768x1376', '16:9': '1376x768', '21:9': '1584x672',
  // gemini-3.1-flash-image-preview only [3P-LIVE]:
  '1:4': '512x2064', '4:1': '2064x512', '1:8': '352x2928', '8:1': '2928x352',
};
/**
 * 2K and 4K are 2x and 4x the 1K grid (the official 3 Pro table and the 3.1 Flash live figures).
 * ASSUMPTION: 3.1 Flash's `512` (§3.1, no pixels in §3.4) is the 1K grid halved (16:9 = 688x384).
 */
const SCALE: Record<string, number> = { '512': 0.5, '1K': 1, '2K': 2, '4K': 4 };
const IMAGE_SIZES = ['512', '1K', '2K', '4K'];

interface ImageModel {
  ratios: string[];
  /** `imageSize` values the model takes; empty: it refuses the field (2.5 Flash, §3.2). */
  sizes: string[];
  /** Output tokens per image by size ([DOC] §3.4; 3.1 Flash: Vertex model page, 747/1120/1680/2520). */
  tokens: Record<string, number>;
  maxInputImages: number;
  thinking: boolean;
  sizeOf(ratio: string, imageSize: string): string;
}

const scaled = (ratio: string, imageSize: string) => {
  const [w, h] = PRO_3_1K[ratio]!.split('x').map(Number) as [number, number];
  return `${w * SCALE[imageSize]!}x${h * SCALE[imageSize]!}`;
};

const FLASH_25_MODEL: ImageModel = { ratios: RATIOS, sizes: [], tokens: { '1K': 1290 }, maxInputImages: 3, thinking: false, sizeOf: (r) => FLASH_25[r]! };
const PRO_3_MODEL: ImageModel = { ratios: RATIOS, sizes: ['1K', '2K', '4K'], tokens: { '1K': 1120, '2K': 1120, '4K': 2000 }, maxInputImages: 14, thinking: true, sizeOf: scaled };
// ASSUMPTION: 3.1 Flash takes the same 14 input images as 3 Pro and does not think aloud.
const FLASH_31_MODEL: ImageModel = {
  ratios: [...RATIOS, '1:4', '4:1', '1:8', '8:1'],
  sizes: IMAGE_SIZES,
  tokens: { '512': 747, '1K': 1120, '2K': 1680, '4K': 2520 },
  maxInputImages: 14,
  thinking: false,
  sizeOf: scaled,
};

const IMAGE_MODELS: Record<string, ImageModel> = {
  'gemini-2.5-flash-image': FLASH_25_MODEL,
  'gemini-2.5-flash-image-preview': FLASH_25_MODEL,
  'gemini-3-pro-image-preview': PRO_3_MODEL,
  'gemini-3-pro-image': PRO_3_MODEL,
  'gemini-3.1-flash-image-preview': FLASH_31_MODEL,
};

interface VeoModel {
  durations: number[];
  resolutions: string[];
  /** lastFrame and referenceImages (Veo 3.1). */
  v31: boolean;
}
const VEO_3: VeoModel = { durations: [4, 6, 8], resolutions: ['720p', '1080p'], v31: false };
const VEO_31: VeoModel = { durations: [4, 6, 8], resolutions: ['720p', '1080p', '4k'], v31: true };
const VEO_2: VeoModel = { durations: [5, 6, 7, 8], resolutions: ['720p'], v31: false };
const VEO_MODELS: Record<string, VeoModel> = {
  'veo-3.1-generate-preview': VEO_31,
  'veo-3.1-fast-generate-preview': VEO_31,
  'veo-3.0-generate-001': VEO_3,
  'veo-3.0-fast-generate-001': VEO_3,
  'veo-3.0-generate-preview': VEO_3,
  'veo-2.0-generate-001': VEO_2,
};
/** Parameters the Gemini API refuses (Vertex only, §4 DISAGREE 3). */
const VERTEX_ONLY_VIDEO = ['generateAudio', 'seed', 'fps', 'outputGcsUri', 'storageUri', 'pubsubTopic', 'mask', 'compressionQuality', 'labels', 'resizeMode'];
const KNOWN_VIDEO_PARAMS = new Set(['aspectRatio', 'resolution', 'durationSeconds', 'negativePrompt', 'personGeneration', 'sampleCount', 'enhancePrompt']);
/** imageConfig fields of Vertex only (§3.2: the SDK throws for them on the Gemini API). */
const VERTEX_ONLY_IMAGE = ['personGeneration', 'outputMimeType', 'outputCompressionQuality', 'imageOutputOptions', 'prominentPeople'];

// ---------------------------------------------------------------------------------------------
// Errors (§3.6)

class GoogleError extends Error {
  constructor(readonly body: GoogleStatusBody) {
    super(body.message);
  }
}

const STATUS_NAMES: Record<number, string> = { 400: 'INVALID_ARGUMENT', 401: 'UNAUTHENTICATED', 403: 'PERMISSION_DENIED', 404: 'NOT_FOUND', 429: 'RESOURCE_EXHAUSTED', 500: 'INTERNAL', 503: 'UNAVAILABLE', 504: 'DEADLINE_EXCEEDED' };

const googleStatus = (code: number, message: string, details?: Record<string, unknown>[]): GoogleStatusBody => ({ code, message, status: STATUS_NAMES[code] ?? 'UNKNOWN', ...(details && { details }) });
const invalid = (message: string) => new GoogleError(googleStatus(400, message));
const badRequestField = (field: string, message: string) =>
  new GoogleError(googleStatus(400, message, [{ '@type': 'type.googleapis.com/google.rpc.BadRequest', fieldViolations: [{ field, description: message }] }]));

/** The proto JSON parser's answer to an unknown field. */
const unknownName = (name: string, at: string) => invalid(`Invalid JSON payload received. Unknown name "${name}" at '${at}': Cannot find field.`);

const KEY_INVALID = googleStatus(400, 'API key not valid. Please pass a valid API key.', [
  { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'API_KEY_INVALID', domain: 'googleapis.com', metadata: { service: 'generativelanguage.googleapis.com' } },
]);
/** §3.6's 401. ASSUMPTION: the text and reason (Google's answer to credentials it does not take). */
const KEY_UNAUTHENTICATED = googleStatus(401, 'Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.', [
  { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'CREDENTIALS_MISSING', domain: 'googleapis.com', metadata: { service: 'generativelanguage.googleapis.com' } },
]);
/** §3.6's 403 for a key that lost access. ASSUMPTION: the text and reason; like Google's, it quotes the key. */
const keyDenied = (key: string) =>
  googleStatus(403, `Permission denied: Consumer 'api_key:${key}' has been suspended.`, [
    { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'CONSUMER_SUSPENDED', domain: 'googleapis.com', metadata: { consumer: `projects/${key.length}`, service: 'generativelanguage.googleapis.com' } },
  ]);
// ASSUMPTION: the text of the no-key answer (Google's usual wording for keyless calls).
const KEY_MISSING = googleStatus(403, 'Method doesn\'t allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.');

function rateLimitBody(retryDelaySeconds: number, perDay: boolean): GoogleStatusBody {
  const quotaId = perDay ? 'GenerateRequestsPerDayPerProjectPerModel-FreeTier' : 'GenerateRequestsPerMinutePerProjectPerModel-FreeTier';
  return googleStatus(429, `You exceeded your current quota, please check your plan and billing details. Please retry in ${retryDelaySeconds}s.`, [
    { '@type': 'type.googleapis.com/google.rpc.QuotaFailure', violations: [{ quotaMetric: `generativelanguage.googleapis.com/generate_requests_per_model${perDay ? '_per_day' : ''}`, quotaId }] },
    { '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: `${retryDelaySeconds}s` },
  ]);
}

const SERVER_ERRORS: Record<number, string> = {
  500: 'An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting',
  503: 'The model is overloaded. Please try again later.',
  504: 'The request timed out. Please try again.',
};

// ---------------------------------------------------------------------------------------------
// Helpers

/** A proto3 JSON field in camelCase or snake_case. */
function field(obj: Record<string, unknown> | undefined, camel: string): unknown {
  if (!obj) return undefined;
  if (obj[camel] !== undefined) return obj[camel];
  return obj[camel.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

async function decodeImage(b64: unknown, where: string): Promise<{ buffer: Buffer; width: number; height: number; format: string }> {
  if (typeof b64 !== 'string' || b64 === '') throw invalid(`${where}: image data is empty.`);
  if (!/^[A-Za-z0-9+/_-]*={0,2}$/.test(b64)) throw invalid(`Invalid value at '${where}' (TYPE_BYTES), Base64 decoding failed for "${b64.slice(0, 16)}…"`);
  const buffer = Buffer.from(b64, 'base64');
  try {
    const meta = await sharp(buffer).metadata();
    return { buffer, width: meta.width ?? 0, height: meta.height ?? 0, format: meta.format ?? '' };
  } catch {
    // ASSUMPTION: the wording for an undecodable image.
    throw invalid('Unable to process input image. Please retry or report in https://developers.generativeai.google/guide/troubleshooting');
  }
}

/** The image type of `data` by its magic bytes (what Google checks an inline part's data against). */
function magicType(data: Buffer): string | undefined {
  if (data.length >= 8 && data.readUInt32BE(0) === 0x89504e47 && data.readUInt32BE(4) === 0x0d0a1a0a) return 'image/png';
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return 'image/jpeg';
  if (data.length >= 12 && data.toString('latin1', 0, 4) === 'RIFF' && data.toString('latin1', 8, 12) === 'WEBP') return 'image/webp';
  if (data.length >= 6 && /^GIF8[79]a$/.test(data.toString('latin1', 0, 6))) return 'image/gif';
  if (data.length >= 12 && data.toString('latin1', 4, 8) === 'ftyp') {
    const brand = data.toString('latin1', 8, 12);
    if (['heic', 'heix', 'heim', 'heis'].includes(brand)) return 'image/heic';
    if (['mif1', 'msf1', 'heif'].includes(brand)) return 'image/heif';
  }
  return undefined;
}

const renderCache = new Map<string, Promise<Buffer>>();

/** A real PNG: a coloured background with a centred block; thought images are grey. */
function renderPng(width: number, height: number, seed: string, thought: boolean): Promise<Buffer> {
  const key = `${width}x${height}:${seed}:${thought}`;
  let png = renderCache.get(key);
  if (!png) {
    const h = createHash('sha256').update(seed).digest();
    const background = thought ? { r: 128, g: 128, b: 128 } : { r: h[0]!, g: h[1]!, b: h[2]! };
    const block = { width: Math.max(1, width >> 1), height: Math.max(1, height >> 1) };
    png = sharp({ create: { width, height, channels: 3, background } })
      .composite([{ input: { create: { ...block, channels: 3, background: { r: 255 - background.r, g: 255 - background.g, b: 255 - background.b } } }, gravity: 'centre' }])
      .png({ compressionLevel: 1 })
      .toBuffer();
    renderCache.set(key, png);
    if (renderCache.size > 64) renderCache.delete(renderCache.keys().next().value!);
  }
  return png;
}

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.writeUInt32BE(0x200, 12);
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 29) & 0xff;
  return out;
}

function nearestRatio(width: number, height: number, ratios: string[]): string {
  const target = Math.log(width / height);
  const distance = (r: string) => {
    const [w, h] = r.split(':').map(Number) as [number, number];
    return Math.abs(Math.log(w / h) - target);
  };
  return ratios.reduce((best, r) => (distance(r) < distance(best) ? r : best), '1:1');
}

function defaultImageOutcome(prompt: string): ImageOutcome {
  if (prompt.includes('no-image')) return 'no-image';
  if (prompt.includes('block-prompt')) return 'block-prompt';
  if (prompt.includes('block-image')) return 'block-image';
  if (prompt.includes('text-only')) return 'text-only';
  return 'ok';
}

function defaultVeoOutcome(prompt: string): VeoOutcome {
  if (prompt.includes('veo-filter')) return 'filtered';
  if (prompt.includes('veo-fail')) return 'error';
  if (prompt.includes('veo-precondition')) return 'precondition';
  return 'ok';
}

// ---------------------------------------------------------------------------------------------
// The fake

export async function startGeminiFake(options: GeminiFakeOptions = {}): Promise<GeminiFake> {
  const keys = new Set(options.apiKeys ?? ['gm-test']);
  const base = options.basePath ?? '/v1beta';
  const thoughtImages = options.thoughtImages ?? 2;
  const imageOutcome = options.outcome ?? defaultImageOutcome;
  const veoOutcome = options.veoOutcome ?? defaultVeoOutcome;
  const pollsUntilDone = options.pollsUntilDone ?? 1;
  const samplesKey = options.samplesKey ?? 'generatedSamples';
  const video = mp4Bytes(options.videoBytes ?? 48 * 1024);
  const calls: GeminiImageCall[] = [];
  const operations = new Map<string, VeoOperation>();
  const byFile = new Map<string, VeoOperation>();
  const counts: Record<GeminiRoute, number> = { generate: 0, submit: 0, poll: 0, download: 0, storage: 0 };

  // The storage host a download redirects to: another origin, which must never see the API key.
  const storage = await startFakeServer(async (req, res, recorded, self) => {
    counts.storage++;
    const m = /^\/veo\/([A-Za-z0-9_-]+)\.mp4$/.exec(recorded.path);
    const op = m ? byFile.get(m[1]!) : undefined;
    if (op) {
      op.storageDownloads++;
      if (req.headers['x-goog-api-key'] !== undefined || recorded.query.has('key')) op.storageSawKey = true;
    }
    if (await applyFault(res, self.faults.take('storage'))) return;
    if (!op || recorded.query.get('sig') !== op.fileId.split('').reverse().join('')) {
      res.writeHead(403, { 'content-type': 'application/xml' });
      res.end('<?xml version="1.0"?><Error><Code>AccessDenied</Code></Error>');
      return;
    }
    res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(video.length) });
    res.end(video);
  });

  const answerError = (res: ServerResponse, e: GoogleStatusBody, headers: Record<string, string> = {}) => sendJson(res, e.code, { error: e }, headers);

  const refused = new Map<string, 401 | 403>();
  const authenticate = (req: IncomingMessage, recorded: RecordedRequest): string | GoogleStatusBody => {
    const key = (req.headers['x-goog-api-key'] as string | undefined) ?? recorded.query.get('key') ?? undefined;
    if (key === undefined || key === '') return KEY_MISSING;
    if (!keys.has(key)) return fake.unknownKeyStatus === 401 ? KEY_UNAUTHENTICATED : KEY_INVALID;
    const refusal = refused.get(key);
    if (refusal === 401) return KEY_UNAUTHENTICATED;
    if (refusal === 403) return keyDenied(key);
    return key;
  };
  const streamErrors: { afterFrames: number; error: GoogleStatusBody }[] = [];
  let streams = 0;

  let fake!: GeminiFake;
  const server = await startFakeServer(async (req, res, recorded, self) => {
    const path = recorded.path;
    const route = routeOf(req.method ?? 'GET', path, base);
    if (!route) {
      // ASSUMPTION: Google's 404 body for an unknown path is HTML; a JSON NOT_FOUND keeps it simple.
      return answerError(res, googleStatus(404, `Method not found: ${req.method} ${path}`));
    }
    const key = authenticate(req, recorded);
    if (typeof key !== 'string') return answerError(res, key);
    counts[route.name]++;
    if (await applyFault(res, self.faults.take(route.name))) return;
    try {
      switch (route.name) {
        case 'generate':
          return await generate(res, recorded, key, route.model, route.stream);
        case 'submit':
          return await submit(res, recorded, key, route.model);
        case 'poll':
          return poll(res, route.model, route.id);
        case 'download':
          return download(res, route.id);
      }
    } catch (err) {
      if (err instanceof GoogleError) return answerError(res, err.body);
      throw err;
    }
  });

  async function generate(res: ServerResponse, recorded: RecordedRequest, apiKey: string, model: string, stream: boolean): Promise<void> {
    const spec = IMAGE_MODELS[model];
    if (!spec) throw new GoogleError(googleStatus(404, `models/${model} is not found for API version ${base.slice(1)}, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods.`));
    if (stream && recorded.query.get('alt') !== 'sse') {
      // ASSUMPTION: without alt=sse the stream is one JSON array; the SDK always asks for SSE.
      throw invalid('This fake serves streamGenerateContent with alt=sse only.');
    }
    const body = recorded.json;
    if (!isObject(body)) throw invalid('Invalid JSON payload received.');
    const contents = body.contents;
    if (!Array.isArray(contents) || contents.length === 0) throw invalid('* GenerateContentRequest.contents: contents is not specified\n');
    const texts: string[] = [];
    const inputs: { buffer: Buffer; width: number; height: number; format: string; mimeType: string }[] = [];
    for (const [ci, content] of contents.entries()) {
      const parts = isObject(content) ? content.parts : undefined;
      if (!Array.isArray(parts) || parts.length === 0) throw invalid(`* GenerateContentRequest.contents[${ci}].parts: contents.parts must not be empty.\n`);
      for (const [pi, part] of parts.entries()) {
        if (!isObject(part)) throw invalid(`Invalid value at 'contents[${ci}].parts[${pi}]'`);
        const inline = field(part, 'inlineData');
        if (typeof part.text === 'string') texts.push(part.text);
        else if (isObject(inline)) {
          const mimeType = field(inline, 'mimeType');
          if (typeof mimeType !== 'string' || !/^image\/(png|jpeg|webp|heic|heif)$/.test(mimeType)) throw invalid(`Unsupported MIME type: ${String(mimeType)}`);
          const decoded = await decodeImage(inline.data, `contents[${ci}].parts[${pi}].inline_data.data`);
          // The bytes must be what the part says (GIF bytes labelled image/png are refused: GIF is
          // not a type Gemini takes). ASSUMPTION: the text; HEIC and HEIF brands are not told apart.
          const actual = magicType(decoded.buffer);
          const heif = (t: string | undefined) => t === 'image/heic' || t === 'image/heif';
          if (actual !== mimeType && !(heif(actual) && heif(mimeType))) {
            throw invalid(`Unable to process input image: contents[${ci}].parts[${pi}].inline_data has mime type ${mimeType}, but its data is ${actual ?? 'not an image of a supported type'}.`);
          }
          inputs.push({ ...decoded, mimeType });
        } else throw invalid(`Invalid value at 'contents[${ci}].parts[${pi}]' (oneof data): no data set.`);
      }
    }
    const prompt = texts.join('\n');
    const generationConfig = field(body, 'generationConfig');
    const cfg = isObject(generationConfig) ? generationConfig : {};
    const imageConfigRaw = field(cfg, 'imageConfig');
    const imageConfig = isObject(imageConfigRaw) ? imageConfigRaw : {};
    for (const name of Object.keys(imageConfig)) {
      const camel = name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
      if (VERTEX_ONLY_IMAGE.includes(camel) || !['aspectRatio', 'imageSize'].includes(camel)) throw unknownName(name, 'generation_config.image_config');
    }
    const aspectRatio = field(imageConfig, 'aspectRatio');
    if (aspectRatio !== undefined && (typeof aspectRatio !== 'string' || !spec.ratios.includes(aspectRatio))) {
      throw badRequestField('generation_config.image_config.aspect_ratio', `Unsupported aspect ratio: ${String(aspectRatio)}. Supported values are ${spec.ratios.join(', ')}.`);
    }
    const imageSizeRaw = field(imageConfig, 'imageSize');
    if (imageSizeRaw !== undefined) {
      // §3.2: uppercase K required; lowercase rejected. 2.5 Flash takes no imageSize, not even 1K;
      // `512` is 3.1 Flash's (§3.1). ASSUMPTION: the texts.
      if (spec.sizes.length === 0) throw badRequestField('generation_config.image_config.image_size', `imageSize is not supported for ${model}.`);
      if (typeof imageSizeRaw !== 'string' || !IMAGE_SIZES.includes(imageSizeRaw)) {
        throw badRequestField('generation_config.image_config.image_size', `Invalid image size: ${String(imageSizeRaw)}. Supported values are ${IMAGE_SIZES.join(', ')}.`);
      }
      if (!spec.sizes.includes(imageSizeRaw)) throw badRequestField('generation_config.image_config.image_size', `Image size ${imageSizeRaw} is not supported for ${model}.`);
    }
    if (inputs.length > spec.maxInputImages) {
      // ASSUMPTION: the text; the limits are §3.2's.
      throw invalid(`Too many input images: ${inputs.length}. ${model} accepts at most ${spec.maxInputImages} images per request.`);
    }
    if (prompt.trim() === '' && inputs.length === 0) throw invalid('* GenerateContentRequest.contents[0].parts[0].data: required oneof field \'data\' must have one initialized field\n');

    const ratio = typeof aspectRatio === 'string' ? aspectRatio : inputs[0] ? nearestRatio(inputs[0].width, inputs[0].height, spec.ratios) : '1:1';
    const imageSize = typeof imageSizeRaw === 'string' ? imageSizeRaw : '1K';
    const call: GeminiImageCall = {
      model,
      apiKey,
      stream,
      prompt,
      images: inputs.map((i) => ({ mimeType: i.mimeType, width: i.width, height: i.height, bytes: i.buffer.length })),
      imageConfig,
      responseModalities: field(cfg, 'responseModalities'),
      status: 0,
      startedAt: Date.now(),
      request: recorded,
    };
    calls.push(call);
    fake.inFlight++;
    fake.maxInFlight = Math.max(fake.maxInFlight, fake.inFlight);
    try {
      if (fake.holdMs > 0) await new Promise((r) => setTimeout(r, fake.holdMs));
      const outcome = imageOutcome(prompt);
      call.outcome = outcome;
      const [w, h] = spec.sizeOf(ratio, imageSize).split('x').map(Number) as [number, number];
      const usage = (candidates: number) => ({
        promptTokenCount: 12 + inputs.length * 560,
        candidatesTokenCount: candidates,
        totalTokenCount: 12 + inputs.length * 560 + candidates,
        thoughtsTokenCount: spec.thinking ? 256 : 0,
        promptTokensDetails: [{ modality: 'TEXT', tokenCount: 12 }, ...(inputs.length ? [{ modality: 'IMAGE', tokenCount: inputs.length * 560 }] : [])],
        candidatesTokensDetails: [{ modality: 'IMAGE', tokenCount: candidates }],
      });
      const frames: Record<string, unknown>[] = [];
      const responseId = randomBytes(12).toString('base64url');
      const envelope = (extra: Record<string, unknown>) => ({ ...extra, modelVersion: model, responseId });
      if (outcome === 'block-prompt') {
        frames.push(envelope({ promptFeedback: { blockReason: 'SAFETY' }, usageMetadata: usage(0) }));
      } else if (outcome === 'block-image') {
        frames.push(envelope({ candidates: [{ content: { role: 'model', parts: [] }, finishReason: 'IMAGE_SAFETY', index: 0 }], usageMetadata: usage(0) }));
      } else if (outcome === 'no-image') {
        // ASSUMPTION: like the other finish-time outcomes, the candidate carries no content.
        frames.push(envelope({ candidates: [{ finishReason: 'NO_IMAGE', index: 0 }], usageMetadata: usage(0) }));
      } else if (outcome === 'text-only') {
        frames.push(envelope({ candidates: [{ content: { role: 'model', parts: [{ text: 'I can describe that scene, but I will not draw it.' }] }, finishReason: 'STOP', index: 0 }], usageMetadata: usage(24) }));
      } else {
        const parts: Record<string, unknown>[] = [{ text: 'Here is your image.' }];
        for (let t = 0; spec.thinking && t < thoughtImages; t++) {
          const thought = await renderPng(Math.max(1, w >> 2), Math.max(1, h >> 2), `${prompt}:${t}`, true);
          parts.push({ inlineData: { mimeType: 'image/png', data: thought.toString('base64') }, thought: true });
        }
        const final = await renderPng(w, h, prompt, false);
        parts.push({ inlineData: { mimeType: 'image/png', data: final.toString('base64') }, thoughtSignature: randomBytes(24).toString('base64') });
        call.size = `${w}x${h}`;
        const tokens = spec.tokens[imageSize] ?? 1290;
        if (stream) {
          // Each part in its own frame; the last carries finishReason and usage.
          for (const [i, part] of parts.entries()) {
            const last = i === parts.length - 1;
            frames.push(envelope({ candidates: [{ content: { role: 'model', parts: [part] }, index: 0, ...(last && { finishReason: 'STOP' }) }], ...(last && { usageMetadata: usage(tokens) }) }));
          }
        } else {
          frames.push(envelope({ candidates: [{ content: { role: 'model', parts }, finishReason: 'STOP', index: 0 }], usageMetadata: usage(tokens) }));
        }
      }
      call.status = 200;
      if (!stream) return sendJson(res, 200, frames[0]);
      const framing = fake.sseFraming === 'alternate' ? (streams++ % 2 === 0 ? 'lf' : 'crlf') : fake.sseFraming;
      const eol = framing === 'lf' ? '\n' : '\r\n';
      call.framing = framing;
      const broken = streamErrors.shift();
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      for (const [i, frame] of frames.entries()) {
        if (broken && i === broken.afterFrames) break;
        res.write(`data: ${JSON.stringify(frame)}${eol}${eol}`);
      }
      if (broken) {
        // §3.1: a chunk that is a JSON object with `error` (the SDK raises it as an API error).
        call.streamError = broken.error;
        res.write(`data: ${JSON.stringify({ error: broken.error })}${eol}${eol}`);
      }
      res.end();
    } finally {
      fake.inFlight--;
      call.finishedAt = Date.now();
    }
  }

  async function veoImage(v: unknown, where: string): Promise<VeoImage> {
    if (!isObject(v)) throw invalid(`Invalid value at '${where}': an image is an object.`);
    const inline = field(v, 'inlineData');
    const shape = isObject(inline) ? 'inlineData' : 'bytesBase64Encoded';
    const data = isObject(inline) ? inline.data : field(v, 'bytesBase64Encoded');
    const mimeType = isObject(inline) ? field(inline, 'mimeType') : field(v, 'mimeType');
    if (typeof mimeType !== 'string' || !/^image\/(png|jpeg|webp)$/.test(mimeType)) throw invalid(`${where}: unsupported mimeType ${String(mimeType)}.`);
    const decoded = await decodeImage(data, `${where}.bytesBase64Encoded`);
    return { shape, mimeType, width: decoded.width, height: decoded.height };
  }

  async function submit(res: ServerResponse, recorded: RecordedRequest, apiKey: string, model: string): Promise<void> {
    const spec = VEO_MODELS[model];
    if (!spec) throw new GoogleError(googleStatus(404, `models/${model} is not found for API version ${base.slice(1)}, or is not supported for predictLongRunning.`));
    const body = recorded.json;
    if (!isObject(body) || !Array.isArray(body.instances) || body.instances.length !== 1 || !isObject(body.instances[0])) {
      throw invalid('Invalid JSON payload: exactly one instance is required.');
    }
    const instance = body.instances[0];
    const parameters = isObject(body.parameters) ? body.parameters : {};
    for (const name of Object.keys(parameters)) {
      // ASSUMPTION: the text; §4 DISAGREE 3 says the Gemini API rejects these (the SDK refuses them first).
      if (VERTEX_ONLY_VIDEO.includes(name)) throw invalid(`\`${name}\` isn't supported by this model. Please remove it or refer to the Gemini API documentation for supported usage.`);
      if (!KNOWN_VIDEO_PARAMS.has(name)) throw invalid(`Invalid JSON payload received. Unknown name "${name}" at 'parameters'.`);
    }
    const prompt = typeof instance.prompt === 'string' ? instance.prompt : '';
    const image = instance.image === undefined ? undefined : await veoImage(instance.image, 'instances[0].image');
    const lastFrame = field(instance, 'lastFrame') === undefined ? undefined : await veoImage(field(instance, 'lastFrame'), 'instances[0].lastFrame');
    const refsRaw = field(instance, 'referenceImages');
    const referenceImages: VeoOperation['referenceImages'] = [];
    if (refsRaw !== undefined) {
      if (!Array.isArray(refsRaw)) throw invalid('instances[0].referenceImages must be a list.');
      for (const [i, ref] of refsRaw.entries()) {
        if (!isObject(ref)) throw invalid(`instances[0].referenceImages[${i}] must be an object.`);
        const type = field(ref, 'referenceType');
        // §4 DISAGREE 4: ASSET/STYLE in the SDK, lowercase in some docs: accept either case.
        const upper = typeof type === 'string' ? type.toUpperCase() : '';
        if (upper !== 'ASSET' && upper !== 'STYLE') throw invalid(`instances[0].referenceImages[${i}].referenceType must be ASSET or STYLE.`);
        referenceImages.push({ ...(await veoImage(ref.image, `instances[0].referenceImages[${i}].image`)), referenceType: upper });
      }
    }
    if (!prompt && !image) throw invalid('A prompt or an image is required.');
    if (lastFrame && !image) throw invalid('lastFrame requires image (the first frame).');
    if ((lastFrame || referenceImages.length) && !spec.v31) throw invalid(`${lastFrame ? 'lastFrame' : 'referenceImages'} isn't supported by this model.`);
    if (referenceImages.length > 3) throw invalid('At most 3 reference images are supported.');
    if (referenceImages.length && (image || lastFrame || instance.video !== undefined)) throw invalid('referenceImages cannot be combined with image, lastFrame or video.');
    if (referenceImages.length && !prompt) throw invalid('A prompt is required with referenceImages.');

    const aspectRatio = parameters.aspectRatio ?? '16:9';
    if (aspectRatio !== '16:9' && aspectRatio !== '9:16') throw invalid(`Unsupported aspect ratio: ${String(aspectRatio)}. Supported values are 16:9 and 9:16.`);
    const resolution = parameters.resolution ?? '720p';
    if (typeof resolution !== 'string' || !spec.resolutions.includes(resolution)) throw invalid(`Unsupported resolution: ${String(resolution)}. Supported values are ${spec.resolutions.join(', ')}.`);
    // §4 DISAGREE 2: a number (SDK) or a string (doc table).
    const rawDuration = parameters.durationSeconds ?? 8;
    const durationSeconds = typeof rawDuration === 'string' && /^\d+$/.test(rawDuration) ? Number(rawDuration) : rawDuration;
    if (typeof durationSeconds !== 'number' || !spec.durations.includes(durationSeconds)) {
      throw invalid(`Unsupported duration: ${String(rawDuration)}. Supported values are ${spec.durations.join(', ')} seconds.`);
    }
    const needs8 = resolution !== '720p' ? `resolution ${resolution}` : lastFrame ? 'lastFrame' : referenceImages.length ? 'referenceImages' : instance.video !== undefined ? 'video extension' : undefined;
    if (needs8 && durationSeconds !== 8) throw invalid(`durationSeconds must be 8 with ${needs8}.`);
    const person = parameters.personGeneration;
    if (person !== undefined) {
      const allowed = image || referenceImages.length ? 'allow_adult' : 'allow_all';
      if (person !== allowed) throw invalid(`personGeneration ${String(person)} is not supported for this request; use ${allowed}.`);
    }

    const id = randomBytes(9).toString('hex');
    const name = `models/${model}/operations/${id}`;
    const op: VeoOperation = {
      name,
      model,
      apiKey,
      prompt,
      instance,
      parameters,
      image,
      lastFrame,
      referenceImages,
      durationSeconds,
      polls: 0,
      outcome: veoOutcome(prompt),
      fileId: randomBytes(8).toString('hex'),
      downloads: 0,
      storageDownloads: 0,
      storageSawKey: false,
    };
    operations.set(name, op);
    byFile.set(op.fileId, op);
    sendJson(res, 200, { name });
  }

  function poll(res: ServerResponse, model: string, id: string): void {
    const op = operations.get(`models/${model}/operations/${id}`);
    if (!op) return sendJson(res, 404, { error: googleStatus(404, `Operation models/${model}/operations/${id} not found.`) });
    op.polls++;
    if (op.polls <= pollsUntilDone) return sendJson(res, 200, { name: op.name, done: false });
    if (op.outcome === 'error') {
      // The operation's error is a google.rpc.Status with a gRPC code (13 INTERNAL), not an HTTP one.
      return sendJson(res, 200, { name: op.name, done: true, error: { code: 13, message: 'Video generation failed due to an internal error. Please try again.' } });
    }
    if (op.outcome === 'precondition') {
      // gRPC 9 FAILED_PRECONDITION: the project's state (billing, region, an allowlisted model), not the request.
      return sendJson(res, 200, { name: op.name, done: true, error: { code: 9, message: 'Precondition check failed.' } });
    }
    const type = 'type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse';
    if (op.outcome === 'filtered') {
      return sendJson(res, 200, {
        name: op.name,
        done: true,
        response: { '@type': type, generateVideoResponse: { raiMediaFilteredCount: 1, raiMediaFilteredReasons: ["We encountered an issue with the audio for your prompt. You have not been charged. Please try a different prompt."] } },
      });
    }
    const uri = `${fake.url}${base}/files/${op.fileId}:download?alt=media`;
    sendJson(res, 200, { name: op.name, done: true, response: { '@type': type, generateVideoResponse: { [samplesKey]: [{ video: { uri } }] } } });
  }

  function download(res: ServerResponse, fileId: string): void {
    const op = byFile.get(fileId);
    if (!op) return sendJson(res, 404, { error: googleStatus(404, `File ${fileId} not found.`) });
    op.downloads++;
    const location = `${storage.url}/veo/${fileId}.mp4?sig=${fileId.split('').reverse().join('')}`;
    res.writeHead(302, { location, 'content-length': '0' });
    res.end();
  }

  fake = Object.assign(server, {
    storageUrl: storage.url,
    calls,
    operations,
    counts,
    inFlight: 0,
    maxInFlight: 0,
    holdMs: options.holdMs ?? 0,
    sseFraming: options.sseFraming ?? 'alternate',
    unknownKeyStatus: options.unknownKeyStatus ?? 400,
    refuseKey(key: string, status: 401 | 403 | undefined) {
      if (status === undefined) refused.delete(key);
      else refused.set(key, status);
    },
    streamErrorNext(afterFrames = 1, error: GoogleStatusBody = googleStatus(500, SERVER_ERRORS[500]!)) {
      streamErrors.push({ afterFrames, error });
    },
    rateLimitNext(route: GeminiRoute, retryDelaySeconds: number, opts: { perDay?: boolean; times?: number } = {}) {
      const fault: Fault = { status: 429, body: { error: rateLimitBody(retryDelaySeconds, opts.perDay ?? false) } };
      server.faults.push(route, fault, opts.times ?? 1);
    },
    serverErrorNext(route: GeminiRoute, status: 500 | 503 | 504 = 503, times = 1) {
      server.faults.push(route, { status, body: { error: googleStatus(status, SERVER_ERRORS[status]!) } }, times);
    },
  });
  const closeMain = server.close;
  fake.close = async () => {
    await Promise.all([closeMain(), storage.close()]);
  };
  return fake;
}

type Route =
  | { name: 'generate'; model: string; stream: boolean }
  | { name: 'submit'; model: string }
  | { name: 'poll'; model: string; id: string }
  | { name: 'download'; id: string };

function routeOf(method: string, path: string, base: string): Route | undefined {
  if (!path.startsWith(`${base}/`)) return undefined;
  const rest = decodeURIComponent(path.slice(base.length + 1));
  let m: RegExpExecArray | null;
  if (method === 'POST' && (m = /^models\/([^/:]+):(generateContent|streamGenerateContent)$/.exec(rest))) {
    return { name: 'generate', model: m[1]!, stream: m[2] === 'streamGenerateContent' };
  }
  if (method === 'POST' && (m = /^models\/([^/:]+):predictLongRunning$/.exec(rest))) return { name: 'submit', model: m[1]! };
  if (method === 'GET' && (m = /^models\/([^/:]+)\/operations\/([A-Za-z0-9_-]+)$/.exec(rest))) return { name: 'poll', model: m[1]!, id: m[2]! };
  if (method === 'GET' && (m = /^files\/([A-Za-z0-9_-]+):download$/.exec(rest))) return { name: 'download', id: m[1]! };
  return undefined;
}
