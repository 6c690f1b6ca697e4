/**
 * Operator-written mappings for aggregators (fal, Replicate): hundreds of upstream models without
 * code per model. A catalog model served by an aggregator carries, per provider kind, an
 * `UpstreamMapping`: the upstream endpoint (fal's `owner/app/path`, Replicate's `owner/name`,
 * `owner/name:version`, a version id or `deployments/owner/name`), and two JSONata expressions
 * (https://jsonata.org, the `jsonata` package — a maintained, documented query and transformation
 * language, so operators learn nothing of ours):
 *
 *   input   evaluated over Mediagate's normalized request (`MappingContext`): builds the upstream's
 *           input object. Renames are plain object constructors, value maps are `$lookup`
 *           (`$lookup({"16:9": "landscape_16_9"}, aspect_ratio)`), `8` → `"8s"` is
 *           `$string(duration) & "s"`; a field whose value is missing is left out of the object.
 *           `$error("…")` refuses a request the model cannot take (a rule its catalog entry cannot
 *           state, e.g. an image-to-video model without a frame): the task fails before any
 *           upstream call with that reason, refunded.
 *   output  evaluated over the upstream's answer (fal: the result JSON; Replicate: the prediction):
 *           the output URL, or an array of them (`video.url`, `images.url`, `output`).
 *
 * Media inputs never pass through JSONata: the context holds a token per input, and the tokens in
 * the result are replaced by the input in the mapping's `media` form — a short-lived signed URL the
 * upstream fetches (`url`, the default), a data URL or bare base64 streamed into the body
 * (`Base64Source`, for `jsonStream`). A token must be a whole string value of the result. Tokens
 * carry a random nonce drawn for each request, so a client's text (a prompt that spells a token)
 * is never taken for a media input.
 *
 * Regular expressions in an expression (`$match`, `$replace`, `$contains`, `$split`) run on RE2
 * (the `re2js` package), linear in the input: JSONata's timeout cannot stop one native RegExp
 * call, and a backtracking pattern (`/^(a+)+$/`) on a crafted prompt would freeze the process.
 */
import { randomBytes } from 'node:crypto';
import jsonata from 'jsonata';
import { RE2JS } from 're2js';
import type { ImageJob, MediaInput, VideoJob } from '../types.ts';
import { dataUrl, inlineBase64, signedUrl } from './media-encoding.ts';

export interface UpstreamMapping {
  endpoint: string;
  input: string;
  output: string;
  /** How media inputs reach the upstream (default `url`). */
  media?: 'url' | 'data_url' | 'base64';
  /** Replicate: seconds an image prediction is waited for in its create call (`Prefer: wait=N`, 1–60); absent: polled. */
  wait?: number;
}

export type MappingKind = 'fal' | 'replicate';

/** Mappings of a catalog model by provider kind (catalog_models.upstream_mappings). */
export type UpstreamMappings = Partial<Record<MappingKind, UpstreamMapping>>;

/** A fault of a mapping, at `path` (`endpoint`, `input`, `output`, `media`, `wait`); the message is a predicate of that part ("is not …"). */
export class MappingError extends Error {
  constructor(
    readonly path: string,
    message: string,
    /** The expression refused the request itself with `$error("…")` (a rule of the model the catalog cannot state): `message` is its reason. */
    readonly refusal = false,
  ) {
    super(message);
    this.name = 'MappingError';
  }
}

/** What an `input` expression sees: Mediagate's normalized request. Media are tokens until encoded. */
export type MappingContext = VideoMappingContext | ImageMappingContext;

/** A request as a mapping takes it: its context, the media its tokens stand for, and the nonce in those tokens. */
export interface MappingRequest<C extends MappingContext = MappingContext> {
  context: C;
  media: MediaInput[];
  nonce: string;
  /** Until when its media's signed URLs must serve them: the video task's deadline (absent: an hour, `signedUrl`). */
  until?: Date;
}

export interface VideoMappingContext {
  kind: 'video';
  prompt: string;
  negative_prompt?: string;
  /** Seconds. */
  duration: number;
  aspect_ratio: string;
  /** Lowercase (`720p`). */
  resolution: string;
  generate_audio: boolean;
  first_frame?: string;
  last_frame?: string;
  reference_images: string[];
}

export interface ImageMappingContext {
  kind: 'image';
  operation: 'generation' | 'edit';
  prompt: string;
  n: number;
  width: number;
  height: number;
  /** `WIDTHxHEIGHT`. */
  size: string;
  aspect_ratio: string;
  /** The tier (`1K`). */
  resolution: string;
  output_format: string;
  quality: string;
  background: string;
  /** An edit's input images. */
  images: string[];
  mask?: string;
}

const ENDPOINTS: Record<MappingKind, { pattern: RegExp; what: string }> = {
  fal: {
    pattern: /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*(\/[A-Za-z0-9][A-Za-z0-9._-]*)*$/,
    what: "fal's endpoint id, `owner/app` or `owner/app/path` (e.g. `fal-ai/kling-video/v2.1/standard/image-to-video`)",
  },
  replicate: {
    pattern: /^(?:[a-f0-9]{64}|deployments\/[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*|[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*(?::[a-f0-9]{64})?)$/,
    what: 'a Replicate model `owner/name`, `owner/name:<64-hex version>`, a version id, or `deployments/owner/name`',
  },
};

/**
 * JSONata's `RegexEngine`: RE2 behind the little of a global RegExp that JSONata uses — it sets
 * `lastIndex`, calls `exec`, and reads the match's groups, `index` and the new `lastIndex`. RE2 has
 * no backreferences or lookaround; a pattern with them is refused when the mapping is saved.
 */
class LinearRegExp {
  lastIndex = 0;
  private readonly re: RE2JS;

  constructor(native: RegExp) {
    // translateRegExp carries the i/m flags over as (?im); JSONata's own `g` is this class's lastIndex.
    this.re = RE2JS.compile(RE2JS.translateRegExp(native));
  }

  exec(input: string): RegExpExecArray | null {
    const m = this.re.matcher(input);
    if (this.lastIndex > input.length || !m.find(this.lastIndex)) {
      this.lastIndex = 0;
      return null;
    }
    const groups: (string | undefined)[] = [];
    for (let i = 0; i <= this.re.groupCount(); i++) groups.push(m.group(i) ?? undefined);
    this.lastIndex = m.end();
    return Object.assign(groups, { index: m.start(), input }) as unknown as RegExpExecArray;
  }
}

/**
 * How long one evaluation may run and how deep it may nest (JSONata's own guardrails, D1012 and
 * D1011): its evaluation never yields to the event loop while it recurses, so an expression that
 * does not end (a recursive helper without a base case) would freeze the whole process, at save
 * time or on the request that takes its path. The timeout is checked between steps, so a step must
 * itself end: regular expressions run on RE2 (linear), never on backtracking RegExp.
 */
const OPTIONS = { timeout: 250, stack: 500, RegexEngine: LinearRegExp as unknown as RegExpConstructor };

const compiled = new Map<string, jsonata.Expression>();

/** The expression, compiled once per text (a syntax error, or a regular expression RE2 cannot run, names its position). */
function expression(text: string, path: string): jsonata.Expression {
  let expr = compiled.get(text);
  if (!expr) {
    try {
      expr = jsonata(text, OPTIONS);
    } catch (err) {
      throw new MappingError(path, `is not a valid JSONata expression: ${jsonataMessage(err)}.`);
    }
    checkRegexes(expr.ast(), path);
    if (compiled.size > 1000) compiled.clear();
    compiled.set(text, expr);
  }
  return expr;
}

function jsonataMessage(err: unknown): string {
  const e = err as { message?: string; position?: number; token?: string };
  return `${e.message ?? String(err)}${e.position !== undefined ? ` (at character ${e.position}${e.token ? `, near '${e.token}'` : ''})` : ''}`;
}

/** Every regular expression literal of the expression compiles on RE2 (JSONata compiles them only when evaluated). */
function checkRegexes(node: unknown, path: string, seen = new Set<unknown>()): void {
  if (seen.has(node)) return;
  seen.add(node);
  if (node instanceof RegExp) {
    try {
      new LinearRegExp(node);
    } catch (err) {
      throw new MappingError(path, `uses the regular expression ${String(node).replace(/g$/, '')}, which RE2 cannot run (${(err as Error).message}); backreferences and lookaround are not supported.`);
    }
  } else if (Array.isArray(node)) {
    for (const n of node) checkRegexes(n, path, seen);
  } else if (node && typeof node === 'object') {
    for (const n of Object.values(node)) checkRegexes(n, path, seen);
  }
}

async function evaluate(text: string, path: string, input: unknown): Promise<unknown> {
  try {
    return await expression(text, path).evaluate(input);
  } catch (err) {
    if (err instanceof MappingError) throw err;
    const code = (err as { code?: unknown }).code;
    if (code === 'D1012') throw new MappingError(path, `was stopped: it ran longer than ${OPTIONS.timeout} ms (a loop that does not end?).`);
    if (code === 'D1011') throw new MappingError(path, `was stopped: it nests deeper than ${OPTIONS.stack} steps (a recursive function that does not end?).`);
    // `$error("…")`: the mapping refuses this request (JSONata's D3137), not a fault of the mapping.
    if ((err as { code?: unknown }).code === 'D3137') throw new MappingError(path, (err as Error).message, true);
    throw new MappingError(path, `failed to evaluate: ${jsonataMessage(err)}.`);
  }
}

/** A sample request for checking a mapping when it is saved (its media tokens stand for nothing). */
export function sampleContext(kind: 'image' | 'video', nonce = newNonce()): MappingContext {
  const token = (i: number) => tokenOf(nonce, i);
  return kind === 'video'
    ? { kind, prompt: 'a red fox running through snow', negative_prompt: 'blurry', duration: 5, aspect_ratio: '16:9', resolution: '720p', generate_audio: false, first_frame: token(0), last_frame: token(1), reference_images: [token(2)] }
    : { kind, operation: 'generation', prompt: 'a lighthouse at dusk', n: 1, width: 1024, height: 1024, size: '1024x1024', aspect_ratio: '1:1', resolution: '1K', output_format: 'png', quality: 'auto', background: 'auto', images: [], mask: undefined };
}

/**
 * Checks a mapping of provider `kind` for a model of `modelKind` when it is saved: the endpoint's
 * form, both expressions, and that `input` makes a JSON object of the sample request. Throws a
 * MappingError naming the bad part.
 */
export async function checkMapping(kind: MappingKind, modelKind: 'image' | 'video', mapping: UpstreamMapping): Promise<void> {
  if (!ENDPOINTS[kind].pattern.test(mapping.endpoint)) throw new MappingError('endpoint', `is '${mapping.endpoint}', which is not ${ENDPOINTS[kind].what}.`);
  if (mapping.wait !== undefined && kind !== 'replicate') throw new MappingError('wait', 'is a Replicate setting (Prefer: wait); leave it out for fal.');
  if (mapping.wait !== undefined && modelKind !== 'image') throw new MappingError('wait', 'applies to image models only (a video prediction is always polled).');
  expression(mapping.output, 'output');
  const nonce = newNonce();
  let made: unknown;
  try {
    made = await evaluate(mapping.input, 'input', sampleContext(modelKind, nonce));
  } catch (err) {
    // A mapping may refuse the sample's shape with $error (a last frame below 1080p, say): it evaluated.
    if (err instanceof MappingError && err.refusal) return;
    throw err;
  }
  if (made === null || typeof made !== 'object' || Array.isArray(made)) {
    throw new MappingError('input', `must make a JSON object of the request; for a sample ${modelKind} request it made ${made === undefined ? 'nothing' : JSON.stringify(made).slice(0, 120)}.`);
  }
  for (const [path, value] of walk(made)) {
    if (typeof value === 'string' && value.includes(tokenPrefix(nonce)) && tokenIndex(nonce, value) === undefined) {
      throw new MappingError('input', `puts a media input inside a longer string (at '${path}'); a media field must be the input itself (first_frame, images[0], …), encoded as 'media' says.`);
    }
  }
}

/**
 * A request's nonce: 96 random bits in each of its tokens. The client's prompt is in the same
 * context, so a fixed token (`mediagate-media-input:0`) could be typed as a prompt and be taken for
 * a media input — replaced by the client's file, or failing the mapping as misconfigured, which
 * faults the model on the member for everyone. A token of a nonce drawn after the prompt was written
 * cannot be spelled by it.
 */
const newNonce = () => randomBytes(12).toString('hex');
const tokenPrefix = (nonce: string) => `mediagate-media-input:${nonce}:`;
const tokenOf = (nonce: string, i: number) => `${tokenPrefix(nonce)}${i}`;

/** The media index of `value` if it is a token of this nonce. */
function tokenIndex(nonce: string, value: string): number | undefined {
  const prefix = tokenPrefix(nonce);
  if (!value.startsWith(prefix) || !/^\d+$/.test(value.slice(prefix.length))) return undefined;
  return Number(value.slice(prefix.length));
}

function* walk(value: unknown, path = ''): Generator<[string, unknown]> {
  yield [path, value];
  if (Array.isArray(value)) for (let i = 0; i < value.length; i++) yield* walk(value[i], `${path}[${i}]`);
  else if (value && typeof value === 'object') for (const [k, v] of Object.entries(value)) yield* walk(v, path ? `${path}.${k}` : k);
}

/** The normalized request of a video job, its media as tokens into `media`. */
export function videoContext(job: VideoJob): MappingRequest<VideoMappingContext> {
  const nonce = newNonce();
  const media: MediaInput[] = [];
  const add = (input: MediaInput) => tokenOf(nonce, media.push(input) - 1);
  const context: VideoMappingContext = {
    kind: 'video',
    prompt: job.prompt,
    duration: job.durationSeconds,
    aspect_ratio: job.aspectRatio,
    resolution: job.resolution,
    generate_audio: job.generateAudio,
    reference_images: job.referenceImages.map(add),
  };
  if (job.negativePrompt) context.negative_prompt = job.negativePrompt;
  if (job.firstFrame) context.first_frame = add(job.firstFrame);
  if (job.lastFrame) context.last_frame = add(job.lastFrame);
  // The upstream fetches the media when the job starts: at the task's deadline at the latest.
  return { context, media, nonce, ...(job.deadline && { until: job.deadline }) };
}

/** The normalized request of an image job; an edit's stored inputs (`job.inputFiles`, mask last) as tokens. */
export function imageContext(job: ImageJob): MappingRequest<ImageMappingContext> {
  const nonce = newNonce();
  const token = (i: number) => tokenOf(nonce, i);
  const media = [...(job.inputFiles ?? [])];
  const p = job.params;
  const context: ImageMappingContext = {
    kind: 'image',
    operation: job.operation,
    prompt: job.prompt,
    n: job.n,
    width: p.width,
    height: p.height,
    size: `${p.width}x${p.height}`,
    aspect_ratio: p.aspectRatio,
    resolution: p.resolution,
    output_format: p.outputFormat,
    quality: p.resolvedQuality,
    background: p.background,
    images: media.slice(0, job.mask ? media.length - 1 : media.length).map((_, i) => token(i)),
  };
  if (job.mask && media.length > 0) context.mask = token(media.length - 1);
  return { context, media, nonce };
}

/**
 * The upstream's input for a job: the mapping's `input` over the job's request, with each media
 * token replaced by its input as `media` says (URL strings, or Base64Sources for `jsonStream`).
 */
export async function mappedInput(mapping: UpstreamMapping, request: MappingRequest): Promise<Record<string, unknown>> {
  const made = await evaluate(mapping.input, 'input', request.context);
  if (made === null || typeof made !== 'object' || Array.isArray(made)) throw new MappingError('input', 'did not make a JSON object of this request.');
  return (await encodeMedia(made, mapping.media ?? 'url', request)) as Record<string, unknown>;
}

/** Replaces the request's own tokens only: any other string, whatever it spells, is the client's text. */
async function encodeMedia(value: unknown, form: NonNullable<UpstreamMapping['media']>, request: MappingRequest): Promise<unknown> {
  if (typeof value === 'string') {
    const index = tokenIndex(request.nonce, value);
    if (index === undefined) return value;
    const input = request.media[index];
    if (!input) throw new MappingError('input', `names a media input the request does not have (number ${index}).`);
    return form === 'url' ? signedUrl(input, request.until) : form === 'data_url' ? dataUrl(input) : inlineBase64(input);
  }
  if (Array.isArray(value)) return Promise.all(value.map((v) => encodeMedia(v, form, request)));
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = await encodeMedia(v, form, request);
    return out;
  }
  return value;
}

/** The output URLs the mapping's `output` finds in an upstream answer (none: an empty array). */
export async function mappedOutputs(mapping: UpstreamMapping, answer: unknown): Promise<string[]> {
  const found = await evaluate(mapping.output, 'output', answer);
  const values = found === undefined ? [] : Array.isArray(found) ? found.flat(Infinity) : [found];
  return values.filter((v): v is string => typeof v === 'string' && /^(https?:|data:)/i.test(v));
}
