/**
 * A fake MiniMax open platform (api.minimax.io / api.minimaxi.com) serving Hailuo video generation,
 * after ../shared/reference/upstream-apis.md §0, §8 and §10.4, with the vendor's own sources read
 * where the reference is thin:
 *
 *   POST {base}/v1/video_generation                   v1 create → `{task_id, base_resp}`
 *   GET  {base}/v1/query/video_generation?task_id=    v1 task: Preparing → Queueing → Processing →
 *                                                     Success (`file_id`, `video_width/height`) | Fail
 *   GET  {base}/v1/files/retrieve?file_id=            `{file: {file_id (int64), bytes, created_at,
 *                                                     filename, purpose, download_url}, base_resp}`
 *   POST {base}/v2/video_generation                   v2 create (MiniMax-H3) → `{task_id}`
 *   GET  {base}/v2/query/video_generation/{task_id}   `{task: {id, model, status, content: {url},
 *                                                     error: {code, message}, usage, …}}`
 *   GET  {cdn}/prod/{date}/{file}.mp4?Expires=&OSSAccessKeyId=&Signature=   the video, on another
 *        origin (object storage, no credentials); a link past `Expires`, or one `expire()`d, is 403
 *        AccessDenied "Request has expired." as OSS answers it
 *
 * Auth: `Authorization: Bearer <API key>`. v1 errors come the MiniMax way: HTTP 200 with
 * `base_resp: {status_code ≠ 0, status_msg}` (§10.4; new-api hailuo adaptor, MiniMax-MCP client,
 * MiniMax CLI all read it at HTTP 200); v2's have an envelope of their own (below). No
 * Authorization → 1004 "login fail: …"; an unknown key → 2049 "invalid api key" (new-api
 * constants.go lists both). Every answer has a `Trace-Id` header
 * (MiniMax-MCP quotes it). A path the API does not have is a plain HTTP 404.
 *
 * Codes the fake answers: 1002 rate limit (`rateLimitNext`; with `seconds` it is HTTP 429 with
 * `Retry-After`, standing for MiniMax's edge — the official CLI maps HTTP 429 to a rate limit;
 * ASSUMPTION: the body still carries base_resp 1002), 1004/2049 auth, 1008 insufficient balance
 * (`setBalance(key, 'empty')`: creates only, queries and files keep working: ASSUMPTION), 1026 input
 * sensitive (a prompt with `[minimax:sensitive]`), 1027 output sensitive (a task whose prompt has
 * `[minimax:sensitive-output]` fails with it), 2013 invalid params (every validation below, with the
 * reason after "invalid params, "; an unknown model is "invalid params, unknown model 'X'" as MiniMax
 * answered it live: jlcodes99/cockpit-tools#1431), 2061 model not in the account's plan
 * (`permitModels`; the official CLI's code for "model not available on your current plan"), and
 * `errorNext(route, code)` for any other (1000 unknown, 1001 timeout, 1024 internal error, …).
 * `serverErrorNext` is a 502 HTML page of a proxy in front (no envelope at all).
 *
 * v1 per model (MiniMax's model pages as copied by new-api models.go @5cb8f6a2, docs.fast-token.com,
 * docs.unifically.com, the official CLI and MCP descriptions; they agree on these):
 *   MiniMax-Hailuo-2.3       text or first frame; 768P at 6|10 s, 1080P at 6 s
 *   MiniMax-Hailuo-2.3-Fast  first frame required (image-to-video only); same tiers
 *   MiniMax-Hailuo-02        text, first frame, first + last frame; 512P (first frame only, 6|10 s),
 *                            768P 6|10 s, 1080P 6 s; no last frame at 512P
 *   T2V-01, T2V-01-Director  text only, 720P, 6 s
 *   I2V-01, I2V-01-Director, I2V-01-live   first frame required, 720P, 6 s
 *   S2V-01                   `subject_reference: [{type: "character", image: [one image]}]` required,
 *                            no frames, 720P, 6 s
 * Defaults: duration 6, resolution 768P (Hailuo) / 720P (01). `prompt` ≤ 2000 characters, required
 * without a first frame; `prompt_optimizer`, `fast_pretreatment`, `aigc_watermark` booleans;
 * `callback_url` a string. Images (first/last frame, subject): a data URL
 * (`data:image/<jpeg|jpg|png|webp>;base64,`) or an http(s) URL, which the fake really fetches (as
 * MiniMax does: a Mediagate signed URL must serve the bytes); JPG/PNG/WebP under 20 MB, short side
 * over 300 px, ratio between 2:5 and 5:2. Unknown fields are ignored (recorded).
 *
 * v2 (MiniMax-H3; body from new-api models.go @5cb8f6a2 and e2e_test.go @75b527f5, LiteLLM
 * `litellm/llms/minimax/videos/transformation.py` @0e6e1f58, which the reference marked UNVERIFIED
 * and three independent clients now agree on): `content[]` of one `{type: text, text}` and
 * `{type: image_url, image_url: {url}, role: first_frame | last_frame | reference_image}`
 * (`video_url` / `audio_url` with `reference_video` / `reference_audio`: up to 3 each); at most one
 * first and one last frame (a last frame needs the first: ComfyUI's H3 node), up to 9 reference
 * images, frames and references never together; `resolution` 768P | 2K (default 768P), `duration`
 * 4–15 (default 5), `ratio` adaptive | 21:9 | 16:9 | 4:3 | 1:1 | 3:4 | 9:16, required and not
 * adaptive for text only (new-api constants.go); images 256–5760 px, ratio 2:5–5:2 (Comfy docs).
 * Statuses queued → running → succeeded | failed | cancelled | expired (`expired`: MiniMax's CLI
 * @0c7abd65 src/types/api.ts and @0c4affd4 src/commands/video/generate.ts, which treats it as a
 * failure; a prompt with `[minimax:expired]`); `content.url` is a CDN link made when the task
 * succeeds. A failed task's `error.code` is MiniMax's numeric code as a string (LiteLLM types it as
 * a string). `content.url` is signed for `urlTtlMs` (the v2 query page: the link is time-limited,
 * download it promptly); ASSUMPTION: each query signs it anew, as v1's retrieve does. The models:
 * MiniMax-H3 and MiniMax-H3-Max (the v2 create page: "switch between MiniMax H3 and MiniMax H3 Max
 * with the `model` field"), validated alike.
 *
 * A refused v2 request (`fake.v2Errors`, default `error`): MiniMax's own v2 pages
 * (platform.minimaxi.com/docs/api-reference/video-generation-v2-create and -regeneration, checked
 * for this fake) show one envelope at the HTTP status it names:
 * `{type: "error", error: {type, message: "<reason> (<code>)", http_code: "<status>"}, request_id}`
 * — no `error.code`: the number is only at the end of the message. Their examples pair the types
 * so: 400 `bad_request_error` (2013), 401 `authorized_error` (1004), 402
 * `insufficient_balance_error` (1008), 422 `unprocessable_entity_error` ("video description
 * contains sensitive content (1026)"), 429 `rate_limit_error` (1002), 500 `server_error` (1000).
 * ASSUMPTION: 2049 is `authorized_error`, 1001/1024/1033 `server_error`, 1028/1030
 * `rate_limit_error`, any other code (2061, 2038, …) `bad_request_error`. Injected faults
 * (`errorNext`, `rateLimitNext`) answer a v2 route in the same envelope, at the status the docs
 * pair with the code unless the test gave one (`errorNext(…, {status: 200})`: the envelope at HTTP
 * 200). `base_resp` answers v2 as v1 does (what new-api and MiniMax-MCP read).
 * ⚠ DISAGREE, not settled: the CLI's src/video/v2.ts @7af4b0ba refuses any H3 resolution but 2K
 * ("MiniMax-H3 currently only supports 2K resolution"); new-api and ComfyUI offer 768P too. The
 * fake takes both (a 768P job would fail with 2013 if the CLI is right: the catalog's choice).
 *
 * ⚠ DISAGREE, both emitted: the v1 failure word is `Fail` in the reference, new-api and MiniMax-MCP,
 * but `Failed` in the official CLI's types and polling (MiniMax-AI/cli @9f2eab08
 * src/types/api.ts, src/commands/video/generate.ts): `failWord` picks one. `file_id` is a string in
 * the query answer and an int64 in the retrieve answer (§10.4). A failed v1 task carries its reason
 * in `base_resp` (new-api's ParseTaskResult reads it there) for a content refusal
 * (`[minimax:sensitive-output]`: 1027); a task that just failed (`[minimax:fail]`) keeps base_resp 0
 * (MiniMax-MCP reads only `status`). ASSUMPTION: each retrieve signs a fresh `download_url`, valid
 * `urlTtlMs` (MiniMax says 9 hours on its video pages; a 3P module says 1 hour; default 9 h).
 *
 * Checked in vendor sources: MiniMax-AI/MiniMax-MCP @2910d663 `minimax_mcp/client.py` (base_resp
 * checked at HTTP 200, 1004, 2038) and `minimax_mcp/server.py` (submit, query, retrieve, download);
 * MiniMax-AI/cli @9f2eab08 `src/errors/api.ts` (HTTP 429, 1028/1030 quota, 2061 plan),
 * `src/commands/video/generate.ts` (2.3-Fast needs a first frame, last frame needs the first,
 * subject_reference shape), `test/fixtures/video-task-*.json`; the official error-code page
 * https://platform.minimax.io/docs/api-reference/errorcode.md (1000, 1001, 1002, 1004, 1008, 1024)
 * and query page https://platform.minimax.io/docs/api-reference/video-generation-query.md;
 * QuantumNous/new-api `relay/channel/task/hailuo/{adaptor.go@22ad9442, constants.go, models.go
 * @5cb8f6a2, e2e_test.go@75b527f5}`. Not modelled: callbacks (the adapter polls), cancellation (none
 * documented for v1), the v2 list and delete endpoints.
 *
 * Faults per route (`submit`, `poll`, `retrieve`, `cdn`; v1 and v2 share `submit` and `poll`) through
 * `faults.push(route, fault)` (after auth), `rateLimitNext`, `serverErrorNext`, `errorNext`. Timing:
 * Preparing for the first half of `queueMs`, Queueing for the rest, Processing until
 * `jobDurationMs` (per prompt: `durationFor`). Logs: `tasks`, `counts`, `requests`.
 */
import { createHmac, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import sharp, { type Metadata } from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type MiniMaxRoute = 'submit' | 'poll' | 'retrieve' | 'cdn';
export type MiniMaxProtocol = 'v1' | 'v2';

export interface MiniMaxImage {
  /** `first_frame`, `last_frame`, `subject` (S2V-01) or `reference_image` (v2). */
  role: string;
  /** How it came: a data URL, or a URL the fake fetched. */
  form: 'data' | 'url';
  mimeType: string;
  width: number;
  height: number;
  bytes: number;
}

export interface MiniMaxFakeTask {
  id: string;
  protocol: MiniMaxProtocol;
  apiKey: string;
  model: string;
  prompt: string;
  /** The create body, every image replaced by its description. */
  body: Record<string, unknown>;
  images: MiniMaxImage[];
  duration: number;
  /** As sent (`768P`, `2K`, …). */
  resolution: string;
  ratio?: string;
  createdAt: number;
  durationMs: number;
  outcome: 'ok' | 'sensitive' | 'fail' | 'expired';
  /** Set when the task succeeds (v1). */
  fileId?: string;
  /** The result link (v2), made when the task succeeds. */
  url?: string;
  expired: boolean;
  polls: number;
  retrieves: number;
  downloads: number;
}

export interface MiniMaxFakeOptions {
  /** API keys the fake knows (default `['mm-test']`). */
  apiKeys?: string[];
  /** Time in Preparing + Queueing (default 60 ms). */
  queueMs?: number;
  /** Total time until the task ends (default 300 ms). */
  jobDurationMs?: number;
  durationFor?: (prompt: string) => number | 'never' | undefined;
  /** Lifetime of a result link (default 9 h; mutable as `fake.urlTtlMs`). */
  urlTtlMs?: number;
  /** The v1 failure word (default `Fail`; mutable as `fake.failWord`). */
  failWord?: 'Fail' | 'Failed';
  /** Size of the MP4 (default 36 KiB). */
  videoBytes?: number;
  /** How a v2 request is refused (default `error`; mutable as `fake.v2Errors`): see the header. */
  v2Errors?: 'error' | 'base_resp';
}

export interface MiniMaxFake extends FakeServer {
  cdnUrl: string;
  tasks: Map<string, MiniMaxFakeTask>;
  counts: Record<MiniMaxRoute, number>;
  urlTtlMs: number;
  failWord: 'Fail' | 'Failed';
  v2Errors: 'error' | 'base_resp';
  /** Requests to the CDN that carried an Authorization header (they must not). */
  cdnSawAuth: number;
  /** Limits the models `apiKey` may use (others: 2061); undefined: every model. */
  permitModels(apiKey: string, models: string[] | undefined): void;
  /** `empty`: every create of `apiKey` answers 1008 insufficient balance. */
  setBalance(apiKey: string, state: 'ok' | 'empty'): void;
  /** The next `times` requests of `route` get 1002 rate limit: HTTP 200 without `seconds`, HTTP 429 with `Retry-After: seconds`. */
  rateLimitNext(route: MiniMaxRoute, seconds?: number, times?: number): void;
  /** The next `times` requests of `route` get a proxy's 502 page (the CDN: 503). */
  serverErrorNext(route: MiniMaxRoute, times?: number): void;
  /** The next request of `route` gets base_resp `code` (HTTP `status`, default 200); a v2 request, the v2 envelope (see the header). */
  errorNext(route: Exclude<MiniMaxRoute, 'cdn'>, code: number, opts?: { status?: number; message?: string }): void;
  /** The task's result links answer 403 from now on. */
  expire(taskId: string): void;
  /** The task's status as a query would answer it now. */
  statusOf(taskId: string): string | undefined;
}

// ---------------------------------------------------------------------------------------------
// Models (§10.4)

interface V1Model {
  /** Resolution → durations. */
  tiers: Record<string, number[]>;
  defaultResolution: string;
  text: boolean;
  firstFrame: boolean;
  lastFrame: boolean;
  subject: boolean;
  /** Resolutions that need a first frame (Hailuo 02's 512P). */
  imageOnlyTiers: string[];
}

const hailuo = (o: Partial<V1Model>): V1Model => ({ tiers: { '768P': [6, 10], '1080P': [6] }, defaultResolution: '768P', text: true, firstFrame: true, lastFrame: false, subject: false, imageOnlyTiers: [], ...o });
const gen01 = (o: Partial<V1Model>): V1Model => ({ tiers: { '720P': [6] }, defaultResolution: '720P', text: false, firstFrame: false, lastFrame: false, subject: false, imageOnlyTiers: [], ...o });

const V1_MODELS: Record<string, V1Model> = {
  'MiniMax-Hailuo-2.3': hailuo({}),
  'MiniMax-Hailuo-2.3-Fast': hailuo({ text: false }),
  'MiniMax-Hailuo-02': hailuo({ tiers: { '512P': [6, 10], '768P': [6, 10], '1080P': [6] }, lastFrame: true, imageOnlyTiers: ['512P'] }),
  'T2V-01': gen01({ text: true }),
  'T2V-01-Director': gen01({ text: true }),
  'I2V-01': gen01({ firstFrame: true }),
  'I2V-01-Director': gen01({ firstFrame: true }),
  'I2V-01-live': gen01({ firstFrame: true }),
  'S2V-01': gen01({ subject: true }),
};
const V2_MODELS = new Set(['MiniMax-H3', 'MiniMax-H3-Max']);
const V2_RATIOS = ['adaptive', '21:9', '16:9', '4:3', '1:1', '3:4', '9:16'];
const V2_RESOLUTIONS = ['768P', '2K'];

/** ASSUMPTION: output heights per tier; 768P is 1366x768 (ComfyUI's Hailuo node). */
const HEIGHTS: Record<string, number> = { '512P': 512, '720P': 720, '768P': 768, '1080P': 1080, '2K': 1440 };

const MESSAGES: Record<number, string> = {
  1000: 'unknown error',
  1001: 'request timeout',
  1002: 'rate limit',
  1004: "login fail: Please carry the API secret key in the 'Authorization' field of the request header",
  1008: 'insufficient balance',
  1024: 'internal error',
  1026: 'input new_sensitive',
  1027: 'output new_sensitive',
  2049: 'invalid api key',
  2061: 'your current token plan does not support this model',
};

class MiniMaxError extends Error {
  constructor(
    readonly code: number,
    message = MESSAGES[code] ?? 'unknown error',
  ) {
    super(message);
  }
}

/** A v2 refusal's HTTP status and `error.type` by MiniMax code (see the header); others: 400 `bad_request_error`. */
const V2_ERRORS: Record<number, [number, string]> = {
  1004: [401, 'authorized_error'],
  2049: [401, 'authorized_error'],
  1008: [402, 'insufficient_balance_error'],
  1026: [422, 'unprocessable_entity_error'],
  1002: [429, 'rate_limit_error'],
  1028: [429, 'rate_limit_error'],
  1030: [429, 'rate_limit_error'],
  1000: [500, 'server_error'],
  1001: [500, 'server_error'],
  1024: [500, 'server_error'],
  1033: [500, 'server_error'],
};

/** The v2 envelope of a refusal (see the header): the code only at the end of the message. */
function v2Envelope(code: number, message: string, status?: number): { status: number; body: Record<string, unknown> } {
  const [documented, type] = V2_ERRORS[code] ?? [400, 'bad_request_error'];
  const said = code === 1026 ? 'video description contains sensitive content' : message;
  return { status: status ?? documented, body: { type: 'error', error: { type, message: `${said} (${code})`, http_code: String(documented) }, request_id: traceId() } };
}

const invalid = (reason: string) => new MiniMaxError(2013, `invalid params, ${reason}`);
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const traceId = () => randomBytes(16).toString('hex');

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.writeUInt32BE(0x200, 12);
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 41) & 0xff;
  return out;
}

/** An image as MiniMax reads it: a data URL or a URL it downloads; described for the logs. */
async function readImage(value: unknown, field: string, role: string, limits: { minSide: number; maxSide: number; exclusiveMin: boolean }): Promise<MiniMaxImage> {
  if (typeof value !== 'string' || value === '') throw invalid(`${field} must be an image URL or a base64 data URL`);
  let bytes: Buffer;
  let form: MiniMaxImage['form'];
  if (/^https?:\/\//i.test(value)) {
    form = 'url';
    try {
      const res = await fetch(value, { signal: AbortSignal.timeout(10_000) });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      bytes = Buffer.from(await res.arrayBuffer());
    } catch {
      throw invalid(`${field} could not be downloaded`);
    }
  } else {
    const m = /^data:image\/(jpeg|jpg|png|webp);base64,/i.exec(value.slice(0, 40));
    if (!m) throw invalid(`${field} must be an image URL or a data URL such as data:image/jpeg;base64,...`);
    form = 'data';
    bytes = Buffer.from(value.slice(m[0].length), 'base64');
  }
  let meta: Metadata;
  try {
    meta = await sharp(bytes).metadata();
  } catch {
    throw invalid(`${field} is not a decodable image`);
  }
  if (meta.format !== 'jpeg' && meta.format !== 'png' && meta.format !== 'webp') throw invalid(`${field} must be JPG, JPEG, PNG or WebP`);
  if (bytes.length >= 20 * 1024 * 1024) throw invalid(`${field} must be smaller than 20MB`);
  const width = meta.width ?? 0;
  const height = meta.height ?? 0;
  const short = Math.min(width, height);
  if ((limits.exclusiveMin ? short <= limits.minSide : short < limits.minSide) || Math.max(width, height) > limits.maxSide) {
    throw invalid(`${field} of ${width}x${height} px: the short side must be ${limits.exclusiveMin ? 'greater than' : 'at least'} ${limits.minSide} px`);
  }
  const ratio = width / Math.max(1, height);
  if (ratio < 0.4 || ratio > 2.5) throw invalid(`${field} of ${width}x${height} px: the aspect ratio must be between 2:5 and 5:2`);
  return { role, form, mimeType: `image/${meta.format}`, width, height, bytes: bytes.length };
}

const V1_IMAGE = { minSide: 300, maxSide: Number.POSITIVE_INFINITY, exclusiveMin: true };
const V2_IMAGE = { minSide: 256, maxSide: 5760, exclusiveMin: false };

// ---------------------------------------------------------------------------------------------
// The fake

export async function startMiniMaxFake(options: MiniMaxFakeOptions = {}): Promise<MiniMaxFake> {
  const keys = new Set(options.apiKeys ?? ['mm-test']);
  const permitted = new Map<string, Set<string>>();
  const emptyBalance = new Set<string>();
  const queueMs = options.queueMs ?? 60;
  const jobDurationMs = options.jobDurationMs ?? 300;
  const video = mp4Bytes(options.videoBytes ?? 36 * 1024);
  const signKey = randomBytes(16);
  const tasks = new Map<string, MiniMaxFakeTask>();
  const byFile = new Map<string, MiniMaxFakeTask>();
  const counts: Record<MiniMaxRoute, number> = { submit: 0, poll: 0, retrieve: 0, cdn: 0 };
  let seq = 0;
  let fake!: MiniMaxFake;
  /** Faults whose HTTP status the test gave (`errorNext`'s `status`): a v2 envelope keeps it. */
  const chosenStatus = new WeakSet<Fault>();

  const sign = (path: string, expires: number) => createHmac('sha1', signKey).update(`GET\n${expires}\n${path}`).digest('base64');

  // The object storage behind `download_url`: another origin, answering like Aliyun OSS.
  const cdn = await startFakeServer(async (req, res, recorded, self) => {
    counts.cdn++;
    if (req.headers.authorization !== undefined) fake.cdnSawAuth++;
    if (await applyFault(res, self.faults.take('cdn'))) return;
    const m = /^\/prod\/\d{8}\/(\d+)\.mp4$/.exec(recorded.path);
    const task = m ? byFile.get(m[1]!) : undefined;
    const ossError = (status: number, code: string, message: string) => {
      const xml = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${message}</Message><RequestId>${traceId()}</RequestId></Error>`;
      res.writeHead(status, { 'content-type': 'application/xml', 'content-length': String(Buffer.byteLength(xml)) });
      res.end(xml);
    };
    if (!task) return ossError(404, 'NoSuchKey', 'The specified key does not exist.');
    const expires = Number(recorded.query.get('Expires'));
    if (recorded.query.get('Signature') !== sign(recorded.path, expires)) return ossError(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided.');
    if (task.expired || !(expires * 1000 > Date.now())) return ossError(403, 'AccessDenied', 'Request has expired.');
    task.downloads++;
    res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(video.length) });
    res.end(video);
  });

  /** A signed link to the task's video, valid `urlTtlMs` from now. */
  const linkOf = (task: MiniMaxFakeTask): string => {
    const day = new Date(task.createdAt).toISOString().slice(0, 10).replace(/-/g, '');
    const path = `/prod/${day}/${task.fileId}.mp4`;
    const expires = Math.floor((Date.now() + fake.urlTtlMs) / 1000);
    return `${cdn.url}${path}?${new URLSearchParams({ Expires: String(expires), OSSAccessKeyId: 'LTAI5tMiniMaxFakeKey', Signature: sign(path, expires) })}`;
  };

  const answer = (res: ServerResponse, body: Record<string, unknown>, status = 200, headers: Record<string, string> = {}) => sendJson(res, status, body, { 'trace-id': traceId(), ...headers });
  const baseResp = (code: number, message: string) => ({ base_resp: { status_code: code, status_msg: message } });
  const ok = baseResp(0, 'success');

  const authenticate = (req: IncomingMessage): string => {
    const header = req.headers.authorization;
    if (!header) throw new MiniMaxError(1004);
    const key = /^Bearer\s+(\S+)$/.exec(header)?.[1];
    if (!key || !keys.has(key)) throw new MiniMaxError(2049);
    return key;
  };

  const server = await startFakeServer(async (req, res, recorded, self) => {
    const route = routeOf(recorded.method, recorded.path);
    if (!route) {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('404 page not found');
      return;
    }
    try {
      const apiKey = authenticate(req);
      counts[route.name]++;
      const fault = self.faults.take(route.name);
      if (await applyFault(res, route.protocol === 'v2' ? asV2(fault) : fault)) return;
      switch (route.name) {
        case 'submit': {
          const task = route.protocol === 'v1' ? await createV1(recorded, apiKey) : await createV2(recorded, apiKey);
          return answer(res, route.protocol === 'v1' ? { task_id: task.id, ...ok } : { task_id: task.id });
        }
        case 'poll':
          return route.protocol === 'v1' ? queryV1(res, apiKey, recorded.query.get('task_id') ?? '') : queryV2(res, apiKey, route.id ?? '');
        case 'retrieve':
          return retrieve(res, apiKey, recorded.query.get('file_id') ?? '');
      }
    } catch (err) {
      if (!(err instanceof MiniMaxError)) throw err;
      if (route.protocol === 'v2' && fake.v2Errors === 'error') {
        const refusal = v2Envelope(err.code, err.message);
        return answer(res, refusal.body, refusal.status);
      }
      // A failed v1 create still names its (empty) task id (ASSUMPTION).
      return answer(res, { ...(route.name === 'submit' && route.protocol === 'v1' && { task_id: '' }), ...baseResp(err.code, err.message) });
    }
  });

  /** An injected base_resp refusal as v2 answers it (see the header); other faults as they are. */
  function asV2(fault: Fault | undefined): Fault | undefined {
    const base = (fault?.body as { base_resp?: { status_code: number; status_msg: string } } | undefined)?.base_resp;
    if (!fault || fake.v2Errors !== 'error' || !base || base.status_code === 0) return fault;
    // rateLimitNext's HTTP 429 stands for the edge; errorNext's status is the test's choice.
    const chosen = chosenStatus.has(fault) || fault.status !== 200 ? fault.status : undefined;
    const refusal = v2Envelope(base.status_code, base.status_msg, chosen);
    return { ...fault, status: refusal.status, body: refusal.body };
  }

  function checkAccount(apiKey: string, model: string): void {
    const allowed = permitted.get(apiKey);
    if (allowed && !allowed.has(model)) throw new MiniMaxError(2061);
    if (emptyBalance.has(apiKey)) throw new MiniMaxError(1008);
  }

  function newTask(apiKey: string, protocol: MiniMaxProtocol, model: string, prompt: string, fields: Omit<MiniMaxFakeTask, 'id' | 'protocol' | 'apiKey' | 'model' | 'prompt' | 'createdAt' | 'durationMs' | 'outcome' | 'expired' | 'polls' | 'retrieves' | 'downloads'>): MiniMaxFakeTask {
    if (prompt.includes('[minimax:sensitive]')) throw new MiniMaxError(1026);
    const planned = options.durationFor?.(prompt);
    const task: MiniMaxFakeTask = {
      id: `${Date.now() % 1e9}${String(++seq).padStart(6, '0')}`,
      protocol,
      apiKey,
      model,
      prompt,
      createdAt: Date.now(),
      durationMs: planned === 'never' ? Number.POSITIVE_INFINITY : (planned ?? jobDurationMs),
      outcome: prompt.includes('[minimax:sensitive-output]') ? 'sensitive' : prompt.includes('[minimax:fail]') ? 'fail' : prompt.includes('[minimax:expired]') ? 'expired' : 'ok',
      expired: false,
      polls: 0,
      retrieves: 0,
      downloads: 0,
      ...fields,
    };
    tasks.set(task.id, task);
    return task;
  }

  function flag(body: Record<string, unknown>, field: string): void {
    if (body[field] !== undefined && typeof body[field] !== 'boolean') throw invalid(`${field} must be a boolean`);
  }

  function integer(value: unknown, field: string, fallback: number): number {
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isInteger(value)) throw invalid(`${field} must be an integer`);
    return value;
  }

  async function createV1(recorded: RecordedRequest, apiKey: string): Promise<MiniMaxFakeTask> {
    const body = recorded.json;
    if (!isObject(body)) throw invalid('the request body must be a JSON object');
    if (typeof body.model !== 'string' || body.model === '') throw invalid('model is required');
    const spec = V1_MODELS[body.model];
    if (!spec) throw invalid(`unknown model '${body.model}'`);
    checkAccount(apiKey, body.model);
    for (const field of ['prompt_optimizer', 'fast_pretreatment', 'aigc_watermark']) flag(body, field);
    if (body.callback_url !== undefined && typeof body.callback_url !== 'string') throw invalid('callback_url must be a string');
    const prompt = body.prompt === undefined ? '' : body.prompt;
    if (typeof prompt !== 'string') throw invalid('prompt must be a string');
    if (prompt.length > 2000) throw invalid('prompt must not exceed 2000 characters');
    const resolution = body.resolution === undefined ? spec.defaultResolution : body.resolution;
    if (typeof resolution !== 'string' || !spec.tiers[resolution]) throw invalid(`resolution of ${body.model} must be one of ${Object.keys(spec.tiers).join(', ')}`);
    const duration = integer(body.duration, 'duration', 6);
    if (!spec.tiers[resolution]!.includes(duration)) throw invalid(`${body.model} at ${resolution} supports durations of ${spec.tiers[resolution]!.join(' or ')} seconds`);

    const images: MiniMaxImage[] = [];
    const described: Record<string, unknown> = { ...body };
    if (body.first_frame_image !== undefined) {
      if (!spec.firstFrame) throw invalid(`${body.model} does not take first_frame_image`);
      images.push(await readImage(body.first_frame_image, 'first_frame_image', 'first_frame', V1_IMAGE));
      described.first_frame_image = images.at(-1);
    }
    if (body.last_frame_image !== undefined) {
      if (!spec.lastFrame) throw invalid(`${body.model} does not take last_frame_image`);
      if (body.first_frame_image === undefined) throw invalid('last_frame_image requires first_frame_image');
      if (resolution === '512P') throw invalid('first and last frame video generation does not support 512P');
      images.push(await readImage(body.last_frame_image, 'last_frame_image', 'last_frame', V1_IMAGE));
      described.last_frame_image = images.at(-1);
    }
    if (body.subject_reference !== undefined) {
      if (!spec.subject) throw invalid(`${body.model} does not take subject_reference`);
      const refs = body.subject_reference;
      if (!Array.isArray(refs) || refs.length !== 1 || !isObject(refs[0]) || refs[0].type !== 'character' || !Array.isArray(refs[0].image) || refs[0].image.length !== 1) {
        throw invalid('subject_reference must be one {"type": "character", "image": [one image]}');
      }
      images.push(await readImage(refs[0].image[0], 'subject_reference.image', 'subject', V1_IMAGE));
      described.subject_reference = [{ type: 'character', image: [images.at(-1)] }];
    }
    const hasFirst = body.first_frame_image !== undefined;
    if (spec.subject && body.subject_reference === undefined) throw invalid(`${body.model} requires subject_reference`);
    if (spec.firstFrame && !spec.text && !hasFirst) throw invalid(`${body.model} requires first_frame_image`);
    if (spec.imageOnlyTiers.includes(resolution) && !hasFirst) throw invalid(`${resolution} of ${body.model} requires first_frame_image`);
    if (!hasFirst && body.subject_reference === undefined && prompt.trim() === '') throw invalid('prompt is required');
    return newTask(apiKey, 'v1', body.model, prompt, { body: described, images, duration, resolution });
  }

  async function createV2(recorded: RecordedRequest, apiKey: string): Promise<MiniMaxFakeTask> {
    const body = recorded.json;
    if (!isObject(body)) throw invalid('the request body must be a JSON object');
    if (typeof body.model !== 'string' || body.model === '') throw invalid('model is required');
    if (!V2_MODELS.has(body.model)) throw invalid(`unknown model '${body.model}'`);
    checkAccount(apiKey, body.model);
    flag(body, 'aigc_watermark');
    if (!Array.isArray(body.content) || body.content.length === 0) throw invalid('content is required');
    let prompt: string | undefined;
    const images: MiniMaxImage[] = [];
    const media = { reference_video: 0, reference_audio: 0 };
    const described: unknown[] = [];
    for (const [i, item] of body.content.entries()) {
      if (!isObject(item)) throw invalid(`content[${i}] must be an object`);
      if (item.type === 'text') {
        if (prompt !== undefined) throw invalid('content takes one text item');
        if (typeof item.text !== 'string' || item.text.trim() === '') throw invalid(`content[${i}].text is required`);
        // MiniMax's CLI (src/video/v2.ts @7af4b0ba): "MiniMax-H3 text content must not exceed 7000 characters".
        if (item.text.length > 7000) throw invalid(`content[${i}].text must not exceed 7000 characters`);
        prompt = item.text;
        described.push(item);
      } else if (item.type === 'image_url') {
        const role = item.role;
        if (role !== 'first_frame' && role !== 'last_frame' && role !== 'reference_image') throw invalid(`content[${i}].role must be first_frame, last_frame or reference_image`);
        if (!isObject(item.image_url)) throw invalid(`content[${i}].image_url.url is required`);
        images.push(await readImage(item.image_url.url, `content[${i}].image_url.url`, role, V2_IMAGE));
        described.push({ type: 'image_url', image_url: images.at(-1), role });
      } else if (item.type === 'video_url' || item.type === 'audio_url') {
        const role = item.type === 'video_url' ? 'reference_video' : 'reference_audio';
        if (item.role !== role) throw invalid(`content[${i}].role must be ${role}`);
        const inner = item[item.type];
        if (!isObject(inner) || typeof inner.url !== 'string' || !/^https?:\/\//.test(inner.url)) throw invalid(`content[${i}].${item.type}.url must be a URL`);
        media[role]++;
        described.push(item);
      } else throw invalid(`content[${i}].type must be text, image_url, video_url or audio_url`);
    }
    if (prompt === undefined) throw invalid('content needs a text item');
    const count = (role: string) => images.filter((im) => im.role === role).length;
    if (count('first_frame') > 1 || count('last_frame') > 1) throw invalid('content takes at most one first_frame and one last_frame');
    if (count('last_frame') > 0 && count('first_frame') === 0) throw invalid('last_frame requires first_frame');
    const frames = count('first_frame') + count('last_frame');
    const references = count('reference_image') + media.reference_video + media.reference_audio;
    if (frames > 0 && references > 0) throw invalid('frames and reference media cannot be used together');
    if (count('reference_image') > 9) throw invalid('at most 9 reference images');
    if (media.reference_video > 3 || media.reference_audio > 3) throw invalid('at most 3 reference videos and 3 reference audios');
    const resolution = body.resolution === undefined ? '768P' : body.resolution;
    if (typeof resolution !== 'string' || !V2_RESOLUTIONS.includes(resolution)) throw invalid(`resolution must be one of ${V2_RESOLUTIONS.join(', ')}`);
    const duration = integer(body.duration, 'duration', 5);
    if (duration < 4 || duration > 15) throw invalid('duration must be between 4 and 15 seconds');
    const textOnly = images.length === 0 && references === 0;
    if (body.ratio === undefined && textOnly) throw invalid('ratio is required for text to video');
    const ratio = body.ratio === undefined ? 'adaptive' : body.ratio;
    if (typeof ratio !== 'string' || !V2_RATIOS.includes(ratio)) throw invalid(`ratio must be one of ${V2_RATIOS.join(', ')}`);
    if (textOnly && ratio === 'adaptive') throw invalid('ratio adaptive is not supported for text to video');
    return newTask(apiKey, 'v2', body.model, prompt, { body: { ...body, content: described }, images, duration, resolution, ratio });
  }

  /** Where the task is now: `running` with its word, or its end. */
  function stateOf(task: MiniMaxFakeTask): { phase: 'preparing' | 'queued' | 'running' } | { phase: 'done' } {
    const age = Date.now() - task.createdAt;
    if (age < queueMs / 2) return { phase: 'preparing' };
    if (age < queueMs) return { phase: 'queued' };
    if (age < task.durationMs) return { phase: 'running' };
    if (task.outcome === 'ok' && task.fileId === undefined) {
      task.fileId = `${Date.now() % 1e6}${String(seq++).padStart(9, '0')}`;
      byFile.set(task.fileId, task);
      if (task.protocol === 'v2') task.url = linkOf(task);
    }
    return { phase: 'done' };
  }

  /** The output's pixel size: the tier's height, the first frame's ratio if there is one, else 16:9 or the ratio asked. */
  function outputSize(task: MiniMaxFakeTask): { width: number; height: number } {
    const height = HEIGHTS[task.resolution] ?? 720;
    const frame = task.images.find((i) => i.role === 'first_frame');
    const [w, h] = frame ? [frame.width, frame.height] : task.ratio && task.ratio !== 'adaptive' ? task.ratio.split(':').map(Number) : task.resolution === '768P' ? [1366, 768] : [16, 9];
    return { width: Math.round((height * w!) / h! / 2) * 2, height };
  }

  function queryV1(res: ServerResponse, apiKey: string, id: string): void {
    const task = tasks.get(id);
    // ASSUMPTION: a task of another account, or none, is an invalid parameter.
    if (!task || task.apiKey !== apiKey || task.protocol !== 'v1') throw invalid(`task_id ${id} not found`);
    task.polls++;
    const state = stateOf(task);
    const word = { preparing: 'Preparing', queued: 'Queueing', running: 'Processing' } as const;
    if (state.phase !== 'done') return answer(res, { task_id: task.id, status: word[state.phase], file_id: '', ...ok });
    if (task.outcome === 'ok') {
      const { width, height } = outputSize(task);
      return answer(res, { task_id: task.id, status: 'Success', file_id: task.fileId, video_width: width, video_height: height, ...ok });
    }
    const reason = task.outcome === 'sensitive' ? baseResp(1027, MESSAGES[1027]!) : ok;
    return answer(res, { task_id: task.id, status: fake.failWord, file_id: '', ...reason });
  }

  function queryV2(res: ServerResponse, apiKey: string, id: string): void {
    const task = tasks.get(id);
    if (!task || task.apiKey !== apiKey || task.protocol !== 'v2') throw invalid(`task ${id} not found`);
    task.polls++;
    const state = stateOf(task);
    const view: Record<string, unknown> = {
      id: task.id,
      model: task.model,
      created_at: Math.floor(task.createdAt / 1000),
      updated_at: Math.floor(Date.now() / 1000),
      resolution: task.resolution,
      duration: task.duration,
      ratio: task.ratio,
      task_type: 'generation',
      modality: 'video',
    };
    if (state.phase !== 'done') return answer(res, { task: { ...view, status: state.phase === 'running' ? 'running' : 'queued' } });
    if (task.outcome === 'ok') {
      const images = task.images.length;
      // Each query signs the link anew (see the header); the last one is kept for the tests.
      task.url = linkOf(task);
      return answer(res, { task: { ...view, status: 'succeeded', content: { url: task.url }, usage: { total_seconds: task.duration, output_seconds: task.duration, input_seconds: 0, input_image_count: images } } });
    }
    if (task.outcome === 'expired') return answer(res, { task: { ...view, status: 'expired' } });
    const error = task.outcome === 'sensitive' ? { code: '1027', message: MESSAGES[1027] } : { code: '1000', message: MESSAGES[1000] };
    return answer(res, { task: { ...view, status: 'failed', error } });
  }

  function retrieve(res: ServerResponse, apiKey: string, fileId: string): void {
    const task = byFile.get(fileId);
    // ASSUMPTION: an unknown file, or another account's, is an invalid parameter.
    if (!task || task.apiKey !== apiKey || task.protocol !== 'v1') throw invalid(`file_id ${fileId} not found`);
    task.retrieves++;
    const file = { file_id: Number(fileId), bytes: video.length, created_at: Math.floor((task.createdAt + task.durationMs) / 1000), filename: 'output.mp4', purpose: 'video_generation', download_url: linkOf(task) };
    return answer(res, { file, ...ok });
  }

  const faultBody = (route: MiniMaxRoute, code: number, message = MESSAGES[code] ?? 'unknown error') => (route === 'cdn' ? {} : baseResp(code, message));

  fake = Object.assign(server, {
    cdnUrl: cdn.url,
    tasks,
    counts,
    urlTtlMs: options.urlTtlMs ?? 9 * 3_600_000,
    failWord: options.failWord ?? 'Fail',
    v2Errors: options.v2Errors ?? 'error',
    cdnSawAuth: 0,
    permitModels(apiKey: string, models: string[] | undefined) {
      if (models) permitted.set(apiKey, new Set(models));
      else permitted.delete(apiKey);
    },
    setBalance(apiKey: string, state: 'ok' | 'empty') {
      if (state === 'empty') emptyBalance.add(apiKey);
      else emptyBalance.delete(apiKey);
    },
    rateLimitNext(route: MiniMaxRoute, seconds?: number, times = 1) {
      const queue = route === 'cdn' ? cdn.faults : server.faults;
      const headers: Record<string, string> = { 'trace-id': traceId(), ...(seconds !== undefined && { 'retry-after': String(seconds) }) };
      queue.push(route, { status: seconds === undefined && route !== 'cdn' ? 200 : 429, body: faultBody(route, 1002), headers }, times);
    },
    serverErrorNext(route: MiniMaxRoute, times = 1) {
      // applyFault answers JSON; a proxy's page is enough for the adapter (not the envelope).
      if (route === 'cdn') cdn.faults.push(route, { status: 503, body: { Code: 'ServiceUnavailable' } }, times);
      else server.faults.push(route, { status: 502, body: '<html><body><h1>502 Bad Gateway</h1></body></html>' }, times);
    },
    errorNext(route: Exclude<MiniMaxRoute, 'cdn'>, code: number, opts: { status?: number; message?: string } = {}) {
      const fault: Fault = { status: opts.status ?? 200, body: baseResp(code, opts.message ?? MESSAGES[code] ?? 'unknown error'), headers: { 'trace-id': traceId() } };
      if (opts.status !== undefined) chosenStatus.add(fault);
      server.faults.push(route, fault);
    },
    expire(taskId: string) {
      const task = tasks.get(taskId);
      if (task) task.expired = true;
    },
    statusOf(taskId: string) {
      const task = tasks.get(taskId);
      if (!task) return undefined;
      const state = stateOf(task);
      if (state.phase !== 'done') return task.protocol === 'v1' ? { preparing: 'Preparing', queued: 'Queueing', running: 'Processing' }[state.phase] : state.phase === 'running' ? 'running' : 'queued';
      if (task.outcome === 'ok') return task.protocol === 'v1' ? 'Success' : 'succeeded';
      return task.protocol === 'v1' ? fake.failWord : task.outcome === 'expired' ? 'expired' : 'failed';
    },
    close: async () => {
      await cdn.close();
      server.server.closeAllConnections();
      await new Promise<void>((resolve) => server.server.close(() => resolve()));
    },
  }) as MiniMaxFake;
  return fake;
}

function routeOf(method: string, path: string): { name: Exclude<MiniMaxRoute, 'cdn'>; protocol: MiniMaxProtocol; id?: string } | undefined {
  if (method === 'POST' && path === '/v1/video_generation') return { name: 'submit', protocol: 'v1' };
  if (method === 'GET' && path === '/v1/query/video_generation') return { name: 'poll', protocol: 'v1' };
  if (method === 'GET' && path === '/v1/files/retrieve') return { name: 'retrieve', protocol: 'v1' };
  if (method === 'POST' && path === '/v2/video_generation') return { name: 'submit', protocol: 'v2' };
  const m = /^\/v2\/query\/video_generation\/([^/]+)$/.exec(path);
  if (method === 'GET' && m) return { name: 'poll', protocol: 'v2', id: decodeURIComponent(m[1]!) };
  return undefined;
}
