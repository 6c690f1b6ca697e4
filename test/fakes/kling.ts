/**
 * A fake Kling AI API (api-singapore.klingai.com), after ../shared/reference/upstream-apis.md §6
 * and §10.2, and Kling's own API documentation as copied (in Chinese, verbatim tables) at
 * WHQ25/rawgenai @ b3f9cef1c265a9d537d01e270cd39c8c90938dee, docs/research/kling/: common-info.md
 * (JWT and the error-code table), text-to-video.md, image-to-video.md, multi-image-to-video.md,
 * omni-video-o1.md, image-generation.md, capability-map.md, callback-protocol.md. Also read:
 * Kling's JWT sample (the same common-info.md), QuantumNous/new-api relay/channel/task/kling/adaptor.go
 * @ 070818b8 (the same JWT; failed tasks carry their reason in `task_status_msg`, `message` stays
 * "SUCCEED": new-api PR #2532; risk-controlled tasks answer an error code: PR #3148), ComfyUI
 * comfy_api_nodes/apis/kling.py @ 589b85e4 (omni `image_list` `{image_url, type}`, `sound`), and the
 * Comfy Router pages of kling-v3 / kling-v3-omni (docs.comfy.org: durations "3"–"15", omni std =
 * 720P and pro = 1080P, "an end frame alone is not supported", external_task_id unique per user).
 *
 *   POST {base}/v1/videos/{text2video|image2video|multi-image2video|omni-video}   create → task
 *   GET  {base}/v1/videos/{endpoint}/{task_id}                                      query one
 *   GET  {base}/v1/videos/{endpoint}?external_task_id=                              query one by external id
 *   GET  {base}/v1/videos/{endpoint}?pageNum=&pageSize=                             list
 *   POST {base}/v1/images/generations, GET {base}/v1/images/generations/{id}       images
 *   GET  {cdn}/kcdn/{file}?x-expires=<ms>&sig=<hmac>                               outputs (another
 *        origin; a link past its expiry, or one `expire()`d, answers 403 AccessDenied)
 *
 * Auth (§6.1): `Authorization: Bearer <JWT>` verified with `jose`: HS256 only, signed with the
 * secret key of the account its `iss` names, `exp` required. Refusals are HTTP 401 with the
 * documented codes: 1001 no Authorization, 1002 not a JWT / wrong algorithm / wrong signature /
 * no exp, 1000 an `iss` the fake does not know (ASSUMPTION: the table's generic 1000 for an unknown
 * access key), 1003 `nbf` in the future, 1004 `exp` past. Every token verified is recorded.
 *
 * Envelope `{code, message, request_id, data}` on every answer, ms timestamps, `code: 0` with
 * `message: "SUCCEED"`; errors with the HTTP status of Kling's table (400 1200/1201, 403 1103,
 * 404 1202/1203, 429 1100–1102 and 1302–1304, 401 1000–1004, 500/503/504 5000–5002).
 * `errorNext(route, code, {status})` answers any code with another status, e.g. HTTP 200: the
 * adapter must go by the code. A task that failed Kling's risk control is queried as HTTP 200 with
 * code 1301 and the failed task in `data` ([3P] new-api #3148; ASSUMPTION: the message text);
 * a task that failed otherwise is code 0, `task_status: failed` and the reason in `task_status_msg`
 * ([3P] new-api #2532).
 *
 * Validation (1201 unless said): `model_name` per endpoint (a name Kling does not have at all is
 * 404 1203), `mode` std|pro per model, `duration` a STRING of the model's values (a number is
 * refused), `aspect_ratio` 16:9 | 9:16 | 1:1 and never on image2video nor on omni-video with a
 * first frame (the documents list none there; ASSUMPTION: refused rather than ignored), `sound`
 * on|off only on 2.6+ models (2.6 std and 2.6 with `image_tail` silent only, capability map),
 * `negative_prompt` not on omni-video (not among its fields; ASSUMPTION: refused), `prompt` and
 * `negative_prompt` of at most 2500 characters each (text-to-video.md, image-to-video.md,
 * omni-video-o1.md, image-generation.md all say so; ASSUMPTION: counted as JavaScript string
 * length, UTF-16 units: the documents do not say how characters are counted), images as http(s)
 * URLs or RAW base64 (a `data:` prefix is refused) of a JPEG or PNG of at most 10 MB, at least
 * 300 px a side, ratio 1:2.5–2.5:1; image2video: `image`
 * required, `image_tail` only where the capability map has first+last frames; multi-image2video:
 * 1–4 `image_list[].image`; omni: `image_list[] {image_url, type?}` up to 7, an end frame only with
 * a first frame and at most 2 images then. `external_task_id` (an optional string on every video
 * create and on the image create: image-generation.md's "自定义任务ID，单用户下需要保证唯一性") is
 * unique per account: a second create with one, video or image, is 400 1201 (ASSUMPTION: Kling's
 * answer to a duplicate is not documented; the table's invalid-parameter code; ASSUMPTION: one
 * namespace for videos and images, "单用户" being the user); it is kept on the task and echoed in
 * `task_info.external_task_id` by the create and every query. The single-task query of each
 * endpoint, images included, is by task id in the path or by external_task_id, "two ways to query,
 * one or the other" (the documents' "与 external_task_id 二选一"; image-generation.md's query has
 * the same pair). Where the external id goes the documents do not say plainly: `task_id` is the one
 * they call a path parameter ("直接将值填写在请求路径中"), one copy lists both under the path
 * parameters, and third-party clients send `?external_task_id=` (e.g. XingRay/keling-sdk's Kotlin
 * client, an apidoc copy: "(Query Parameter)"); the official wording as copied by API resellers
 * (doc.aimanyi.top api-386109649) says only of `task_id` that it goes in the path. ASSUMPTION: by default the fake takes it as a query parameter
 * on the endpoint (`GET …/text2video?external_task_id=`), and in the path only the task id;
 * `externalIdLookup: 'path'` is the other reading: the path takes either id, and the query
 * parameter, unknown then, is ignored (the list is answered). An id that is no task → 404 1203
 * (ASSUMPTION for an unknown external id: as for an unknown task id), and a task that failed risk
 * control is answered 1301 with the task there too. Content the "risk control" refuses at create:
 * a prompt with `kling-block` → 400 1301.
 *
 * Accounts: `accounts[]` of access and secret keys; `permitModels(ak, models)` limits the model
 * names an account may use (others → 403 1103); `setResourcePack(ak, 'exhausted')` answers every
 * create 429 1102 (queries keep working: ASSUMPTION, they cost nothing). Rate limits
 * (`rateLimitNext`) are 429 1302 without a `Retry-After` header: Kling documents no rate-limit
 * header (§6.6); `retryAfter: true` adds one of the seconds given (an edge that might).
 *
 * Tasks: `submitted` until `processingAfterMs`, `processing` until `jobDurationMs` (per prompt:
 * `durationFor`), then by prompt: `kling-risk` → failed under risk control, `kling-fail` →
 * failed, else `succeed` with `task_result.videos[0] {id, url, duration}` (or images for image
 * tasks, real PNGs of the asked ratio: ASSUMPTION: pixel sizes, Kling publishes none; 1k ≈ 1 MP,
 * 2k ≈ 4 MP). Callbacks are not sent (the adapter polls).
 *
 * Faults per route (`submit`, `poll`, `image-submit`, `image-poll`, `cdn`) through
 * `faults.push(route, fault)` (checked after auth), `rateLimitNext`, `serverErrorNext`, `errorNext`;
 * `delayAnswerNext(route, ms)` carries a create out at once and answers it late (a caller that gives
 * up meanwhile); `createLateNext(route, ms)` carries it out only `ms` after it arrived and never
 * answers it (a Kling still at work on a create its caller gave up on, whose task shows up after the
 * caller first looked for it). Logs: `tasks` (with each create body, images described), `tokens`, `authRefusals`,
 * `counts`. Decisions the documents leave open are marked `ASSUMPTION:`.
 */
import { createHash, createHmac, randomBytes, randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { decodeJwt, errors as joseErrors, jwtVerify } from 'jose';
import sharp, { type Metadata } from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type KlingVideoEndpoint = 'text2video' | 'image2video' | 'multi-image2video' | 'omni-video';
export type KlingRoute = 'submit' | 'poll' | 'image-submit' | 'image-poll' | 'cdn';

export interface KlingAccount {
  accessKey: string;
  secretKey: string;
}

export interface KlingImageInfo {
  /** `base64` or `url`. */
  form: 'base64' | 'url';
  mimeType?: string;
  width?: number;
  height?: number;
  bytes?: number;
}

export interface KlingFakeTask {
  taskId: string;
  kind: 'video' | 'image';
  endpoint: KlingVideoEndpoint | 'images';
  accessKey: string;
  externalTaskId?: string;
  modelName: string;
  mode?: string;
  duration?: string;
  aspectRatio?: string;
  sound?: string;
  prompt: string;
  negativePrompt?: string;
  resolution?: string;
  n?: number;
  image?: KlingImageInfo;
  imageTail?: KlingImageInfo;
  imageList: (KlingImageInfo & { type?: string })[];
  createdAt: number;
  outcome: 'ok' | 'risk' | 'fail';
  durationMs: number;
  files: string[];
  expired: boolean;
  downloads: number;
  queries: number;
  /** Every field of the create body, images replaced by their description. */
  body: Record<string, unknown>;
}

export interface KlingToken {
  iss: string;
  exp: number;
  nbf?: number;
  receivedAt: number;
  token: string;
}

export interface KlingFakeOptions {
  accounts?: KlingAccount[];
  /** How long a task stays `submitted` (default 50 ms). */
  processingAfterMs?: number;
  /** How long a task runs in all (default 300 ms). */
  jobDurationMs?: number;
  durationFor?: (prompt: string) => number | 'never' | undefined;
  /** How long an output link stays valid (default one hour). */
  urlTtlMs?: number;
  /** Bytes of a video (default 32 KiB). */
  videoBytes?: number;
  /**
   * Where the single-task query takes an external_task_id: `query` (default: `?external_task_id=`
   * on the endpoint; the path takes task ids only) or `path` (the path takes either; the query
   * parameter is ignored and the list answered).
   */
  externalIdLookup?: 'query' | 'path';
}

export interface KlingFake extends FakeServer {
  cdnUrl: string;
  tasks: Map<string, KlingFakeTask>;
  tokens: KlingToken[];
  /** Every refused token: the code answered and when. */
  authRefusals: { code: number; at: number }[];
  counts: Record<KlingRoute, number>;
  permitModels(accessKey: string, models: string[] | undefined): void;
  setResourcePack(accessKey: string, state: 'ok' | 'exhausted'): void;
  /** The next `times` requests of `route` get 429 1302 (with `Retry-After: seconds` only when `retryAfter` is true). */
  rateLimitNext(route: KlingRoute, seconds: number, opts?: { times?: number; retryAfter?: boolean; code?: 1302 | 1303 }): void;
  /** The next `times` requests of `route` get a 5xx (default 500 5000). */
  serverErrorNext(route: KlingRoute, status?: 500 | 503 | 504, times?: number): void;
  /** The next request of `route` gets `code` with the table's status, or `status` (e.g. 200). */
  errorNext(route: KlingRoute, code: number, opts?: { status?: number; message?: string }): void;
  /** The task's output links answer 403 from now on (expired). */
  expire(taskId: string): void;
  /** The next request of `route` is carried out at once but answered `ms` later (a slow network: the caller may give up first). */
  delayAnswerNext(route: KlingRoute, ms: number): void;
  /** The next create of `route` is carried out `ms` after it arrived and never answered: its connection is dropped then. */
  createLateNext(route: 'submit' | 'image-submit', ms: number): void;
}

// ---------------------------------------------------------------------------------------------
// Models (capability map, endpoint enums, Comfy Router pages for 3.x)

interface VideoModel {
  modes: string[];
  durations: string[];
  /** Modes with `sound` (2.6+: on|off). */
  soundModes: string[];
  /** Modes where image2video takes `image_tail`. */
  tailModes: string[];
  /** Whether image_tail and sound on may go together (2.6: silent only). */
  tailWithSound: boolean;
}

const FIVE_TEN = ['5', '10'];
const THREE_TO = (max: number) => Array.from({ length: max - 2 }, (_, i) => String(i + 3));
const model = (o: Partial<VideoModel>): VideoModel => ({ modes: ['std', 'pro'], durations: FIVE_TEN, soundModes: [], tailModes: [], tailWithSound: true, ...o });

const V1 = model({ tailModes: ['std', 'pro'] });
const V1_5 = model({ tailModes: ['pro'] });
const V1_6 = model({ tailModes: ['pro'] });
const V2_MASTER = model({});
const V2_1 = model({ tailModes: ['pro'] });
const V2_5_TURBO = model({ tailModes: ['pro'] });
const V2_6 = model({ soundModes: ['pro'], tailModes: ['pro'], tailWithSound: false });
// ASSUMPTION: Kling 3.0 takes an end frame in both modes, with or without sound.
const V3 = model({ durations: THREE_TO(15), soundModes: ['std', 'pro'], tailModes: ['std', 'pro'] });
const O1 = model({ durations: THREE_TO(10) });
const V3_OMNI = model({ durations: THREE_TO(15), soundModes: ['std', 'pro'] });

const VIDEO_MODELS: Record<KlingVideoEndpoint, Record<string, VideoModel>> = {
  text2video: { 'kling-v1': V1, 'kling-v1-6': V1_6, 'kling-v2-master': V2_MASTER, 'kling-v2-1-master': V2_MASTER, 'kling-v2-5-turbo': V2_5_TURBO, 'kling-v2-6': V2_6, 'kling-v3': V3 },
  image2video: {
    'kling-v1': V1,
    'kling-v1-5': V1_5,
    'kling-v1-6': V1_6,
    'kling-v2-master': V2_MASTER,
    'kling-v2-1': V2_1,
    'kling-v2-1-master': V2_MASTER,
    'kling-v2-5-turbo': V2_5_TURBO,
    'kling-v2-6': V2_6,
    'kling-v3': V3,
  },
  'multi-image2video': { 'kling-v1-6': V1_6 },
  'omni-video': { 'kling-video-o1': O1, 'kling-v3-omni': V3_OMNI },
};

/** Image models and their resolutions (capability map: v1/v1-5 1K, v2 1K/2K; ASSUMPTION: v2-1 and v3 as v2). */
const IMAGE_MODELS: Record<string, string[]> = { 'kling-v1': ['1k'], 'kling-v1-5': ['1k'], 'kling-v2': ['1k', '2k'], 'kling-v2-1': ['1k', '2k'], 'kling-v3': ['1k', '2k'] };
const IMAGE_RATIOS = ['16:9', '9:16', '1:1', '4:3', '3:4', '3:2', '2:3', '21:9'];
const VIDEO_RATIOS = ['16:9', '9:16', '1:1'];
const ALL_MODEL_NAMES = new Set([...Object.values(VIDEO_MODELS).flatMap((m) => Object.keys(m)), ...Object.keys(IMAGE_MODELS), 'kling-v2-new', 'kling-image-o1']);

/** HTTP status of each code (common-info.md). */
const STATUS_OF: Record<number, number> = {
  1000: 401, 1001: 401, 1002: 401, 1003: 401, 1004: 401,
  1100: 429, 1101: 429, 1102: 429, 1103: 403,
  1200: 400, 1201: 400, 1202: 404, 1203: 404,
  1300: 400, 1301: 400, 1302: 429, 1303: 429, 1304: 429,
  5000: 500, 5001: 503, 5002: 504,
};
// ASSUMPTION: the wording of each message (the documents give the meanings, in Chinese).
const MESSAGES: Record<number, string> = {
  1000: 'Authentication failed',
  1001: 'Authorization is empty',
  1002: 'Authorization is invalid',
  1003: 'Authorization is not yet valid',
  1004: 'Authorization has expired',
  1100: 'Account exception',
  1101: 'Account in arrears',
  1102: 'Resource pack exhausted or expired',
  1103: 'No permission to access the requested resource',
  1200: 'Invalid request parameters',
  1201: 'Invalid parameter',
  1202: 'Invalid request method',
  1203: 'Requested resource does not exist',
  1300: 'Platform policy triggered',
  1301: 'Content security policy triggered',
  1302: 'API request too fast, please slow down',
  1303: 'Concurrency or QPS exceeds the resource pack limit',
  1304: 'IP whitelist policy triggered',
  5000: 'Internal server error',
  5001: 'Service temporarily unavailable',
  5002: 'Internal server timeout',
};

class KlingError extends Error {
  constructor(
    readonly code: number,
    message = MESSAGES[code] ?? 'error',
    readonly status = STATUS_OF[code] ?? 400,
  ) {
    super(message);
  }
}
const invalid = (message: string) => new KlingError(1201, message);

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

const renderCache = new Map<string, Promise<Buffer>>();
function renderPng(width: number, height: number, seed: string): Promise<Buffer> {
  const key = `${width}x${height}:${seed}`;
  let png = renderCache.get(key);
  if (!png) {
    const h = createHash('sha256').update(seed).digest();
    png = sharp({ create: { width, height, channels: 3, background: { r: h[0]!, g: h[1]!, b: h[2]! } } }).png({ compressionLevel: 1 }).toBuffer();
    renderCache.set(key, png);
    if (renderCache.size > 32) renderCache.delete(renderCache.keys().next().value!);
  }
  return png;
}

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.writeUInt32BE(0x200, 12);
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 31) & 0xff;
  return out;
}

/** ASSUMPTION: pixel sizes of image results (multiples of 16, about 1 MP for 1k, 4 MP for 2k). */
function imageSize(ratio: string, resolution: string): { width: number; height: number } {
  const [w, h] = ratio.split(':').map(Number) as [number, number];
  const area = (resolution === '2k' ? 2048 : 1024) ** 2;
  const width = Math.round(Math.sqrt((area * w) / h) / 16) * 16;
  return { width, height: Math.round(width * (h / w) / 16) * 16 };
}

// ---------------------------------------------------------------------------------------------

export async function startKlingFake(options: KlingFakeOptions = {}): Promise<KlingFake> {
  const secrets = new Map((options.accounts ?? [{ accessKey: 'ak-test', secretKey: 'sk-test' }]).map((a) => [a.accessKey, a.secretKey]));
  const permitted = new Map<string, Set<string>>();
  const exhausted = new Set<string>();
  const processingAfterMs = options.processingAfterMs ?? 50;
  const jobDurationMs = options.jobDurationMs ?? 300;
  const urlTtlMs = options.urlTtlMs ?? 3_600_000;
  const externalIdLookup = options.externalIdLookup ?? 'query';
  const video = mp4Bytes(options.videoBytes ?? 32 * 1024);
  const signKey = randomBytes(16);
  const tasks = new Map<string, KlingFakeTask>();
  const files = new Map<string, { task: KlingFakeTask; kind: 'video' | 'image'; index: number }>();
  const tokens: KlingToken[] = [];
  const authRefusals: { code: number; at: number }[] = [];
  const counts: Record<KlingRoute, number> = { submit: 0, poll: 0, 'image-submit': 0, 'image-poll': 0, cdn: 0 };
  let seq = 0;
  const answerDelays = new Map<KlingRoute, number[]>();
  const answerDelay = async (route: KlingRoute) => {
    const ms = answerDelays.get(route)?.shift();
    if (ms) await new Promise((r) => setTimeout(r, ms));
  };
  const lateCreates = new Map<KlingRoute, number[]>();
  /** A create `createLateNext` holds: true once it was carried out late and its connection dropped. */
  const createLate = async (route: KlingRoute, res: ServerResponse, create: () => Promise<unknown>): Promise<boolean> => {
    const ms = lateCreates.get(route)?.shift();
    if (ms === undefined) return false;
    await new Promise((r) => setTimeout(r, ms));
    try {
      await create();
    } catch (err) {
      // Refused: nothing was created, and nobody is told.
      if (!(err instanceof KlingError)) throw err;
    }
    res.socket?.destroy();
    return true;
  };

  const sign = (file: string, expires: number) => createHmac('sha256', signKey).update(`${file}:${expires}`).digest('hex').slice(0, 32);

  // The CDN: another origin, answering like an object store (403 AccessDenied for a bad or expired signature).
  const cdn = await startFakeServer(async (_req, res, recorded, self) => {
    counts.cdn++;
    if (await applyFault(res, self.faults.take('cdn'))) return;
    const m = /^\/kcdn\/([A-Za-z0-9_-]+)\.(mp4|png)$/.exec(recorded.path);
    const file = m ? files.get(m[1]!) : undefined;
    const expires = Number(recorded.query.get('x-expires'));
    if (!file) {
      res.writeHead(404, { 'content-type': 'application/xml' });
      res.end('<?xml version="1.0"?><Error><Code>NoSuchKey</Code></Error>');
      return;
    }
    if (file.task.expired || !(expires > Date.now()) || recorded.query.get('sig') !== sign(m![1]!, expires)) {
      res.writeHead(403, { 'content-type': 'application/xml' });
      res.end('<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>');
      return;
    }
    file.task.downloads++;
    if (file.kind === 'video') {
      res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(video.length) });
      res.end(video);
      return;
    }
    const { width, height } = imageSize(file.task.aspectRatio ?? '16:9', file.task.resolution ?? '1k');
    const png = await renderPng(width, height, `${file.task.prompt}:${file.index}`);
    res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(png.length) });
    res.end(png);
  });

  const envelope = (code: number, message: string, data?: unknown) => ({ code, message, request_id: randomUUID(), ...(data !== undefined && { data }) });
  const answerError = (res: ServerResponse, err: KlingError, headers: Record<string, string> = {}) => sendJson(res, err.status, envelope(err.code, err.message), headers);
  const ok = (res: ServerResponse, data: unknown) => sendJson(res, 200, envelope(0, 'SUCCEED', data));

  async function authenticate(req: IncomingMessage): Promise<string> {
    const refuse = (code: number) => {
      authRefusals.push({ code, at: Date.now() });
      return new KlingError(code);
    };
    const header = req.headers.authorization;
    if (!header) throw refuse(1001);
    const token = /^Bearer (\S+)$/.exec(header)?.[1];
    if (!token) throw refuse(1002);
    let iss: unknown;
    try {
      iss = decodeJwt(token).iss;
    } catch {
      throw refuse(1002);
    }
    const secret = typeof iss === 'string' ? secrets.get(iss) : undefined;
    if (secret === undefined) throw refuse(1000);
    try {
      const { payload } = await jwtVerify(token, new TextEncoder().encode(secret), { algorithms: ['HS256'], requiredClaims: ['exp'], clockTolerance: 0 });
      tokens.push({ iss: iss as string, exp: payload.exp!, ...(payload.nbf !== undefined && { nbf: payload.nbf }), receivedAt: Date.now(), token });
      return iss as string;
    } catch (err) {
      if (err instanceof joseErrors.JWTExpired) throw refuse(1004);
      if (err instanceof joseErrors.JWTClaimValidationFailed && err.claim === 'nbf') throw refuse(1003);
      throw refuse(1002);
    }
  }

  let fake!: KlingFake;
  const server = await startFakeServer(async (req, res, recorded, self) => {
    const route = routeOf(req.method ?? 'GET', recorded.path);
    if (!route) return answerError(res, new KlingError(1202, `No route for ${req.method} ${recorded.path}`));
    try {
      const accessKey = await authenticate(req);
      counts[route.name]++;
      const fault = self.faults.take(route.name);
      if (await applyFault(res, fault)) return;
      switch (route.name) {
        case 'submit': {
          if (await createLate(route.name, res, () => createVideo(recorded, accessKey, route.endpoint!))) return;
          const data = await createVideo(recorded, accessKey, route.endpoint!);
          await answerDelay(route.name);
          return ok(res, data);
        }
        case 'image-submit': {
          if (await createLate(route.name, res, () => createImages(recorded, accessKey))) return;
          const data = await createImages(recorded, accessKey);
          await answerDelay(route.name);
          return ok(res, data);
        }
        case 'poll':
        case 'image-poll':
          return query(res, recorded, accessKey, route.endpoint ?? 'images', route.id);
      }
    } catch (err) {
      if (err instanceof KlingError) return answerError(res, err);
      throw err;
    }
  });

  function checkAccount(accessKey: string, modelName: string): void {
    if (!ALL_MODEL_NAMES.has(modelName)) throw new KlingError(1203, `model_name ${modelName} does not exist`);
    const allowed = permitted.get(accessKey);
    if (allowed && !allowed.has(modelName)) throw new KlingError(1103, `The account has no permission for model ${modelName}`);
    if (exhausted.has(accessKey)) throw new KlingError(1102);
  }

  function text(body: Record<string, unknown>, field: string, required: boolean): string | undefined {
    const value = body[field];
    if (value === undefined || value === null || value === '') {
      if (required) throw invalid(`${field} is required`);
      return undefined;
    }
    if (typeof value !== 'string') throw invalid(`${field} must be a string`);
    if (value.length > 2500) throw invalid(`${field} must not exceed 2500 characters`);
    return value;
  }

  async function image(value: unknown, field: string): Promise<KlingImageInfo> {
    if (typeof value !== 'string' || value === '') throw invalid(`${field} is required`);
    if (/^https?:\/\//i.test(value)) return { form: 'url' };
    // image-to-video.md: Base64 without the `data:image/png;base64,` prefix.
    if (value.startsWith('data:')) throw invalid(`${field}: base64 must not carry a data: prefix`);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(value)) throw invalid(`${field} is neither a URL nor base64`);
    const buffer = Buffer.from(value, 'base64');
    let meta: Metadata;
    try {
      meta = await sharp(buffer).metadata();
    } catch {
      throw invalid(`${field} is not a decodable image`);
    }
    if (meta.format !== 'png' && meta.format !== 'jpeg') throw invalid(`${field} must be jpg, jpeg or png`);
    if (buffer.length > 10 * 1024 * 1024) throw invalid(`${field} must not exceed 10MB`);
    const width = meta.width ?? 0;
    const height = meta.height ?? 0;
    if (Math.min(width, height) < 300) throw invalid(`${field} width and height must be at least 300px`);
    if (Math.max(width, height) / Math.min(width, height) > 2.5) throw invalid(`${field} aspect ratio must be between 1:2.5 and 2.5:1`);
    return { form: 'base64', mimeType: `image/${meta.format}`, width, height, bytes: buffer.length };
  }

  function newTask(accessKey: string, kind: 'video' | 'image', endpoint: KlingFakeTask['endpoint'], body: Record<string, unknown>, prompt: string, extra: Partial<KlingFakeTask>): KlingFakeTask {
    const external = body.external_task_id;
    if (external !== undefined && typeof external !== 'string') throw invalid('external_task_id must be a string');
    if (typeof external === 'string' && [...tasks.values()].some((t) => t.accessKey === accessKey && t.externalTaskId === external)) {
      throw invalid(`external_task_id ${external} already exists`);
    }
    const planned = options.durationFor?.(prompt);
    const task: KlingFakeTask = {
      taskId: `${Date.now()}${String(++seq).padStart(6, '0')}`,
      kind,
      endpoint,
      accessKey,
      ...(typeof external === 'string' && { externalTaskId: external }),
      modelName: String(body.model_name),
      prompt,
      imageList: [],
      createdAt: Date.now(),
      outcome: prompt.includes('kling-risk') ? 'risk' : prompt.includes('kling-fail') ? 'fail' : 'ok',
      durationMs: planned === 'never' ? Number.POSITIVE_INFINITY : (planned ?? jobDurationMs),
      files: [],
      expired: false,
      downloads: 0,
      queries: 0,
      body,
      ...extra,
    };
    tasks.set(task.taskId, task);
    return task;
  }

  async function createVideo(recorded: RecordedRequest, accessKey: string, endpoint: KlingVideoEndpoint): Promise<unknown> {
    const body = recorded.json;
    if (!isObject(body)) throw new KlingError(1200, 'Request body must be JSON');
    const defaults: Record<KlingVideoEndpoint, string> = { text2video: 'kling-v1', image2video: 'kling-v1', 'multi-image2video': 'kling-v1-6', 'omni-video': 'kling-v1' };
    const modelName = typeof body.model_name === 'string' ? body.model_name : defaults[endpoint];
    checkAccount(accessKey, modelName);
    const spec = VIDEO_MODELS[endpoint][modelName];
    if (!spec) throw invalid(`model_name ${modelName} is not supported by ${endpoint}`);
    const omni = endpoint === 'omni-video';
    const prompt = text(body, 'prompt', endpoint !== 'image2video') ?? '';
    if (omni && body.negative_prompt !== undefined) throw invalid('negative_prompt is not a parameter of omni-video');
    const negativePrompt = omni ? undefined : text(body, 'negative_prompt', false);
    if (prompt.includes('kling-block')) throw new KlingError(1301, 'The prompt triggered the content security policy');
    const mode = body.mode ?? (omni ? 'pro' : 'std');
    if (typeof mode !== 'string' || !spec.modes.includes(mode)) throw invalid(`mode ${String(mode)} is not supported by ${modelName}`);
    const duration = body.duration ?? '5';
    if (typeof duration !== 'string') throw invalid('duration must be a string');
    if (!spec.durations.includes(duration)) throw invalid(`duration ${duration} is not supported by ${modelName}; supported: ${spec.durations.join(', ')}`);
    const sound = body.sound;
    if (sound !== undefined) {
      if (sound !== 'on' && sound !== 'off') throw invalid('sound must be on or off');
      if (sound === 'on' && !spec.soundModes.includes(mode)) throw invalid(`sound is not supported by ${modelName} in ${mode} mode`);
    }
    const extra: Partial<KlingFakeTask> = { mode, duration, ...(typeof sound === 'string' && { sound }), ...(negativePrompt && { negativePrompt }) };
    let hasFirstFrame = false;
    if (endpoint === 'image2video') {
      extra.image = await image(body.image, 'image');
      hasFirstFrame = true;
      if (body.image_tail !== undefined) {
        if (!spec.tailModes.includes(mode)) throw invalid(`image_tail is not supported by ${modelName} in ${mode} mode`);
        if (sound === 'on' && !spec.tailWithSound) throw invalid(`image_tail is supported by ${modelName} only without sound`);
        extra.imageTail = await image(body.image_tail, 'image_tail');
      }
    }
    if (endpoint === 'multi-image2video') {
      const list = body.image_list;
      if (!Array.isArray(list) || list.length === 0 || list.length > 4) throw invalid('image_list must hold 1 to 4 images');
      extra.imageList = await Promise.all(list.map((item, i) => image(isObject(item) ? item.image : undefined, `image_list[${i}].image`)));
    }
    if (omni && body.image_list !== undefined) {
      const list = body.image_list;
      if (!Array.isArray(list) || list.length > 7) throw invalid('image_list must hold at most 7 images');
      extra.imageList = [];
      for (const [i, item] of list.entries()) {
        if (!isObject(item)) throw invalid(`image_list[${i}] must be an object`);
        const type = item.type;
        if (type !== undefined && type !== 'first_frame' && type !== 'end_frame') throw invalid(`image_list[${i}].type must be first_frame or end_frame`);
        extra.imageList.push({ ...(await image(item.image_url, `image_list[${i}].image_url`)), ...(typeof type === 'string' && { type }) });
      }
      const types = extra.imageList.map((x) => x.type);
      hasFirstFrame = types.includes('first_frame');
      if (types.includes('end_frame') && !hasFirstFrame) throw invalid('an end frame alone is not supported');
      if (types.includes('end_frame') && list.length > 2) throw invalid('an end frame is not supported with more than 2 images');
    }
    const ratio = body.aspect_ratio;
    if (ratio !== undefined) {
      if (endpoint === 'image2video') throw invalid('aspect_ratio is not a parameter of image2video');
      if (omni && hasFirstFrame) throw invalid('aspect_ratio is not supported with a first frame');
      if (typeof ratio !== 'string' || !VIDEO_RATIOS.includes(ratio)) throw invalid(`aspect_ratio must be one of ${VIDEO_RATIOS.join(', ')}`);
      extra.aspectRatio = ratio;
    } else if (omni && !hasFirstFrame) throw invalid('aspect_ratio is required without a first frame');
    const described = { ...body };
    for (const key of ['image', 'image_tail', 'image_list']) if (key in described) described[key] = key === 'image_list' ? extra.imageList : key === 'image' ? extra.image : extra.imageTail;
    const task = newTask(accessKey, 'video', endpoint, described, prompt, extra);
    return createdData(task);
  }

  async function createImages(recorded: RecordedRequest, accessKey: string): Promise<unknown> {
    const body = recorded.json;
    if (!isObject(body)) throw new KlingError(1200, 'Request body must be JSON');
    const modelName = typeof body.model_name === 'string' ? body.model_name : 'kling-v1';
    checkAccount(accessKey, modelName);
    const resolutions = IMAGE_MODELS[modelName];
    if (!resolutions) throw invalid(`model_name ${modelName} does not support text-to-image`);
    const prompt = text(body, 'prompt', true)!;
    if (prompt.includes('kling-block')) throw new KlingError(1301, 'The prompt triggered the content security policy');
    const resolution = body.resolution ?? '1k';
    if (typeof resolution !== 'string' || !resolutions.includes(resolution)) throw invalid(`resolution ${String(resolution)} is not supported by ${modelName}`);
    const n = body.n ?? 1;
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 9) throw invalid('n must be an integer from 1 to 9');
    const ratio = body.aspect_ratio ?? '16:9';
    if (typeof ratio !== 'string' || !IMAGE_RATIOS.includes(ratio)) throw invalid(`aspect_ratio must be one of ${IMAGE_RATIOS.join(', ')}`);
    const task = newTask(accessKey, 'image', 'images', { ...body }, prompt, { resolution, n, aspectRatio: ratio });
    return createdData(task);
  }

  const createdData = (task: KlingFakeTask) => ({
    task_id: task.taskId,
    task_status: 'submitted',
    task_info: task.externalTaskId === undefined ? {} : { external_task_id: task.externalTaskId },
    created_at: task.createdAt,
    updated_at: task.createdAt,
  });

  function link(task: KlingFakeTask, kind: 'video' | 'image', index: number): string {
    let id = task.files[index];
    if (id === undefined) {
      id = randomBytes(9).toString('base64url');
      task.files[index] = id;
      files.set(id, { task, kind, index });
    }
    const expires = task.createdAt + task.durationMs + urlTtlMs;
    return `${cdn.url}/kcdn/${id}.${kind === 'video' ? 'mp4' : 'png'}?x-expires=${expires}&sig=${sign(id, expires)}`;
  }

  function taskData(task: KlingFakeTask): { data: Record<string, unknown>; risk: boolean } {
    const elapsed = Date.now() - task.createdAt;
    const done = elapsed >= task.durationMs;
    const status = done ? (task.outcome === 'ok' ? 'succeed' : 'failed') : elapsed >= processingAfterMs ? 'processing' : 'submitted';
    const data: Record<string, unknown> = {
      task_id: task.taskId,
      task_status: status,
      task_status_msg: '',
      task_info: task.externalTaskId === undefined ? {} : { external_task_id: task.externalTaskId },
      created_at: task.createdAt,
      updated_at: done ? task.createdAt + Math.round(task.durationMs) : Math.max(task.createdAt, Date.now() - 1),
      task_result: {},
    };
    if (status === 'failed') data.task_status_msg = task.outcome === 'risk' ? 'Failure to pass the risk control system' : 'Video generation failed, please try again later';
    if (status === 'succeed') {
      data.final_unit_deduction = task.kind === 'video' ? (task.mode === 'pro' ? '3.5' : '2') : String(task.n ?? 1);
      data.watermark_info = { enabled: false };
      data.task_result =
        task.kind === 'video'
          ? { videos: [{ id: randomUUID(), url: link(task, 'video', 0), duration: task.duration === undefined ? '5.1' : `${Number(task.duration) + 0.1}` }] }
          : { images: Array.from({ length: task.n ?? 1 }, (_, i) => ({ index: i, url: link(task, 'image', i) })) };
    }
    return { data, risk: status === 'failed' && task.outcome === 'risk' };
  }

  function query(res: ServerResponse, recorded: RecordedRequest, accessKey: string, endpoint: KlingFakeTask['endpoint'], id: string | undefined): void {
    const mine = [...tasks.values()].filter((t) => t.accessKey === accessKey && t.endpoint === endpoint);
    const external = externalIdLookup === 'query' && id === undefined ? recorded.query.get('external_task_id') : null;
    if (id === undefined && external === null) {
      const page = Math.max(1, Number(recorded.query.get('pageNum') ?? 1));
      const size = Math.min(500, Math.max(1, Number(recorded.query.get('pageSize') ?? 30)));
      return ok(res, mine.reverse().slice((page - 1) * size, page * size).map((t) => taskData(t).data));
    }
    const task =
      external !== null ? mine.find((t) => t.externalTaskId === external) : (mine.find((t) => t.taskId === id) ?? (externalIdLookup === 'path' ? mine.find((t) => t.externalTaskId === id) : undefined));
    if (!task) return answerError(res, new KlingError(1203, `task ${external ?? id} does not exist`));
    task.queries++;
    const { data, risk } = taskData(task);
    // Risk control: the failed task comes with its code, at HTTP 200 ([3P] new-api #3148).
    if (risk) return sendJson(res, 200, envelope(1301, String(data.task_status_msg), data));
    ok(res, data);
  }

  const codeFault = (code: number, status?: number, message?: string, headers: Record<string, string> = {}): Fault => ({
    status: status ?? STATUS_OF[code] ?? 400,
    body: envelope(code, message ?? MESSAGES[code] ?? 'error'),
    headers,
  });

  fake = Object.assign(server, {
    cdnUrl: cdn.url,
    tasks,
    tokens,
    authRefusals,
    counts,
    permitModels(accessKey: string, models: string[] | undefined) {
      if (models === undefined) permitted.delete(accessKey);
      else permitted.set(accessKey, new Set(models));
    },
    setResourcePack(accessKey: string, state: 'ok' | 'exhausted') {
      if (state === 'exhausted') exhausted.add(accessKey);
      else exhausted.delete(accessKey);
    },
    rateLimitNext(route: KlingRoute, seconds: number, opts: { times?: number; retryAfter?: boolean; code?: 1302 | 1303 } = {}) {
      const headers: Record<string, string> = opts.retryAfter === true ? { 'retry-after': String(seconds) } : {};
      const code = opts.code ?? 1302;
      const fault = route === 'cdn' ? { status: 429, body: {}, headers } : codeFault(code, 429, undefined, headers);
      server.faults.push(route, fault, opts.times ?? 1);
    },
    serverErrorNext(route: KlingRoute, status: 500 | 503 | 504 = 500, times = 1) {
      const code = status === 500 ? 5000 : status === 503 ? 5001 : 5002;
      server.faults.push(route, route === 'cdn' ? { status, body: {} } : codeFault(code, status), times);
    },
    errorNext(route: KlingRoute, code: number, opts: { status?: number; message?: string } = {}) {
      server.faults.push(route, codeFault(code, opts.status, opts.message));
    },
    expire(taskId: string) {
      const task = tasks.get(taskId);
      if (task) task.expired = true;
    },
    delayAnswerNext(route: KlingRoute, ms: number) {
      answerDelays.set(route, [...(answerDelays.get(route) ?? []), ms]);
    },
    createLateNext(route: 'submit' | 'image-submit', ms: number) {
      lateCreates.set(route, [...(lateCreates.get(route) ?? []), ms]);
    },
  });
  // CDN faults go to the CDN's own queue.
  const push = server.faults.push.bind(server.faults);
  server.faults.push = (route: string, fault: Fault, times?: number) => (route === 'cdn' ? cdn.faults.push(route, fault, times) : push(route, fault, times));
  const closeMain = server.close;
  fake.close = async () => {
    await Promise.all([closeMain(), cdn.close()]);
  };
  return fake;
}

type Route = { name: KlingRoute; endpoint?: KlingVideoEndpoint; id?: string };

function routeOf(method: string, path: string): Route | undefined {
  let m: RegExpExecArray | null;
  if ((m = /^\/v1\/videos\/(text2video|image2video|multi-image2video|omni-video)(?:\/([^/]+))?$/.exec(path))) {
    const endpoint = m[1] as KlingVideoEndpoint;
    if (method === 'POST' && !m[2]) return { name: 'submit', endpoint };
    if (method === 'GET') return { name: 'poll', endpoint, ...(m[2] && { id: decodeURIComponent(m[2]) }) };
    return undefined;
  }
  if ((m = /^\/v1\/images\/generations(?:\/([^/]+))?$/.exec(path))) {
    if (method === 'POST' && !m[1]) return { name: 'image-submit' };
    if (method === 'GET') return { name: 'image-poll', ...(m[1] && { id: decodeURIComponent(m[1]) }) };
  }
  return undefined;
}
