/**
 * A fake Alibaba Cloud Model Studio (DashScope) video API: Wan, HappyHorse (and any other vendor
 * Model Studio hosts on the same endpoints), after ../shared/reference/upstream-apis.md §0 and §10.5,
 * with every "⚠ DISAGREE" and "UNVERIFIED" settled as written below.
 *
 *   POST {host}/api/v1/services/aigc/video-generation/video-synthesis   t2v, i2v, r2v (both bodies)
 *   POST {host}/api/v1/services/aigc/image2video/video-synthesis        keyframe models (`…-kf2v-…`)
 *   GET  {host}/api/v1/tasks/{task_id}                                   the task
 *   POST {host}/api/v1/tasks/{task_id}/cancel                            cancel (PENDING only)
 *   GET  {oss}/{region}/{file}.mp4?Expires=…&OSSAccessKeyId=…&Signature=…   results on another
 *        origin, valid `urlTtlMs` (24 h) after they were made; past that (or `expire()`d) 403 OSS XML
 *
 * Checked in vendor sources and where:
 *   - dashscope/dashscope-sdk-python @ c0d7a0b7174c1b24033be61cdb00dab45da93036:
 *     `dashscope/aigc/video_synthesis.py` (input fields img_url / first_frame_url / last_frame_url /
 *     media[]; MediaType first_frame | last_frame | reference_image | reference_video |
 *     reference_voice | video | first_clip | driving_audio; parameters size / duration / seed /
 *     prompt_extend / watermark / resolution / ratio; the SDK itself routes a model whose name
 *     contains `kf2v` to the `image2video` task path), `dashscope/client/base_api.py` (GET
 *     tasks/{id}; cancel is `POST tasks/{id}/cancel`, "Cancel PENDING task": the reference's
 *     UNVERIFIED cancel is confirmed), `dashscope/common/constants.py` (TaskStatus PENDING,
 *     SUSPENDED, SUCCEEDED, CANCELED, RUNNING, FAILED, UNKNOWN: the SDK also knows SUSPENDED, a
 *     non-terminal state; this fake never enters it), `dashscope/api_entities/http_request.py`
 *     (`X-DashScope-Async: enable`), `dashscope/common/utils.py` (error answers: top-level
 *     `code` / `message` / `request_id`).
 *   - Copies of Alibaba's own API references (help.aliyun.com/zh/model-studio/, stored in public
 *     repositories): "万相-图生视频API参考" (image-to-video-api-reference, updated 2026-02-10:
 *     legacy `img_url` as URL or `data:{MIME};base64,…`, 360–2000 px, ≤ 10 MB; resolutions and
 *     durations per model; `audio` switch only on wan2.6-i2v-flash; the failed task's `code` and
 *     `message` INSIDE `output`; UNKNOWN after 24 h), "万相-首尾帧生视频API参考（2.2）"
 *     (image-to-video-first-and-last-frames API: image2video endpoint, `first_frame_url` required,
 *     `last_frame_url` optional, 240–8000 px, ≤ 10 MB, base64 data URLs allowed, duration fixed at 5,
 *     kf2v-flash 480P/720P/1080P, wanx2.1-kf2v-plus 720P), the "管理异步任务" page (cancel answers
 *     `{"request_id"}`; anything not PENDING: 400 UnsupportedOperation "Failed to cancel the task,
 *     please confirm if the task is in PENDING status." — also in cnblogs/dashscope-sdk's recorded
 *     live answers, test/Cnblogs.DashScope.Sdk.UnitTests/RawHttpData), and the error-code table
 *     (copied in eolinker/apinto drivers/ai-provider/tongyi: 400 InvalidParameter /
 *     DataInspectionFailed / Arrearage, 401 InvalidApiKey, 403 AccessDenied / Model.AccessDenied /
 *     AccessDenied.Unpurchased, 404 ModelNotFound, 429 Throttling / Throttling.RateQuota /
 *     Throttling.AllocationQuota / PrepaidBillOverdue / PostpaidBillOverdue / CommodityNotPurchased,
 *     500 InternalError, 503 ModelUnavailable).
 *   - InvalidParameter.DataInspection, 400: Alibaba's status-code table
 *     (help.aliyun.com/zh/dashscope/return-status-code-description, as copied on public mirrors)
 *     gives it the message "The media format is not supported or incorrect for the data
 *     inspection." and says its meaning varies with the message; Model Studio's error-code page
 *     (help.aliyun.com/zh/model-studio/error-code, 400 InvalidParameter section, stored copies)
 *     lists them: "Failed to decode the image during the data inspection." (a corrupt image),
 *     "The media format is not supported or incorrect for the data inspection." (a format the model
 *     does not take, or a file that cannot be opened), and "Unable to download the media resource
 *     during the data inspection process." / "Download the media resource timed out…" (the service
 *     could not fetch the URL). This fake answers a URL it cannot fetch (or non-2xx) with the
 *     download message, bytes no image decoder reads with the decode message, and an image in a
 *     format Wan does not take (JPEG, PNG, BMP, WebP are listed in the Wan references: a GIF, say)
 *     with the table's format message, whether fetched or inline.
 *   - cnblogs/dashscope-sdk recorded answers: 401 `{"code":"InvalidApiKey","message":"No API-key
 *     provided.","request_id":…}` (auth-error-nosse, no Retry-After header).
 *   - ComfyUI comfy_api_nodes/nodes_wan.py @ a125cd84b054a57729b5eecab930ca9408719832: the legacy
 *     text-to-video `size` table (480P 832*480, 480*832, 624*624; 720P 1280*720, 720*1280, 960*960,
 *     1088*832, 832*1088; 1080P 1920*1080, 1080*1920, 1440*1440, 1632*1248, 1248*1632), `W*H` with
 *     an asterisk.
 *   - New protocol (wan2.7, HappyHorse): Alibaba's "Wan 2.7 - image-to-video API" page (docs corpus:
 *     "This API uses the new image-to-video protocol and supports only the wan2.7 model"), the Comfy
 *     Router schema of wan2.7 (docs.comfy.org: media types per model — wan2.7-i2v first_frame,
 *     last_frame, driving_audio, first_clip; wan2.7-r2v reference_image, reference_video; media URLs
 *     public HTTP/HTTPS or OSS temporary URLs), docs.apiyi.com's DashScope pass-through pages
 *     (`input.media` required for i2v, else "image-to-video model ... must provide an image"; media
 *     must be a URL the upstream GETs), 3P tables of HappyHorse 1.0/1.1 (3–15 s, 720P/1080P; ⚠ DISAGREE:
 *     one 3P table lists 480P on 1.1, while upstream-apis.md §10.5, Comfy's HappyHorse nodes and
 *     router docs, apiyi's pass-through pages and WaveSpeed list 720P/1080P only: this fake refuses
 *     480P on HappyHorse as on wan2.7; r2v 1–9 reference images, i2v frame ≥ 300 px and ratio 1:2.5–2.5:1, references ≥ 400 px
 *     short side, images ≤ 20 MB).
 *   - "Model not exist.": DashScope answers an unknown model (one its region does not serve)
 *     `{"code":"InvalidParameter","message":"Model not exist."}`, HTTP 400 in most reports and 404
 *     in one (⚠ DISAGREE: this fake answers 400; `modelNotExistStatus` makes it 404). A key of another
 *     region is 401 InvalidApiKey "Invalid API-key provided." (langgenius/dify-official-plugins
 *     #2182, modelstudioai/cli #206, NousResearch/hermes-agent #18904).
 *   - Missing `X-DashScope-Async`: "current user api does not support synchronous calls" (Alibaba's
 *     references). ASSUMPTION: HTTP 403 with code AccessDenied.
 *
 * ⚠ DISAGREE, the failed task's error: the reference puts `code`/`message` at the top level of
 * the task answer; Alibaba's own examples put them in `output`. `failedErrorIn` ('output', the
 * default, or 'top') chooses; the adapter must read both.
 *
 * Bodies. Which one a model takes follows Alibaba's split: the legacy protocol serves Wan 2.1–2.6
 * (`wan2.x-…`, `wanx2.1-…`), the new one (`input.media[]`) wan2.7, HappyHorse and the other vendors;
 * keyframe models (`…-kf2v-…`) live at the image2video endpoint. Per model (`MODELS` below):
 *   legacy t2v   `input.prompt`, `parameters.size` `W*H` of the model's tiers (an `x` is refused:
 *                "The size is not match"), `duration`
 *   legacy i2v   `input.img_url` (URL, or `data:image/…;base64,` — the only inputs that may be
 *                inline), `parameters.resolution` `480P|720P|1080P`, `duration`; no `size`
 *   keyframe     `input.first_frame_url` (required) and `last_frame_url` (URL or data URL),
 *                `parameters.resolution`, `duration` 5
 *   new          `input.media[] {type, url}` with the model's types (first_frame, last_frame,
 *                reference_image) and counts, `parameters.resolution`, `ratio` (not with a frame:
 *                ASSUMPTION, refused — the frame decides), `duration` in range, URLs only
 *                (ASSUMPTION: a data URL in media is refused as an invalid url)
 * Every media URL is really fetched (GET, `fetchTimeoutMs`) the way DashScope's data inspection
 * does at submit: a URL that cannot be fetched or answers non-2xx is 400
 * InvalidParameter.DataInspection "Unable to download…" (`reachable` says which URLs the upstream's
 * network reaches: a gateway DashScope cannot reach); an input (URL or inline) that is no image or
 * not JPEG, PNG, BMP or WebP is the same code with the decode or format message (above); a decoded
 * image outside the model's limits 400 InvalidParameter.
 * `negative_prompt` in `input`; `prompt_extend`, `watermark`, `audio` booleans (ASSUMPTION: like
 * every DashScope model, a parameter the model has no use for is ignored, not refused: `audio` on
 * silent models). Unknown `parameters` are ignored too. The input PNG "no transparency" rule of the
 * references is not modelled (they do not say how it fails).
 *
 * Accounts (`accounts`: key → region, the models it may use, arrears). The fake serves one region
 * (`region`, with the models it has: `models`, default all): a key of another region → 401
 * InvalidApiKey; a model this region lacks → 400 InvalidParameter "Model not exist."; a model the
 * account may not use → 403 AccessDenied.Unpurchased; an account in arrears → 400 Arrearage on
 * submit (ASSUMPTION: queries keep answering). `rateLimitNext` → 429 Throttling.RateQuota (no
 * Retry-After unless seconds are given: ASSUMPTION, DashScope documents none and a proxy may add
 * one), `quotaNext` → 429 Throttling.AllocationQuota, `serverErrorNext` → 500 InternalError.
 *
 * Tasks (UUID ids, valid `taskTtlMs` = 24 h, then UNKNOWN, as is an id the fake never issued):
 * PENDING for `pendingMs`, RUNNING for `runningMs`, then by prompt:
 *   `[ds:unsafe]`       FAILED DataInspectionFailed (the output failed content inspection)
 *   `[ds:fail]`         FAILED InternalError.Algo
 *   `[ds:bad-param]`    FAILED InvalidParameter (DashScope validates some fields after accepting:
 *                       a [3P] live report of wan2.7-t2v "Field required: input.prompt")
 *   `[ds:expire]`       UNKNOWN once RUNNING (as if its 24 hours ran out)
 *   `[ds:stay-pending]` / `[ds:stay-running]` never move on
 *   else SUCCEEDED with `output.video_url` (an OSS URL) and `usage`.
 * A prompt with `[ds:inspect]` is refused at submit: 400 DataInspectionFailed (input inspection).
 * Times are `YYYY-MM-DD HH:mm:ss.SSS`. Faults per route (`submit`, `poll`, `cancel`, `oss`) through
 * `faults.push(route, fault)`, checked after auth. Logs: `tasks` (body, model, endpoint, protocol,
 * every media input as fetched), `fetches`.
 */
import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import sharp from 'sharp';
import { applyFault, sendJson, startFakeServer, type FakeServer, type Fault, type RecordedRequest } from './fake-http.ts';

export type DashScopeRegion = 'cn-beijing' | 'ap-southeast-1' | 'us-east-1';
export type DashScopeRoute = 'submit' | 'poll' | 'cancel' | 'oss';
export type DashScopeEndpoint = 'video-generation' | 'image2video';
export type DashScopeTaskStatus = 'PENDING' | 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'CANCELED' | 'UNKNOWN';
type Protocol = 'legacy-t2v' | 'legacy-i2v' | 'keyframe' | 'media';

export interface DashScopeAccount {
  /** The region whose console issued the key (default: the fake's). */
  region?: DashScopeRegion;
  /** Models the account may use (default: all the region has). */
  models?: string[];
  /** In arrears: submits answer 400 Arrearage. */
  arrears?: boolean;
}

interface ImageLimits {
  minSide: number;
  maxSide: number;
  maxBytes: number;
  /** Longest side over shortest, at most. */
  maxRatio: number;
}

interface ModelSpec {
  protocol: Protocol;
  resolutions: string[];
  durations: [number, number];
  /** Legacy t2v: the sizes of each resolution tier. */
  sizes?: Record<string, string[]>;
  /** New protocol: the ratios it takes (absent: the frame decides). */
  ratios?: string[];
  /** New protocol: media types and how many of each. */
  media?: Partial<Record<string, { min: number; max: number }>>;
  images: ImageLimits;
  /** Whether the output has sound (usage `audio`), and whether `audio: false` silences it. */
  audio: 'none' | 'always' | 'switch';
}

const SIZES: Record<string, string[]> = {
  '480P': ['832*480', '480*832', '624*624'],
  '720P': ['1280*720', '720*1280', '960*960', '1088*832', '832*1088'],
  '1080P': ['1920*1080', '1080*1920', '1440*1440', '1632*1248', '1248*1632'],
};
const pick = (...tiers: string[]) => Object.fromEntries(tiers.map((t) => [t, SIZES[t]!]));
const LEGACY_I2V: ImageLimits = { minSide: 360, maxSide: 2000, maxBytes: 10 * 1024 * 1024, maxRatio: 2000 / 360 };
const KEYFRAME: ImageLimits = { minSide: 240, maxSide: 8000, maxBytes: 10 * 1024 * 1024, maxRatio: 8000 / 240 };
const WAN27: ImageLimits = { minSide: 240, maxSide: 8000, maxBytes: 20 * 1024 * 1024, maxRatio: 8 };
const HAPPYHORSE_FRAME: ImageLimits = { minSide: 300, maxSide: 8000, maxBytes: 20 * 1024 * 1024, maxRatio: 2.5 };
const HAPPYHORSE_REF: ImageLimits = { minSide: 400, maxSide: 8000, maxBytes: 20 * 1024 * 1024, maxRatio: 8 };
const RATIOS = ['16:9', '9:16', '1:1', '4:3', '3:4'];

/** What the fake knows of each model (the references above). */
export const MODELS: Record<string, ModelSpec> = {
  'wan2.2-t2v-plus': { protocol: 'legacy-t2v', resolutions: ['480P', '1080P'], durations: [5, 5], sizes: pick('480P', '1080P'), images: LEGACY_I2V, audio: 'none' },
  'wan2.5-t2v-preview': { protocol: 'legacy-t2v', resolutions: ['480P', '720P', '1080P'], durations: [5, 10], sizes: pick('480P', '720P', '1080P'), images: LEGACY_I2V, audio: 'always' },
  'wan2.6-t2v': { protocol: 'legacy-t2v', resolutions: ['720P', '1080P'], durations: [2, 15], sizes: pick('720P', '1080P'), images: LEGACY_I2V, audio: 'always' },
  'wan2.2-i2v-plus': { protocol: 'legacy-i2v', resolutions: ['480P', '1080P'], durations: [5, 5], images: LEGACY_I2V, audio: 'none' },
  'wan2.2-i2v-flash': { protocol: 'legacy-i2v', resolutions: ['480P', '720P', '1080P'], durations: [5, 5], images: LEGACY_I2V, audio: 'none' },
  'wan2.5-i2v-preview': { protocol: 'legacy-i2v', resolutions: ['480P', '720P', '1080P'], durations: [5, 10], images: LEGACY_I2V, audio: 'always' },
  'wan2.6-i2v-flash': { protocol: 'legacy-i2v', resolutions: ['720P', '1080P'], durations: [2, 15], images: LEGACY_I2V, audio: 'switch' },
  'wan2.2-kf2v-flash': { protocol: 'keyframe', resolutions: ['480P', '720P', '1080P'], durations: [5, 5], images: KEYFRAME, audio: 'none' },
  'wanx2.1-kf2v-plus': { protocol: 'keyframe', resolutions: ['720P'], durations: [5, 5], images: KEYFRAME, audio: 'none' },
  'wan2.7-t2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [2, 15], ratios: RATIOS, media: {}, images: WAN27, audio: 'always' },
  'wan2.7-i2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [2, 15], media: { first_frame: { min: 1, max: 1 }, last_frame: { min: 0, max: 1 } }, images: WAN27, audio: 'always' },
  'wan2.7-r2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [2, 15], ratios: RATIOS, media: { reference_image: { min: 1, max: 5 } }, images: WAN27, audio: 'always' },
  'happyhorse-1.1-t2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [3, 15], ratios: RATIOS, media: {}, images: HAPPYHORSE_FRAME, audio: 'always' },
  'happyhorse-1.1-i2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [3, 15], media: { first_frame: { min: 1, max: 1 } }, images: HAPPYHORSE_FRAME, audio: 'always' },
  'happyhorse-1.1-r2v': { protocol: 'media', resolutions: ['720P', '1080P'], durations: [3, 15], ratios: RATIOS, media: { reference_image: { min: 1, max: 9 } }, images: HAPPYHORSE_REF, audio: 'always' },
};

export interface DashScopeMediaInput {
  /** Where it was found: `img_url`, `first_frame_url`, `media[0]`… */
  field: string;
  /** The media type (new protocol), or the field's role. */
  type: string;
  kind: 'url' | 'data';
  url?: string;
  mimeType: string;
  width: number;
  height: number;
  bytes: number;
}

export interface DashScopeFakeTask {
  id: string;
  apiKey: string;
  model: string;
  endpoint: DashScopeEndpoint;
  protocol: Protocol;
  body: Record<string, unknown>;
  prompt: string;
  media: DashScopeMediaInput[];
  headers: IncomingMessage['headers'];
  createdAt: number;
  pendingMs: number;
  runningMs: number;
  outcome: 'succeeded' | 'unsafe' | 'fail' | 'bad-param' | 'expire';
  canceled: boolean;
  expired: boolean;
  file?: string;
  polls: number;
}

export interface DashScopeFakeOptions {
  region?: DashScopeRegion;
  /** Models this region serves (default: every model the fake knows). */
  models?: string[];
  accounts?: Record<string, DashScopeAccount>;
  pendingMs?: number;
  runningMs?: number;
  urlTtlMs?: number;
  taskTtlMs?: number;
  /** Where a failed task's code and message go (⚠ DISAGREE above). */
  failedErrorIn?: 'output' | 'top';
  /** The status of "Model not exist." (⚠ DISAGREE above). */
  modelNotExistStatus?: 400 | 404;
  /** How long the data inspection waits for a media URL. */
  fetchTimeoutMs?: number;
  videoBytes?: number;
}

export interface DashScopeFake extends FakeServer {
  region: DashScopeRegion;
  ossUrl: string;
  accounts: Map<string, DashScopeAccount>;
  tasks: Map<string, DashScopeFakeTask>;
  /** Every media URL the data inspection fetched, and what it got. */
  fetches: { url: string; status: number | 'unreachable' }[];
  urlTtlMs: number;
  failedErrorIn: 'output' | 'top';
  ossSawAuth: number;
  /** Which media URLs the upstream's network reaches (default all): a gateway behind a firewall reaches none. */
  reachable: (url: string) => boolean;
  statusOf(id: string): DashScopeTaskStatus | undefined;
  /** The task's result link (or any link the fake made) is gone from now on. */
  expireResult(idOrUrl: string): void;
  /** The task's 24 hours are over: it is UNKNOWN from now on. */
  expireTask(id: string): void;
  rateLimitNext(route: DashScopeRoute, retryAfterSeconds?: number, times?: number): void;
  quotaNext(route: DashScopeRoute, times?: number): void;
  serverErrorNext(route: DashScopeRoute, times?: number): void;
}

class DashScopeError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const invalid = (message: string) => new DashScopeError(400, 'InvalidParameter', message);
/** The data inspection's refusal of a media input; its message says which of its meanings (see the header). */
const inspection = (message: string) => new DashScopeError(400, 'InvalidParameter.DataInspection', message);
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** `2025-04-18 10:36:58.394`, as DashScope writes times. */
function stamp(ms: number): string {
  return new Date(ms).toISOString().replace('T', ' ').replace('Z', '');
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

interface StoredFile {
  data: Buffer;
  madeAt: number;
  expired: boolean;
}

export async function startDashScopeFake(options: DashScopeFakeOptions = {}): Promise<DashScopeFake> {
  const region = options.region ?? 'ap-southeast-1';
  const served = new Set(options.models ?? Object.keys(MODELS));
  const accounts = new Map(Object.entries(options.accounts ?? { 'sk-dashscope-test': {} }));
  const tasks = new Map<string, DashScopeFakeTask>();
  const files = new Map<string, StoredFile>();
  const fetches: DashScopeFake['fetches'] = [];
  const video = mp4Bytes(options.videoBytes ?? 48 * 1024);
  const signingKey = randomBytes(16);
  const fetchTimeoutMs = options.fetchTimeoutMs ?? 5000;
  let fake: DashScopeFake;

  const signature = (path: string, expires: string) => createHmac('sha1', signingKey).update(`GET\n${expires}\n${path}`).digest('base64');

  // The OSS bucket result URLs point to: another origin, which must never see the API key.
  const oss = await startFakeServer(async (req, res, recorded, self) => {
    if (req.headers.authorization !== undefined) fake.ossSawAuth++;
    if (await applyFault(res, self.faults.take('oss'))) return;
    const token = /^\/dashscope-result\/[a-z0-9-]+\/([a-f0-9]+)\.mp4$/.exec(recorded.path)?.[1];
    const file = token ? files.get(token) : undefined;
    const refuse = (status: number, code: string, message: string) => {
      const xml = `<?xml version="1.0" encoding="UTF-8"?>\n<Error>\n  <Code>${code}</Code>\n  <Message>${message}</Message>\n  <RequestId>${randomBytes(12).toString('hex').toUpperCase()}</RequestId>\n</Error>`;
      res.writeHead(status, { 'content-type': 'application/xml', 'content-length': String(Buffer.byteLength(xml)) });
      res.end(xml);
    };
    if (!file) return refuse(404, 'NoSuchKey', 'The specified key does not exist.');
    const expires = recorded.query.get('Expires') ?? '';
    if (recorded.query.get('Signature') !== signature(recorded.path, expires)) return refuse(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided.');
    if (file.expired || Date.now() > Number(expires) * 1000 || Date.now() - file.madeAt > fake.urlTtlMs) return refuse(403, 'AccessDenied', 'Request has expired.');
    res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(file.data.length) });
    res.end(file.data);
  });

  const resultUrl = (token: string): string => {
    const file = files.get(token)!;
    const path = `/dashscope-result/${region}/${token}.mp4`;
    const expires = String(Math.floor((file.madeAt + fake.urlTtlMs) / 1000) + 1);
    const query = new URLSearchParams({ Expires: expires, OSSAccessKeyId: 'LTAI5tFakeKeyId', Signature: signature(path, expires) });
    return `${oss.url}${path}?${query}`;
  };

  const answerError = (res: ServerResponse, err: DashScopeError) => sendJson(res, err.status, { request_id: randomUUID(), code: err.code, message: err.message });

  const authenticate = (req: IncomingMessage): { key: string; account: DashScopeAccount } => {
    const header = req.headers.authorization;
    const key = /^Bearer (.+)$/.exec(header ?? '')?.[1];
    if (key === undefined) throw new DashScopeError(401, 'InvalidApiKey', 'No API-key provided.');
    const account = accounts.get(key);
    // A key of another region's console is as unknown here as a wrong one.
    if (!account || (account.region ?? region) !== region) throw new DashScopeError(401, 'InvalidApiKey', 'Invalid API-key provided.');
    return { key, account };
  };

  const server = await startFakeServer(async (req, res, recorded) => {
    const route = routeOf(recorded.method, recorded.path);
    if (!route) return answerError(res, new DashScopeError(404, 'NotFound', 'url error, please check url!'));
    try {
      const { key, account } = authenticate(req);
      if (await applyFault(res, server.faults.take(route.name))) return;
      if (route.name === 'submit') return await submit(req, res, recorded, route.endpoint, key, account);
      if (route.name === 'poll') return poll(res, key, route.id);
      return cancel(res, key, route.id);
    } catch (err) {
      if (err instanceof DashScopeError) return answerError(res, err);
      throw err;
    }
  });

  /** GETs a media URL as the data inspection does; what it is, or why it is refused. */
  async function fetchImage(url: string): Promise<Buffer> {
    const refused = () => inspection('Unable to download the media resource during the data inspection process.');
    let res: Response;
    try {
      if (!fake.reachable(url)) throw new Error('unreachable from the upstream');
      res = await fetch(url, { signal: AbortSignal.timeout(fetchTimeoutMs), redirect: 'follow' });
    } catch {
      fetches.push({ url, status: 'unreachable' });
      throw refused();
    }
    fetches.push({ url, status: res.status });
    if (!res.ok) {
      await res.body?.cancel();
      throw refused();
    }
    try {
      return Buffer.from(await res.arrayBuffer());
    } catch {
      throw refused();
    }
  }

  /** An image input: a URL (fetched) or, where allowed, a data URL; measured against the model's limits. */
  async function mediaInput(value: unknown, field: string, type: string, limits: ImageLimits, dataAllowed: boolean): Promise<DashScopeMediaInput> {
    if (typeof value !== 'string' || value === '') throw invalid(`The ${field} is required.`);
    let bytes: Buffer;
    let kind: 'url' | 'data';
    if (/^https?:\/\//i.test(value)) {
      kind = 'url';
      bytes = await fetchImage(value);
    } else if (dataAllowed && value.startsWith('data:')) {
      const m = /^data:(image\/[a-z]+);base64,/.exec(value.slice(0, 40));
      if (!m) throw invalid(`The ${field} is not a valid base64 image: data:{MIME_type};base64,{base64_data} is required.`);
      kind = 'data';
      bytes = Buffer.from(value.slice(m[0].length), 'base64');
    } else throw invalid(`url error, please check url! (${field})`);
    let meta;
    try {
      meta = await sharp(bytes).metadata();
    } catch {
      // Bytes that are no image (fetched or inline): the error page's decode row.
      throw inspection('Failed to decode the image during the data inspection.');
    }
    const format = meta.format;
    // Wan takes JPEG, PNG, BMP and WebP; anything else (a GIF) is the status-code table's own row.
    if (!['jpeg', 'png', 'bmp', 'webp'].includes(format ?? '')) throw inspection('The media format is not supported or incorrect for the data inspection.');
    const width = meta.width ?? 0;
    const height = meta.height ?? 0;
    const ratio = Math.max(width, height) / Math.max(1, Math.min(width, height));
    if (Math.min(width, height) < limits.minSide || Math.max(width, height) > limits.maxSide || ratio > limits.maxRatio || bytes.length > limits.maxBytes) {
      throw invalid(`The ${field} of ${width}x${height} px and ${bytes.length} bytes is outside the supported range.`);
    }
    return { field, type, kind, ...(kind === 'url' && { url: value }), mimeType: `image/${format}`, width, height, bytes: bytes.length };
  }

  async function submit(req: IncomingMessage, res: ServerResponse, recorded: RecordedRequest, endpoint: DashScopeEndpoint, key: string, account: DashScopeAccount): Promise<void> {
    if (req.headers['x-dashscope-async'] !== 'enable') throw new DashScopeError(403, 'AccessDenied', 'current user api does not support synchronous calls');
    const body = recorded.json;
    if (!isObject(body)) throw invalid('The request body is not valid JSON.');
    if (typeof body.model !== 'string' || body.model === '') throw new DashScopeError(400, 'BadRequest.EmptyModel', 'Required parameter "model" missing from request.');
    const model = body.model;
    const spec = MODELS[model];
    if (!spec || !served.has(model)) throw new DashScopeError(options.modelNotExistStatus ?? 400, 'InvalidParameter', 'Model not exist.');
    if (account.arrears) throw new DashScopeError(400, 'Arrearage', 'Access denied, please make sure your account is in good standing.');
    if (account.models && !account.models.includes(model)) throw new DashScopeError(403, 'AccessDenied.Unpurchased', 'Access to model denied. Please make sure you are eligible for using the model.');
    // The keyframe models live at the image2video path; the rest at video-generation.
    if ((spec.protocol === 'keyframe') !== (endpoint === 'image2video')) throw new DashScopeError(400, 'InvalidParameter', `The model ${model} does not support this API; url error, please check url!`);
    if (!isObject(body.input)) throw new DashScopeError(400, 'BadRequest.EmptyInput', 'Required input parameter missing from request.');
    const input = body.input;
    const parameters = body.parameters === undefined ? {} : body.parameters;
    if (!isObject(parameters)) throw invalid('The parameters must be an object.');
    const prompt = typeof input.prompt === 'string' ? input.prompt : '';
    if (input.prompt !== undefined && typeof input.prompt !== 'string') throw invalid('The prompt must be a string.');
    if (input.negative_prompt !== undefined && typeof input.negative_prompt !== 'string') throw invalid('The negative_prompt must be a string.');
    for (const flag of ['prompt_extend', 'watermark', 'audio'] as const) {
      if (parameters[flag] !== undefined && typeof parameters[flag] !== 'boolean') throw invalid(`The ${flag} must be a boolean.`);
    }

    const media: DashScopeMediaInput[] = [];
    const legacyFields = ['img_url', 'first_frame_url', 'last_frame_url'].filter((f) => input[f] !== undefined);
    switch (spec.protocol) {
      case 'legacy-t2v': {
        if (legacyFields.length > 0 || input.media !== undefined) throw invalid(`The model ${model} takes no image input.`);
        if (!prompt) throw invalid('Field required: input.prompt');
        const size = parameters.size ?? spec.sizes![spec.resolutions.at(-1)!]![0];
        const all = Object.values(spec.sizes!).flat();
        if (typeof size !== 'string' || !all.includes(size)) throw invalid(`The size is not match, the model ${model} supports ${all.join(', ')}.`);
        if (parameters.resolution !== undefined) throw invalid(`The model ${model} takes size, not resolution.`);
        break;
      }
      case 'legacy-i2v': {
        if (input.media !== undefined || input.first_frame_url !== undefined || input.last_frame_url !== undefined) throw invalid(`The model ${model} takes img_url.`);
        media.push(await mediaInput(input.img_url, 'img_url', 'first_frame', spec.images, true));
        if (parameters.size !== undefined) throw invalid(`The model ${model} takes resolution, not size.`);
        break;
      }
      case 'keyframe': {
        if (input.media !== undefined || input.img_url !== undefined) throw invalid(`The model ${model} takes first_frame_url and last_frame_url.`);
        media.push(await mediaInput(input.first_frame_url, 'first_frame_url', 'first_frame', spec.images, true));
        if (input.last_frame_url !== undefined) media.push(await mediaInput(input.last_frame_url, 'last_frame_url', 'last_frame', spec.images, true));
        break;
      }
      case 'media': {
        if (legacyFields.length > 0) throw invalid(`The model ${model} takes input.media; ${legacyFields.join(', ')} is not supported.`);
        const list = input.media ?? [];
        if (!Array.isArray(list)) throw invalid('The media must be a list.');
        const allowed = spec.media ?? {};
        const counts: Record<string, number> = {};
        for (const [i, item] of list.entries()) {
          if (!isObject(item) || typeof item.type !== 'string') throw invalid(`The media[${i}].type is required.`);
          if (!allowed[item.type]) throw invalid(`The media type ${String(item.type)} is not supported by the model ${model}.`);
          counts[item.type] = (counts[item.type] ?? 0) + 1;
          media.push(await mediaInput(item.url, `media[${i}].url`, item.type, spec.images, false));
        }
        for (const [type, { min, max }] of Object.entries(allowed) as [string, { min: number; max: number }][]) {
          const n = counts[type] ?? 0;
          if (n < min) throw invalid(type === 'first_frame' ? `image-to-video model ${model} must provide an image` : `The model ${model} needs at least ${min} ${type}.`);
          if (n > max) throw invalid(`The model ${model} takes at most ${max} ${type}.`);
        }
        if ((counts.last_frame ?? 0) > 0 && (counts.first_frame ?? 0) === 0) throw invalid('A last_frame needs a first_frame.');
        if (!prompt && media.length === 0) throw invalid('Field required: input.prompt');
        if (parameters.size !== undefined) throw invalid(`The model ${model} takes resolution and ratio, not size.`);
        if (parameters.ratio !== undefined) {
          if (!spec.ratios) throw invalid(`The model ${model} takes the ratio of its first frame; ratio is not supported.`);
          if (typeof parameters.ratio !== 'string' || !spec.ratios.includes(parameters.ratio)) throw invalid(`The ratio must be one of ${spec.ratios.join(', ')}.`);
        }
        break;
      }
    }
    if (spec.protocol !== 'legacy-t2v') {
      const resolution = parameters.resolution ?? spec.resolutions.at(-1);
      if (typeof resolution !== 'string' || !spec.resolutions.includes(resolution)) throw invalid(`The resolution must be one of ${spec.resolutions.join(', ')} for the model ${model}.`);
    }
    const duration = parameters.duration ?? spec.durations[0];
    if (typeof duration !== 'number' || !Number.isInteger(duration) || duration < spec.durations[0] || duration > spec.durations[1]) {
      throw invalid(`The duration must be an integer in [${spec.durations[0]}, ${spec.durations[1]}] for the model ${model}.`);
    }
    if (prompt.includes('[ds:inspect]')) throw new DashScopeError(400, 'DataInspectionFailed', 'Input data may contain inappropriate content.');

    const now = Date.now();
    const task: DashScopeFakeTask = {
      id: randomUUID(),
      apiKey: key,
      model,
      endpoint,
      protocol: spec.protocol,
      body,
      prompt,
      media,
      headers: req.headers,
      createdAt: now,
      pendingMs: prompt.includes('[ds:stay-pending]') ? Infinity : (options.pendingMs ?? 50),
      runningMs: prompt.includes('[ds:stay-running]') ? Infinity : (options.runningMs ?? 100),
      outcome: prompt.includes('[ds:unsafe]') ? 'unsafe' : prompt.includes('[ds:fail]') ? 'fail' : prompt.includes('[ds:bad-param]') ? 'bad-param' : prompt.includes('[ds:expire]') ? 'expire' : 'succeeded',
      canceled: false,
      expired: false,
      polls: 0,
    };
    tasks.set(task.id, task);
    sendJson(res, 200, { output: { task_status: 'PENDING', task_id: task.id }, request_id: randomUUID() });
  }

  function statusOf(task: DashScopeFakeTask, now = Date.now()): DashScopeTaskStatus {
    if (task.expired || now - task.createdAt > (options.taskTtlMs ?? 24 * 3600_000)) return 'UNKNOWN';
    if (task.canceled) return 'CANCELED';
    const age = now - task.createdAt;
    if (age < task.pendingMs) return 'PENDING';
    if (task.outcome === 'expire') return 'UNKNOWN';
    if (age < task.pendingMs + task.runningMs) return 'RUNNING';
    return task.outcome === 'succeeded' ? 'SUCCEEDED' : 'FAILED';
  }

  function poll(res: ServerResponse, key: string, id: string): void {
    const task = tasks.get(id);
    // Another account's task is as unknown as one never issued.
    if (!task || task.apiKey !== key) return sendJson(res, 200, { request_id: randomUUID(), output: { task_id: id, task_status: 'UNKNOWN' } });
    task.polls++;
    const status = statusOf(task);
    const output: Record<string, unknown> = { task_id: task.id, task_status: status };
    if (status === 'UNKNOWN') return sendJson(res, 200, { request_id: randomUUID(), output });
    output.submit_time = stamp(task.createdAt);
    if (status !== 'PENDING') output.scheduled_time = stamp(task.createdAt + Math.min(task.pendingMs, 1e12));
    const answer: Record<string, unknown> = { request_id: randomUUID(), output };
    if (status === 'FAILED') {
      output.end_time = stamp(Date.now());
      const error =
        task.outcome === 'unsafe'
          ? { code: 'DataInspectionFailed', message: 'Output data may contain inappropriate content.' }
          : task.outcome === 'bad-param'
            ? { code: 'InvalidParameter', message: 'The size is not match the input image.' }
            : { code: 'InternalError.Algo', message: 'An internal error has occured during execution, please try again later or contact service support.' };
      Object.assign(fake.failedErrorIn === 'output' ? output : answer, error);
    }
    if (status === 'SUCCEEDED') {
      output.end_time = stamp(task.createdAt + task.pendingMs + task.runningMs);
      if (!task.file) {
        task.file = randomBytes(12).toString('hex');
        files.set(task.file, { data: video, madeAt: Date.now(), expired: false });
      }
      output.video_url = resultUrl(task.file);
      output.orig_prompt = task.prompt;
      const parameters = (task.body.parameters ?? {}) as Record<string, unknown>;
      const seconds = typeof parameters.duration === 'number' ? parameters.duration : MODELS[task.model]!.durations[0];
      const resolution = typeof parameters.resolution === 'string' ? parameters.resolution : typeof parameters.size === 'string' ? tierOf(parameters.size) : '720P';
      const spec = MODELS[task.model]!;
      answer.usage = {
        duration: seconds,
        video_count: 1,
        SR: Number(resolution.replace('P', '')),
        ...(spec.audio !== 'none' && { audio: spec.audio === 'always' || parameters.audio !== false }),
      };
    }
    sendJson(res, 200, answer);
  }

  function cancel(res: ServerResponse, key: string, id: string): void {
    const task = tasks.get(id);
    if (!task || task.apiKey !== key || statusOf(task) !== 'PENDING') {
      throw new DashScopeError(400, 'UnsupportedOperation', 'Failed to cancel the task, please confirm if the task is in PENDING status.');
    }
    task.canceled = true;
    sendJson(res, 200, { request_id: randomUUID() });
  }

  fake = Object.assign(server, {
    region,
    ossUrl: oss.url,
    accounts,
    tasks,
    fetches,
    urlTtlMs: options.urlTtlMs ?? 24 * 3600_000,
    failedErrorIn: options.failedErrorIn ?? 'output',
    ossSawAuth: 0,
    reachable: () => true,
    statusOf(id: string) {
      const task = tasks.get(id);
      return task && statusOf(task);
    },
    expireResult(idOrUrl: string) {
      const token = tasks.get(idOrUrl)?.file ?? /\/([a-f0-9]+)\.mp4/.exec(idOrUrl)?.[1];
      const file = token ? files.get(token) : undefined;
      if (file) file.expired = true;
    },
    expireTask(id: string) {
      const task = tasks.get(id);
      if (task) task.expired = true;
    },
    rateLimitNext(route: DashScopeRoute, retryAfterSeconds?: number, times = 1) {
      const fault: Fault = {
        status: 429,
        body: { request_id: randomUUID(), code: 'Throttling.RateQuota', message: 'Requests rate limit exceeded, please try again later.' },
        ...(retryAfterSeconds !== undefined && { headers: { 'retry-after': String(retryAfterSeconds) } }),
      };
      (route === 'oss' ? oss : server).faults.push(route, fault, times);
    },
    quotaNext(route: DashScopeRoute, times = 1) {
      server.faults.push(route, { status: 429, body: { request_id: randomUUID(), code: 'Throttling.AllocationQuota', message: 'Allocated quota exceeded, please increase your quota limit.' } }, times);
    },
    serverErrorNext(route: DashScopeRoute, times = 1) {
      const fault: Fault =
        route === 'oss'
          ? { status: 503, body: {} }
          : { status: 500, body: { request_id: randomUUID(), code: 'InternalError', message: 'An internal error has occured, please try again later or contact service support.' } };
      (route === 'oss' ? oss : server).faults.push(route, fault, times);
    },
  });
  const closeMain = server.close;
  fake.close = async () => {
    await Promise.all([closeMain(), oss.close()]);
  };
  return fake;
}

function tierOf(size: string): string {
  return Object.entries(SIZES).find(([, sizes]) => sizes.includes(size))?.[0] ?? '720P';
}

type Route = { name: 'submit'; endpoint: DashScopeEndpoint } | { name: 'poll'; id: string } | { name: 'cancel'; id: string };

function routeOf(method: string, path: string): Route | undefined {
  const submit = /^\/api\/v1\/services\/aigc\/(video-generation|image2video)\/video-synthesis$/.exec(path);
  if (method === 'POST' && submit) return { name: 'submit', endpoint: submit[1] as DashScopeEndpoint };
  const task = /^\/api\/v1\/tasks\/([^/]+)(\/cancel)?$/.exec(path);
  if (task && method === 'GET' && !task[2]) return { name: 'poll', id: decodeURIComponent(task[1]!) };
  if (task && method === 'POST' && task[2]) return { name: 'cancel', id: decodeURIComponent(task[1]!) };
  return undefined;
}
