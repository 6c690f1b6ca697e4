/**
 * The rules of POST /v1/videos/generations (product spec §4.6) that a schema cannot express:
 * alias pairs that must agree, model/duration/ratio/resolution checked independently against the
 * catalog (never parsed from the model id), audio, frames and reference images, media limits.
 * Pure: the caller passes the model's capabilities.
 */
import type { components } from '../../../generated/api.d.ts';
import { durationConstraintsFor, type VideoCapabilities } from '../../catalog/capabilities.ts';
import { ApiError, badRequest, tooLarge } from '../../errors.ts';
import { createHash, type Hash } from 'node:crypto';
import { OutboundUrlError, parseOutboundUrl } from '../../lib/outbound-url.ts';

type VideoCreateRequest = components['schemas']['VideoCreateRequest'];

export type InputMode = 'text' | 'first_frame' | 'first_and_last_frame' | 'reference_images';

export type MediaRole = 'first_frame' | 'last_frame' | 'reference_image';

export interface NormalizedVideoRequest {
  clientRequestId: string;
  prompt: string;
  negativePrompt: string | undefined;
  model: string;
  durationSeconds: number;
  aspectRatio: string;
  resolution: string;
  /** As given; undefined means the model default. */
  generateAudio: boolean | undefined;
  quoteToken: string | undefined;
  firstFrame: string | undefined;
  lastFrame: string | undefined;
  referenceImages: string[];
  referenceVideos: string[];
  referenceAudios: string[];
  callbackUrl: string | undefined;
}

/** The value of an alias pair (or triple); all given values must be equal. */
function agree<T>(body: Record<string, unknown>, names: string[], normalize: (v: unknown) => T = (v) => v as T): T | undefined {
  let found: { name: string; value: T; raw: string } | undefined;
  for (const name of names) {
    if (body[name] === undefined) continue;
    const value = normalize(body[name]);
    const raw = JSON.stringify(value);
    if (found && found.raw !== raw) {
      throw badRequest('alias_conflict', `'${found.name}' and '${name}' are the same field and must agree (got ${found.raw} and ${raw}).`, name);
    }
    found ??= { name, value, raw };
  }
  return found?.value;
}

function durationOf(v: unknown): number {
  // `seconds` may be a decimal integer string; the schema already checked its shape.
  return typeof v === 'string' ? Number.parseInt(v, 10) : (v as number);
}

/** Alias resolution only; capability checks are in `checkAgainstModel`. */
export function normalizeVideoRequest(body: VideoCreateRequest): NormalizedVideoRequest {
  const b = body as Record<string, unknown>;
  const required = <T>(value: T | undefined, name: string): T => {
    if (value === undefined) throw badRequest('invalid_request', `'${name}' is required.`, name);
    return value;
  };
  return {
    clientRequestId: required(agree<string>(b, ['client_request_id', 'clientRequestIdRequired']), 'client_request_id'),
    prompt: body.prompt,
    negativePrompt: agree<string>(b, ['negative_prompt', 'negativePrompt']),
    model: body.model,
    durationSeconds: required(agree<number>(b, ['seconds', 'duration', 'duration_seconds'], durationOf), 'seconds'),
    aspectRatio: required(agree<string>(b, ['aspectRatio', 'aspect_ratio']), 'aspectRatio'),
    resolution: body.resolution,
    generateAudio: agree<boolean>(b, ['generate_audio', 'generateAudio']),
    quoteToken: agree<string>(b, ['quote_token', 'quoteToken']),
    firstFrame: agree<string>(b, ['firstFrame', 'first_frame']),
    lastFrame: agree<string>(b, ['lastFrame', 'last_frame']),
    referenceImages: agree<string[]>(b, ['referenceImages', 'reference_images']) ?? [],
    referenceVideos: (b.reference_videos as string[] | undefined) ?? [],
    referenceAudios: (b.reference_audios as string[] | undefined) ?? [],
    callbackUrl: agree<string>(b, ['callback_url', 'callbackUrl']),
  };
}

/** One duration, ratio or resolution segment: `8s`, `10sec`, `720p`, `4k`, `1280x720`, `16:9`, `hd`. */
const PARAMETER_SEGMENT = /^(\d+(s|sec|secs|second|seconds)|\d+[pk]|\d+x\d+|\d+:\d+|hd|fhd|uhd|sd)$/i;

/**
 * True when `id` is a known model id followed by duration/ratio/resolution segments, such as
 * `local-video-1-8s-720p`, `local-video-1_16:9` or `local-video-1:720p`: a composite id that is
 * rejected, never parsed. (A bare number is no segment: it may be part of a model's own name.)
 */
export function isCompositeModelId(id: string, knownIds: readonly string[]): boolean {
  return knownIds.some((known) => {
    if (!id.startsWith(known) || !/^[-_/@.:\s]/.test(id.slice(known.length))) return false;
    const segments = id.slice(known.length + 1).split(/[-_/@.\s]/);
    return segments.every((segment) => PARAMETER_SEGMENT.test(segment));
  });
}

export interface ModelCheckResult {
  generateAudio: boolean;
  inputMode: InputMode;
  inputCount: number;
}

/** The request against the model's capabilities, in the order a client would fix them. */
export function checkAgainstModel(req: NormalizedVideoRequest, caps: VideoCapabilities): ModelCheckResult {
  if (!caps.durations.includes(req.durationSeconds)) {
    throw badRequest('unsupported_duration', `Model '${req.model}' does not support a duration of ${req.durationSeconds} s; allowed: ${caps.durations.join(', ')}.`, 'seconds');
  }
  if (!caps.aspectRatios.includes(req.aspectRatio)) {
    throw badRequest('unsupported_aspect_ratio', `Model '${req.model}' does not support aspect ratio '${req.aspectRatio}'; allowed: ${caps.aspectRatios.join(', ')}.`, 'aspectRatio');
  }
  if (!caps.resolutions.includes(req.resolution)) {
    throw badRequest('unsupported_resolution', `Model '${req.model}' does not support resolution '${req.resolution}'; allowed: ${caps.resolutions.join(', ')}.`, 'resolution');
  }
  if (req.generateAudio === true && !caps.audio.supported) {
    throw badRequest('audio_not_supported', `Model '${req.model}' cannot generate audio; omit generate_audio or send false.`, 'generate_audio');
  }
  if (req.generateAudio === false && caps.audio.alwaysOn) {
    throw badRequest('audio_always_on', `Model '${req.model}' always generates audio; omit generate_audio or send true.`, 'generate_audio');
  }
  for (const { rule, durations } of durationConstraintsFor(caps, { resolution: req.resolution, hasLastFrame: req.lastFrame !== undefined, referenceImages: req.referenceImages.length })) {
    if (!durations.includes(req.durationSeconds)) {
      throw badRequest('unsupported_duration', `Model '${req.model}' allows only ${durations.join(', ')} s with ${rule}; got ${req.durationSeconds} s.`, 'seconds');
    }
  }
  const hasFrames = req.firstFrame !== undefined || req.lastFrame !== undefined;
  if (req.lastFrame !== undefined && req.firstFrame === undefined) {
    throw badRequest('last_frame_requires_first_frame', 'lastFrame requires firstFrame.', 'lastFrame');
  }
  if (hasFrames && req.referenceImages.length > 0) {
    throw badRequest('frames_with_reference_images', 'Frame inputs and reference images cannot be sent together.', 'referenceImages');
  }
  if (hasFrames && caps.frames === 'none') {
    throw badRequest('frames_not_supported', `Model '${req.model}' does not accept frame inputs.`, 'firstFrame');
  }
  if (req.lastFrame !== undefined && caps.frames === 'first-only') {
    throw badRequest('last_frame_not_supported', `Model '${req.model}' accepts a first frame only.`, 'lastFrame');
  }
  if (req.referenceImages.length > caps.referenceImages.maxCount) {
    throw badRequest(
      'too_many_reference_images',
      `Model '${req.model}' accepts at most ${caps.referenceImages.maxCount} reference images; got ${req.referenceImages.length}.`,
      'referenceImages',
    );
  }
  const inputMode: InputMode =
    req.lastFrame !== undefined ? 'first_and_last_frame' : req.firstFrame !== undefined ? 'first_frame' : req.referenceImages.length > 0 ? 'reference_images' : 'text';
  const inputCount = (req.firstFrame ? 1 : 0) + (req.lastFrame ? 1 : 0) + req.referenceImages.length;
  return { generateAudio: req.generateAudio ?? caps.audio.defaultEnabled, inputMode, inputCount };
}

/** The frame and reference-image fields of a creation request, aliases included. */
const MEDIA_FIELDS = ['firstFrame', 'first_frame', 'lastFrame', 'last_frame'] as const;
const MEDIA_ARRAY_FIELDS = ['referenceImages', 'reference_images'] as const;

/**
 * The body with every frame and reference image replaced by its identity (`identity`: a staged
 * data URL's content hash; file ids and URLs stay), so that aliases carrying the same image agree
 * and an identical retry has the same fingerprint whatever its encoding.
 */
export function withMediaIdentities(body: VideoCreateRequest, identity: (value: string) => string): VideoCreateRequest {
  const b = { ...body } as Record<string, unknown>;
  // An identity is the gateway's name for bytes the body carried: sent as a value, it would stand
  // for them (and fingerprint as them), so it is no valid value of its own.
  const of = (value: string, param: string) => {
    if (value.startsWith(IDENTITY_PREFIX)) throw badRequest('invalid_data_url', `'${param}' must be a base64 image data URL (data:image/png;base64,...), a file id (file_...) or an https URL.`, param);
    return identity(value);
  };
  for (const name of MEDIA_FIELDS) if (typeof b[name] === 'string') b[name] = of(b[name] as string, name);
  for (const name of MEDIA_ARRAY_FIELDS) if (Array.isArray(b[name])) b[name] = (b[name] as unknown[]).map((v, i) => (typeof v === 'string' ? of(v, `${name}[${i}]`) : v));
  return b as VideoCreateRequest;
}

/** How an identity of staged bytes begins (`InputStaging.identity`). */
const IDENTITY_PREFIX = 'sha256:';

/**
 * The image inputs of a request in task order (first frame, last frame, reference images), after
 * the media count limit (every media input counts, reference videos and audios too) and the URL
 * rules of reference videos and audios (passed to upstreams as they are).
 */
export function mediaInputsOf(req: NormalizedVideoRequest, limits: { maxCount: number; allowPrivate?: boolean }): { value: string; param: string; role: MediaRole }[] {
  const count = (req.firstFrame ? 1 : 0) + (req.lastFrame ? 1 : 0) + req.referenceImages.length + req.referenceVideos.length + req.referenceAudios.length;
  if (count > limits.maxCount) {
    throw tooLarge('too_many_media_inputs', `At most ${limits.maxCount} media inputs are accepted per request; got ${count}.`);
  }
  for (const [list, param] of [
    [req.referenceVideos, 'reference_videos'],
    [req.referenceAudios, 'reference_audios'],
  ] as const) {
    list.forEach((url, i) => {
      try {
        parseOutboundUrl(url, { allowPrivate: limits.allowPrivate });
      } catch (err) {
        if (!(err instanceof OutboundUrlError)) throw err;
        throw badRequest('invalid_media_url', `'${param}[${i}]' must be a public https URL: ${err.message}.`, `${param}[${i}]`);
      }
    });
  }
  const inputs: { value: string; param: string; role: MediaRole }[] = [];
  if (req.firstFrame !== undefined) inputs.push({ value: req.firstFrame, param: 'firstFrame', role: 'first_frame' });
  if (req.lastFrame !== undefined) inputs.push({ value: req.lastFrame, param: 'lastFrame', role: 'last_frame' });
  req.referenceImages.forEach((value, i) => inputs.push({ value, param: `referenceImages[${i}]`, role: 'reference_image' }));
  return inputs;
}

/**
 * A webhook target must be a public https URL (the service would otherwise POST into the
 * operator's own network), checked by the shared outbound-URL guard; resolved addresses are checked
 * again when a delivery is sent. `allowPrivate`: the operator allows on-premises receivers.
 */
export function checkCallbackUrl(url: string | undefined, allowPrivate = false): void {
  if (url === undefined) return;
  try {
    parseOutboundUrl(url, { allowPrivate });
  } catch (err) {
    if (!(err instanceof OutboundUrlError)) throw err;
    throw new ApiError(400, 'invalid_callback_url', `callback_url must be a public https URL${allowPrivate ? ' (or http:// to this machine)' : ''}: ${err.message}.`, 'callback_url');
  }
}

/**
 * What makes two creation requests "the same request" for idempotency: every field of the
 * normalized request (aliases resolved, media by identity: content hash, file id or URL) except
 * client_request_id and quote_token.
 */
export function requestFingerprint(req: NormalizedVideoRequest): string {
  const { clientRequestId: _id, quoteToken: _quote, ...shaping } = req;
  const hash = createHash('sha256');
  hashValue(hash, shaping);
  return hash.digest('base64url');
}

const HASH_SLICE = 1 << 20;

/**
 * Feeds a JSON-like value to a hash without serializing it first: media strings can be hundreds of
 * MiB, and a JSON copy of them (plus its UTF-8 copy) would double the request's memory.
 */
function hashValue(hash: Hash, value: unknown): void {
  if (typeof value === 'string') {
    hash.update(`s${value.length}:`);
    for (let i = 0; i < value.length; i += HASH_SLICE) hash.update(value.slice(i, i + HASH_SLICE));
  } else if (Array.isArray(value)) {
    hash.update(`a${value.length}[`);
    for (const item of value) hashValue(hash, item);
    hash.update(']');
  } else if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value).filter(([, v]) => v !== undefined).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    hash.update(`o${entries.length}{`);
    for (const [k, v] of entries) {
      hashValue(hash, k);
      hashValue(hash, v);
    }
    hash.update('}');
  } else {
    hash.update(`${typeof value}:${String(value)};`);
  }
}
