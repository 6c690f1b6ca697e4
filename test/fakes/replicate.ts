/**
 * A fake Replicate API (api.replicate.com/v1) and its file CDN (replicate.delivery), after
 * ../shared/reference/upstream-apis.md §0, §7.2, §8 and §10.1, with Replicate's own sources read
 * where the reference is thin:
 *
 *   POST {base}/models/{owner}/{name}/predictions       `{input}` → 201 the prediction
 *   POST {base}/predictions                             `{version, input}` (a model's version id)
 *   POST {base}/deployments/{owner}/{name}/predictions  `{input}`, a deployment of a model
 *   GET  {base}/predictions/{id}                        the prediction
 *   POST {base}/predictions/{id}/cancel                 the prediction, `canceled` unless it had ended
 *   GET  {cdn}/{id}/{file}?expires=&sig=                 an output file, on another origin, no
 *                                                        credentials; gone (404) once `expires` passed
 *                                                        or `expire()`d (API files live an hour)
 *
 * The prediction object (SDK index.d.ts @2fd6f394): id, model, version, status, input, output,
 * error, logs, source "api", data_removed, metrics, created_at/started_at/completed_at, urls {get,
 * cancel, stream, web}. Statuses: starting (for `queueMs`) → processing → succeeded | failed, and
 * canceled (cancel) or aborted (a prompt with `[replicate:abort]`: Replicate gave up before the
 * prediction started; §10.1, not charged). `Prefer: wait` / `Prefer: wait=N` (1–60) holds the
 * create answer until the prediction ends or N s pass (§7.2), answering it as it is then. With
 * `inlineOutputs`, such a prediction's image files come in `output` as data URLs instead of links,
 * as Replicate does in sync mode for some models (replicate-javascript's README before 5a98ca7c:
 * "the url() method … may refer to either a remote URL or base64 encoded data-uri. The latter is an
 * optimization we make on certain models"); they are seeded noise of the file's size and format,
 * so that they weigh what a real one does (MBs).
 *
 * Auth: `Authorization: Bearer <token>`; none or unknown → 401 `{title: "Unauthenticated", detail,
 * status}`. A token without credit (`setCredit`) → 402 "Insufficient credit" on creates. An unknown
 * model, version or deployment → 404 `{title: "Not found", detail, status}`. 429 with `Retry-After`
 * and `{detail: "Request was throttled. Expected available in N seconds."}` (§7.2) through
 * `rateLimitNext`. Input is validated at create against the model's schema, as Replicate does:
 * 422 `{title: "Input validation failed", detail: "- input.<field>: <reason>\n…", status: 422,
 * invalid_fields: [{type, field, description}]}` (ASSUMPTION: `invalid_fields` as Replicate's API
 * answers today; the reference confirms only `detail`, `title`, `status`).
 *
 * Deadlines (changelog 2025-10-16 "Set deadlines for predictions", docs topics/predictions/lifecycle,
 * read November 2026 through the docs search): a create's `Cancel-After` header (a duration, "1m",
 * "90s") is the prediction's deadline, measured from its creation (the prediction's `deadline`); at it
 * a prediction that has not started is `aborted` ("exceeded its deadline before it could start
 * running", not charged), one running `canceled` (charged for its run). ASSUMPTION: the duration is
 * Go's form (`1h30m`, `90s`, `500ms`; a bare number is seconds), at least 5 s; any other value is
 * refused 400 (the docs point to a format section this check could not read).
 *
 * Media inputs (`start_image`, `end_image`, `image`, `mask`) are URIs Replicate downloads when the
 * prediction starts — the fake really fetches them; a download that fails fails the prediction —
 * or data URLs. `[replicate:nsfw]` fails a prediction with Replicate's safety-checker error ("NSFW
 * content detected…"), `[replicate:fail]` with a model error.
 *
 * Models served, with their real input names (replicate.com/<model>/api, read November 2026):
 *   kwaivgi/kling-v2.1            prompt*, start_image* (uri), mode standard|pro (720p|1080p),
 *                                 duration 5|10 (integer), negative_prompt, end_image (uri, pro only)
 *                                 → output: one URI
 *   minimax/video-01              prompt*, prompt_optimizer, first_frame_image (uri), subject_reference
 *                                 (uri) → output: one URI (text or a first frame to a 6 s 720p video)
 *   black-forest-labs/flux-schnell prompt*, aspect_ratio 1:1|16:9|21:9|3:2|2:3|4:5|5:4|3:4|4:3|9:16|9:21,
 *                                 num_outputs 1–4, output_format webp|jpg|png, output_quality 0–100,
 *                                 seed, go_fast, megapixels "1"|"0.25", num_inference_steps 1–4,
 *                                 disable_safety_checker → output: a list of URIs
 *   ideogram-ai/ideogram-v3-turbo prompt*, aspect_ratio 1:3|3:1|1:2|2:1|9:16|16:9|10:16|16:10|2:3|3:2|
 *                                 3:4|4:3|4:5|5:4|1:1, magic_prompt_option Auto|On|Off, style_type
 *                                 None|Auto|General|Realistic|Design, seed, image, mask (uri)
 *                                 → output: one URI
 * Unknown input fields are ignored (Replicate drops them with a warning in the logs).
 *
 * Faults per route (`create`, `get`, `cancel`, `cdn`): `rateLimitNext`, `serverErrorNext`,
 * `faults.push`. Logs: `requests`, `predictions`, `counts`.
 */
import { createHmac, randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import sharp from 'sharp';
import { noisePng } from '../support/noise-png.ts';
import { applyFault, sendJson, startFakeServer, type FakeServer, type RecordedRequest } from './fake-http.ts';

export type ReplicateRoute = 'create' | 'get' | 'cancel' | 'cdn';

export interface ReplicateMedia {
  field: string;
  form: 'url' | 'data';
  mimeType: string;
  width: number;
  height: number;
}

export interface FakePrediction {
  id: string;
  model: string;
  version: string;
  token: string;
  input: Record<string, unknown>;
  /** How it was created: `model`, `version` or `deployment`. */
  via: 'model' | 'version' | 'deployment';
  /** The Prefer header of its create call, if any. */
  prefer?: string;
  /** When its `Cancel-After` runs out (ms since the epoch), if its create sent one. */
  deadlineAt?: number;
  media: ReplicateMedia[];
  createdAt: number;
  durationMs: number;
  status: 'starting' | 'processing' | 'succeeded' | 'failed' | 'canceled' | 'aborted';
  output: unknown;
  error: string | null;
  expired: boolean;
  gets: number;
  downloads: number;
  /** Resolved once media are read and the output made. */
  settled?: Promise<void>;
}

export interface ReplicateFakeOptions {
  tokens?: string[];
  queueMs?: number;
  jobDurationMs?: number;
  durationFor?: (prompt: string) => number | 'never' | undefined;
  urlTtlMs?: number;
  /** Image outputs of a prediction created with `Prefer: wait` as data URLs (sync mode). */
  inlineOutputs?: boolean;
}

export interface ReplicateFake extends FakeServer {
  /** The API base a member uses (`{url}/v1`). */
  baseUrl: string;
  cdnUrl: string;
  predictions: Map<string, FakePrediction>;
  counts: Record<ReplicateRoute, number>;
  urlTtlMs: number;
  /** Image outputs of a prediction created with `Prefer: wait` as data URLs (sync mode); settable. */
  inlineOutputs: boolean;
  cdnSawAuth: number;
  /** Version id of each model (for `owner/name:<version>` endpoints). */
  versions: Record<string, string>;
  rateLimitNext(route: ReplicateRoute, seconds: number, times?: number): void;
  serverErrorNext(route: ReplicateRoute, times?: number): void;
  setCredit(token: string, state: 'ok' | 'empty'): void;
  expire(predictionId: string): void;
  /** Predictions of a model, in creation order. */
  of(model: string): FakePrediction[];
}

class InvalidInput extends Error {
  constructor(readonly fields: { type: string; field: string; description: string }[]) {
    super(fields.map((f) => f.description).join('; '));
  }
}

const bad = (type: string, field: string, description: string) => new InvalidInput([{ type, field: `input.${field}`, description }]);

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** A `Cancel-After` duration in ms (`90s`, `1h30m`, `500ms`; a bare number: seconds), or undefined when it is none. */
function durationMs(value: string): number | undefined {
  if (/^\d+(\.\d+)?$/.test(value)) return Number(value) * 1000;
  if (!/^(\d+(\.\d+)?(ms|s|m|h))+$/.test(value)) return undefined;
  let total = 0;
  for (const [, n, unit] of value.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)) total += Number(n) * DURATION_UNITS[unit!]!;
  return total;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

const schema = {
  required(input: Record<string, unknown>, f: string) {
    if (input[f] === undefined) throw bad('required', f, `${f} is required`);
  },
  string(input: Record<string, unknown>, f: string) {
    if (input[f] !== undefined && typeof input[f] !== 'string') throw bad('invalid_type', f, `Invalid type. Expected: string, given: ${typeof input[f]}`);
  },
  uri(input: Record<string, unknown>, f: string) {
    const v = input[f];
    if (v === undefined) return;
    if (typeof v !== 'string' || !/^(https?:\/\/|data:)/.test(v)) throw bad('format', f, `Does not match format 'uri'`);
  },
  enumOf(input: Record<string, unknown>, f: string, values: (string | number)[]) {
    if (input[f] !== undefined && !values.includes(input[f] as string | number)) throw bad('enum', f, `${f} must be one of the following: ${values.map((v) => (typeof v === 'string' ? `"${v}"` : v)).join(', ')}`);
  },
  integer(input: Record<string, unknown>, f: string, min: number, max: number) {
    const v = input[f];
    if (v === undefined) return;
    if (typeof v !== 'number' || !Number.isInteger(v)) throw bad('invalid_type', f, `Invalid type. Expected: integer, given: ${typeof v}`);
    if (v < min) throw bad('number_gte', f, `Must be greater than or equal to ${min}`);
    if (v > max) throw bad('number_lte', f, `Must be less than or equal to ${max}`);
  },
  boolean(input: Record<string, unknown>, f: string) {
    if (input[f] !== undefined && typeof input[f] !== 'boolean') throw bad('invalid_type', f, `Invalid type. Expected: boolean, given: ${typeof input[f]}`);
  },
};

interface Model {
  version: string;
  media: string[];
  validate(input: Record<string, unknown>): void;
  output(input: Record<string, unknown>, publish: (bytes: Buffer, name: string, type: string) => Promise<string>): Promise<unknown>;
}

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(size);
  out.writeUInt32BE(24, 0);
  out.write('ftypmp42', 4, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 29) & 0xff;
  return out;
}

const VIDEO = mp4Bytes(20 * 1024);
const version = (name: string) => createHmac('sha256', 'replicate-fake').update(name).digest('hex');

async function image(width: number, height: number, format: 'png' | 'jpg' | 'webp'): Promise<Buffer> {
  const img = sharp({ create: { width, height, channels: 3, background: { r: 30, g: (width * 7) % 256, b: (height * 3) % 256 } } });
  return format === 'png' ? img.png().toBuffer() : format === 'jpg' ? img.jpeg().toBuffer() : img.webp().toBuffer();
}

/** Noise at the size and in the format of `file`: what a real image of that size weighs. */
async function noiseLike(file: Buffer, seed: number): Promise<Buffer> {
  const { width = 1, height = 1, format } = await sharp(file).metadata();
  const png = await noisePng(width, height, seed);
  return format === 'png' ? png : format === 'jpeg' ? sharp(png).jpeg().toBuffer() : sharp(png).webp().toBuffer();
}

/** Pixel size of a ratio at about `megapixels` (multiples of 16), as flux-schnell renders it. */
function ratioSize(ratio: string, megapixels: number): [number, number] {
  const [w, h] = ratio.split(':').map(Number) as [number, number];
  const height = Math.sqrt((megapixels * 1_048_576 * h) / w);
  return [Math.round((height * w) / h / 16) * 16, Math.round(height / 16) * 16];
}

const FLUX_RATIOS = ['1:1', '16:9', '21:9', '3:2', '2:3', '4:5', '5:4', '3:4', '4:3', '9:16', '9:21'];
const IDEOGRAM_RATIOS = ['1:3', '3:1', '1:2', '2:1', '9:16', '16:9', '10:16', '16:10', '2:3', '3:2', '3:4', '4:3', '4:5', '5:4', '1:1'];

const MODELS: Record<string, Model> = {
  'kwaivgi/kling-v2.1': {
    version: version('kwaivgi/kling-v2.1'),
    media: ['start_image', 'end_image'],
    validate(input) {
      schema.required(input, 'prompt');
      schema.string(input, 'prompt');
      schema.required(input, 'start_image');
      schema.uri(input, 'start_image');
      schema.uri(input, 'end_image');
      schema.enumOf(input, 'mode', ['standard', 'pro']);
      schema.enumOf(input, 'duration', [5, 10]);
      schema.string(input, 'negative_prompt');
      if (input.end_image !== undefined && input.mode !== 'pro') throw bad('invalid', 'end_image', 'end_image requires mode "pro"');
    },
    output: async (_input, publish) => publish(VIDEO, 'output.mp4', 'video/mp4'),
  },
  'minimax/video-01': {
    version: version('minimax/video-01'),
    media: ['first_frame_image', 'subject_reference'],
    validate(input) {
      schema.required(input, 'prompt');
      schema.string(input, 'prompt');
      schema.boolean(input, 'prompt_optimizer');
      schema.uri(input, 'first_frame_image');
      schema.uri(input, 'subject_reference');
    },
    output: async (_input, publish) => publish(VIDEO, 'output.mp4', 'video/mp4'),
  },
  'black-forest-labs/flux-schnell': {
    version: version('black-forest-labs/flux-schnell'),
    media: [],
    validate(input) {
      schema.required(input, 'prompt');
      schema.string(input, 'prompt');
      schema.enumOf(input, 'aspect_ratio', FLUX_RATIOS);
      schema.integer(input, 'num_outputs', 1, 4);
      schema.enumOf(input, 'output_format', ['webp', 'jpg', 'png']);
      schema.integer(input, 'output_quality', 0, 100);
      schema.integer(input, 'seed', 0, 2 ** 32);
      schema.boolean(input, 'go_fast');
      schema.enumOf(input, 'megapixels', ['1', '0.25']);
      schema.integer(input, 'num_inference_steps', 1, 4);
      schema.boolean(input, 'disable_safety_checker');
    },
    output: async (input, publish) => {
      const format = (input.output_format as 'webp' | 'jpg' | 'png' | undefined) ?? 'webp';
      const [w, h] = ratioSize((input.aspect_ratio as string | undefined) ?? '1:1', input.megapixels === '0.25' ? 0.25 : 1);
      const out: string[] = [];
      for (let i = 0; i < ((input.num_outputs as number | undefined) ?? 1); i++) out.push(await publish(await image(w, h, format), `out-${i}.${format}`, format === 'jpg' ? 'image/jpeg' : `image/${format}`));
      return out;
    },
  },
  'ideogram-ai/ideogram-v3-turbo': {
    version: version('ideogram-ai/ideogram-v3-turbo'),
    media: ['image', 'mask'],
    validate(input) {
      schema.required(input, 'prompt');
      schema.string(input, 'prompt');
      schema.enumOf(input, 'aspect_ratio', IDEOGRAM_RATIOS);
      schema.enumOf(input, 'magic_prompt_option', ['Auto', 'On', 'Off']);
      schema.enumOf(input, 'style_type', ['None', 'Auto', 'General', 'Realistic', 'Design']);
      schema.integer(input, 'seed', 0, 2147483647);
      schema.uri(input, 'image');
      schema.uri(input, 'mask');
      if ((input.image === undefined) !== (input.mask === undefined)) throw bad('invalid', input.image === undefined ? 'image' : 'mask', 'image and mask must be given together');
    },
    output: async (input, publish) => {
      const [w, h] = ratioSize((input.aspect_ratio as string | undefined) ?? '1:1', 1);
      return publish(await image(w, h, 'png'), 'output.png', 'image/png');
    },
  },
};

/** Deployments the fake knows: `owner/name` → the model they run. */
const DEPLOYMENTS: Record<string, string> = { 'mediagate/kling-prod': 'kwaivgi/kling-v2.1' };

async function readMedia(value: string, field: string): Promise<ReplicateMedia> {
  let bytes: Buffer;
  let form: ReplicateMedia['form'];
  if (value.startsWith('data:')) {
    form = 'data';
    bytes = Buffer.from(value.slice(value.indexOf(',') + 1), 'base64');
  } else {
    form = 'url';
    const res = await fetch(value, { signal: AbortSignal.timeout(10_000) });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    bytes = Buffer.from(await res.arrayBuffer());
  }
  const meta = await sharp(bytes).metadata();
  return { field, form, mimeType: `image/${meta.format}`, width: meta.width ?? 0, height: meta.height ?? 0 };
}

export async function startReplicateFake(options: ReplicateFakeOptions = {}): Promise<ReplicateFake> {
  const tokens = new Set(options.tokens ?? ['r8_test']);
  const noCredit = new Set<string>();
  const queueMs = options.queueMs ?? 60;
  const jobDurationMs = options.jobDurationMs ?? 250;
  const predictions = new Map<string, FakePrediction>();
  const files = new Map<string, { bytes: Buffer; type: string; prediction: FakePrediction }>();
  const counts: Record<ReplicateRoute, number> = { create: 0, get: 0, cancel: 0, cdn: 0 };
  const signKey = randomBytes(16);
  let fake!: ReplicateFake;

  const sign = (path: string, expires: number) => createHmac('sha256', signKey).update(`${path}|${expires}`).digest('hex').slice(0, 24);

  const cdn = await startFakeServer(async (req, res, recorded, self) => {
    counts.cdn++;
    if (req.headers.authorization !== undefined) fake.cdnSawAuth++;
    if (await applyFault(res, self.faults.take('cdn'))) return;
    const file = files.get(recorded.path);
    const expires = Number(recorded.query.get('expires'));
    // replicate.delivery answers a file it deleted (API files live an hour) as not found.
    if (!file || recorded.query.get('sig') !== sign(recorded.path, expires) || file.prediction.expired || !(expires * 1000 > Date.now())) {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('Not Found');
      return;
    }
    file.prediction.downloads++;
    res.writeHead(200, { 'content-type': file.type, 'content-length': String(file.bytes.length) });
    res.end(file.bytes);
  });

  let inlined = 0;
  const publisher = (p: FakePrediction) => async (bytes: Buffer, name: string, type: string) => {
    if (fake.inlineOutputs && /^wait/.test(p.prefer ?? '') && type.startsWith('image/')) return `data:${type};base64,${(await noiseLike(bytes, ++inlined)).toString('base64')}`;
    const path = `/${randomBytes(8).toString('hex')}/${name}`;
    files.set(path, { bytes, type, prediction: p });
    const expires = Math.floor((Date.now() + fake.urlTtlMs) / 1000);
    return `${cdn.url}${path}?${new URLSearchParams({ expires: String(expires), sig: sign(path, expires) })}`;
  };

  const problem = (status: number, title: string, detail: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) => ({ status, body: { title, detail, status, ...extra }, headers });

  /** Moves a prediction along its timeline; on its end, reads its media and makes its output. */
  function advance(p: FakePrediction): void {
    if (p.status !== 'starting' && p.status !== 'processing') return;
    const age = Date.now() - p.createdAt;
    // Its deadline came before its end: never started (aborted, not charged), or cut short (canceled).
    if (p.deadlineAt !== undefined && Date.now() >= p.deadlineAt && p.deadlineAt < p.createdAt + Math.max(queueMs, p.durationMs)) {
      p.status = p.deadlineAt < p.createdAt + queueMs ? 'aborted' : 'canceled';
      return;
    }
    if (age < queueMs) return;
    const prompt = typeof p.input.prompt === 'string' ? p.input.prompt : '';
    if (prompt.includes('[replicate:abort]')) {
      p.status = 'aborted';
      return;
    }
    p.status = 'processing';
    p.settled ??= (async () => {
      const model = MODELS[p.model]!;
      try {
        for (const field of model.media) if (typeof p.input[field] === 'string') p.media.push(await readMedia(p.input[field] as string, field));
      } catch {
        p.error = 'Failed to download file from URL. Please check that the URL is publicly accessible.';
        return;
      }
      if (prompt.includes('[replicate:nsfw]')) p.error = 'NSFW content detected. Try running it again, or try a different prompt.';
      else if (prompt.includes('[replicate:fail]')) p.error = 'Prediction failed: CUDA error: an illegal memory access was encountered';
      else p.output = await model.output(p.input, publisher(p));
    })();
    if (age >= p.durationMs && p.output === null && p.error === null) return; // settles on a later look
    if (age >= p.durationMs) p.status = p.error ? 'failed' : 'succeeded';
  }

  async function settle(p: FakePrediction): Promise<void> {
    advance(p);
    if (p.settled) await p.settled;
    advance(p);
  }

  const view = (p: FakePrediction) => {
    const done = ['succeeded', 'failed', 'canceled', 'aborted'].includes(p.status);
    const get = `${fake.baseUrl}/predictions/${p.id}`;
    return {
      id: p.id,
      model: p.model,
      version: p.via === 'model' ? 'hidden' : p.version,
      input: p.input,
      logs: p.status === 'starting' ? '' : 'Running prediction...\n',
      output: p.status === 'succeeded' ? p.output : null,
      data_removed: false,
      error: p.status === 'failed' ? p.error : null,
      source: 'api',
      status: p.status,
      created_at: new Date(p.createdAt).toISOString(),
      started_at: p.status === 'starting' || p.status === 'aborted' ? null : new Date(p.createdAt + queueMs).toISOString(),
      ...(p.deadlineAt !== undefined && { deadline: new Date(p.deadlineAt).toISOString() }),
      completed_at: done ? new Date().toISOString() : null,
      metrics: done && p.status === 'succeeded' ? { predict_time: p.durationMs / 1000, total_time: p.durationMs / 1000 } : {},
      urls: { cancel: `${get}/cancel`, get, stream: `${fake.baseUrl.replace('/v1', '')}/stream/${p.id}`, web: `https://replicate.com/p/${p.id}` },
    };
  };

  const authenticate = (req: IncomingMessage): string | undefined => {
    const token = /^Bearer\s+(\S+)$/.exec(req.headers.authorization ?? '')?.[1];
    return token && tokens.has(token) ? token : undefined;
  };

  const server = await startFakeServer(async (req, res, recorded, self) => {
    const route = routeOf(recorded);
    const answer = (a: { status: number; body: unknown; headers?: Record<string, string> }) => sendJson(res, a.status, a.body, a.headers ?? {});
    if (!route) return answer(problem(404, 'Not found', 'The requested resource could not be found.'));
    const token = authenticate(req);
    if (!token) return answer(problem(401, 'Unauthenticated', 'You did not pass a valid authentication token'));
    counts[route.name]++;
    if (await applyFault(res, self.faults.take(route.name))) return;

    if (route.name === 'create') {
      const body = recorded.json;
      if (!isObject(body)) return answer(problem(400, 'Bad request', 'The request body must be a JSON object'));
      let modelName: string | undefined;
      if (route.via === 'model') modelName = MODELS[route.target] ? route.target : undefined;
      else if (route.via === 'deployment') modelName = DEPLOYMENTS[route.target];
      else {
        if (typeof body.version !== 'string') return answer(problem(422, 'Input validation failed', '- version: version is required\n', { invalid_fields: [{ type: 'required', field: 'version', description: 'version is required' }] }));
        const v = body.version.includes(':') ? body.version.split(':')[1]! : body.version;
        modelName = Object.keys(MODELS).find((m) => MODELS[m]!.version === v);
        if (!modelName) return answer(problem(422, 'Invalid version or not permitted', 'The specified version does not exist (or perhaps you don\'t have permission to use it?)'));
      }
      if (!modelName) return answer(problem(404, 'Not found', 'The requested resource could not be found.'));
      if (noCredit.has(token)) return answer(problem(402, 'Insufficient credit', 'You have insufficient credit to run this model. Go to the billing page to purchase credit. Once you purchase credit, please wait a few minutes before trying again.'));
      const input = isObject(body.input) ? body.input : undefined;
      if (!input) return answer(problem(422, 'Input validation failed', '- input: input is required\n', { invalid_fields: [{ type: 'required', field: 'input', description: 'input is required' }] }));
      try {
        MODELS[modelName]!.validate(input);
      } catch (err) {
        if (!(err instanceof InvalidInput)) throw err;
        return answer(problem(422, 'Input validation failed', err.fields.map((f) => `- ${f.field}: ${f.description}\n`).join(''), { invalid_fields: err.fields }));
      }
      const cancelAfter = req.headers['cancel-after'];
      const lifetimeMs = typeof cancelAfter === 'string' ? durationMs(cancelAfter.trim()) : undefined;
      if (cancelAfter !== undefined && !(lifetimeMs !== undefined && lifetimeMs >= 5000)) return answer(problem(400, 'Invalid Cancel-After header', `Cancel-After must be a duration of at least 5s (e.g. 30s, 5m, 1h), got '${String(cancelAfter)}'`));
      const prompt = typeof input.prompt === 'string' ? input.prompt : '';
      const planned = options.durationFor?.(prompt);
      const p: FakePrediction = {
        id: randomBytes(13).toString('base64url').toLowerCase().replace(/[^a-z0-9]/g, 'q').slice(0, 26).padEnd(26, 'q'),
        model: modelName,
        version: MODELS[modelName]!.version,
        token,
        input,
        via: route.via,
        prefer: req.headers.prefer as string | undefined,
        ...(lifetimeMs !== undefined && { deadlineAt: Date.now() + lifetimeMs }),
        media: [],
        createdAt: Date.now(),
        durationMs: planned === 'never' ? Number.POSITIVE_INFINITY : (planned ?? jobDurationMs),
        status: 'starting',
        output: null,
        error: null,
        expired: false,
        gets: 0,
        downloads: 0,
      };
      predictions.set(p.id, p);
      const wait = /^wait(?:=(\d+))?$/.exec(String(req.headers.prefer ?? '').trim());
      if (wait) {
        const seconds = Math.min(60, Math.max(1, Number(wait[1] ?? 60)));
        const until = Date.now() + seconds * 1000;
        for (;;) {
          await settle(p);
          if (!['starting', 'processing'].includes(p.status) || Date.now() >= until) break;
          await new Promise((r) => setTimeout(r, 20));
        }
      }
      return answer({ status: 201, body: view(p) });
    }

    const p = predictions.get(route.id);
    if (!p || p.token !== token) return answer(problem(404, 'Not found', 'The requested resource could not be found.'));
    if (route.name === 'cancel') {
      if (p.status === 'starting' || p.status === 'processing') p.status = 'canceled';
      return answer({ status: 200, body: view(p) });
    }
    p.gets++;
    await settle(p);
    return answer({ status: 200, body: view(p) });
  });

  fake = Object.assign(server, {
    baseUrl: `${server.url}/v1`,
    cdnUrl: cdn.url,
    predictions,
    counts,
    urlTtlMs: options.urlTtlMs ?? 3_600_000,
    inlineOutputs: options.inlineOutputs ?? false,
    cdnSawAuth: 0,
    versions: Object.fromEntries(Object.entries(MODELS).map(([name, m]) => [name, m.version])),
    rateLimitNext(route: ReplicateRoute, seconds: number, times = 1) {
      const queue = route === 'cdn' ? cdn.faults : server.faults;
      queue.push(route, { status: 429, body: { detail: `Request was throttled. Expected available in ${seconds} second${seconds === 1 ? '' : 's'}.`, status: 429 }, headers: { 'retry-after': String(seconds) } }, times);
    },
    serverErrorNext(route: ReplicateRoute, times = 1) {
      (route === 'cdn' ? cdn.faults : server.faults).push(route, { status: 503, body: { title: 'Service Unavailable', detail: 'The service is temporarily unavailable.', status: 503 } }, times);
    },
    setCredit(token: string, state: 'ok' | 'empty') {
      if (state === 'empty') noCredit.add(token);
      else noCredit.delete(token);
    },
    expire(id: string) {
      const p = predictions.get(id);
      if (p) p.expired = true;
    },
    of(model: string) {
      return [...predictions.values()].filter((p) => p.model === model);
    },
    close: async () => {
      await cdn.close();
      server.server.closeAllConnections();
      await new Promise<void>((resolve) => server.server.close(() => resolve()));
    },
  }) as ReplicateFake;
  return fake;
}

type Route = { name: 'create'; via: 'model' | 'version' | 'deployment'; target: string } | { name: 'get' | 'cancel'; id: string };

function routeOf(r: RecordedRequest): Route | undefined {
  let m = /^\/v1\/models\/([^/]+\/[^/]+)\/predictions$/.exec(r.path);
  if (m && r.method === 'POST') return { name: 'create', via: 'model', target: m[1]! };
  m = /^\/v1\/deployments\/([^/]+\/[^/]+)\/predictions$/.exec(r.path);
  if (m && r.method === 'POST') return { name: 'create', via: 'deployment', target: m[1]! };
  if (r.path === '/v1/predictions' && r.method === 'POST') return { name: 'create', via: 'version', target: '' };
  m = /^\/v1\/predictions\/([^/]+)(\/cancel)?$/.exec(r.path);
  if (m && r.method === (m[2] ? 'POST' : 'GET')) return { name: m[2] ? 'cancel' : 'get', id: m[1]! };
  return undefined;
}
