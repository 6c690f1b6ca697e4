/**
 * A fake OpenAI `/v1/videos` upstream (Sora 2 wire format, also served by OpenAI-compatible
 * gateways), after ../shared/reference/upstream-apis.md §2 and §1.5:
 *
 *   POST   {base}/videos                 multipart (JSON accepted when no file), `seconds` a STRING
 *                                        "4" | "8" | "12" (an integer is `invalid_type`), `size`,
 *                                        `input_reference` a FILE (a string is `invalid_type`)
 *   GET    {base}/videos/{id}            the Video object: queued → in_progress (progress %) →
 *                                        completed (completed_at, expires_at) | failed (error{code,message})
 *   GET    {base}/videos/{id}/content    bytes (`variant` video | thumbnail | spritesheet)
 *   DELETE {base}/videos/{id}
 *
 * Errors use the envelope `{"error":{"message","type","param","code"}}`; every answer has
 * `x-request-id`; 429s carry `retry-after` and `x-ratelimit-*`. The `Idempotency-Key` header is
 * recorded but not honoured (the API does not document it for videos). Faults per route
 * (`create`, `retrieve`, `content`) through `faults`.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import busboy from 'busboy';
import { applyFault, sendJson, startFakeServer, type FakeServer, type RecordedRequest } from './fake-http.ts';

export interface FakeVideoJob {
  id: string;
  model: string;
  prompt: string;
  seconds: string;
  size: string;
  idempotencyKey: string | undefined;
  inputReference?: { mimeType: string; bytes: number };
  createdAt: number;
  /** When the job is done upstream (ms); undefined: never. */
  doneAt: number | undefined;
  failure?: { code: string; message: string };
  expired: boolean;
  downloads: number;
}

export interface OpenAIVideosFakeOptions {
  apiKeys?: string[];
  /** Time from submit to done (default 2000 ms). */
  jobDurationMs?: number;
  /** Per-prompt override: a number of ms, or `never`. */
  durationFor?: (prompt: string) => number | 'never' | undefined;
  /** Jobs whose prompt makes this return an error fail with it (default: prompts containing "fail-me" fail with moderation_blocked). */
  failWhen?: (prompt: string) => { code: string; message: string } | undefined;
  /** Size of the mp4 content (default 64 KiB). */
  contentBytes?: number;
  /** Keep a log of requests (off for benchmarks with thousands of jobs). */
  record?: boolean;
}

export interface OpenAIVideosFake extends FakeServer {
  jobs: Map<string, FakeVideoJob>;
  /** Requests per route. */
  counts: Record<'create' | 'retrieve' | 'content' | 'delete', number>;
  /** The next request of `route` gets a 429 rate limit with `retry-after`. */
  rateLimitNext(route: 'create' | 'retrieve' | 'content', retryAfterSeconds: number): void;
  /** The next request of `route` gets a 429 `insufficient_quota`. */
  quotaExhaustedNext(route: 'create' | 'retrieve' | 'content'): void;
  /** Makes a completed job's content expired (404). */
  expire(id: string): void;
}

const MODELS = new Set(['sora-2', 'sora-2-pro', 'sora-2-2025-10-06', 'sora-2-pro-2025-10-06', 'sora-2-2025-12-08']);
const SIZES = new Set(['720x1280', '1280x720', '1024x1792', '1792x1024']);
const PRO_SIZES = new Set(['1024x1792', '1792x1024']);

const envelope = (message: string, type: string, param: string | null, code: string | null) => ({ error: { message, type, param, code } });

function mp4Bytes(size: number): Buffer {
  const out = Buffer.alloc(Math.max(size, 32));
  out.writeUInt32BE(24, 0);
  out.write('ftypisom', 4, 'latin1');
  out.writeUInt32BE(0x200, 12);
  out.write('isomiso2', 16, 'latin1');
  for (let i = 24; i < out.length; i++) out[i] = (i * 31) & 0xff;
  return out;
}

async function parseForm(req: IncomingMessage, body: Buffer): Promise<{ fields: Record<string, string>; files: { field: string; mimeType: string; data: Buffer }[] }> {
  const fields: Record<string, string> = {};
  const files: { field: string; mimeType: string; data: Buffer }[] = [];
  await new Promise<void>((resolve, reject) => {
    const bb = busboy({ headers: req.headers });
    bb.on('field', (name, value) => (fields[name] = value));
    bb.on('file', (name, stream, info) => {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => files.push({ field: name, mimeType: info.mimeType, data: Buffer.concat(chunks) }));
    });
    bb.on('close', resolve);
    bb.on('error', reject);
    bb.end(body);
  });
  return { fields, files };
}

export async function startOpenAIVideosFake(options: OpenAIVideosFakeOptions = {}): Promise<OpenAIVideosFake> {
  const keys = new Set(options.apiKeys ?? ['sk-test']);
  const jobs = new Map<string, FakeVideoJob>();
  const counts = { create: 0, retrieve: 0, content: 0, delete: 0 };
  const content = mp4Bytes(options.contentBytes ?? 64 * 1024);
  const failWhen = options.failWhen ?? ((p: string) => (p.includes('fail-me') ? { code: 'moderation_blocked', message: 'Your request was blocked by our moderation system.' } : undefined));

  const videoObject = (job: FakeVideoJob, now = Date.now()) => {
    const done = job.doneAt !== undefined && now >= job.doneAt;
    const status = done ? (job.failure ? 'failed' : 'completed') : now - job.createdAt < 200 ? 'queued' : 'in_progress';
    const total = job.doneAt === undefined ? Number.POSITIVE_INFINITY : job.doneAt - job.createdAt;
    const completedAt = done ? Math.floor(job.doneAt! / 1000) : null;
    return {
      id: job.id,
      object: 'video',
      model: job.model,
      status,
      progress: done ? 100 : Math.min(99, Math.floor(((now - job.createdAt) / total) * 100)),
      created_at: Math.floor(job.createdAt / 1000),
      completed_at: status === 'completed' ? completedAt : null,
      expires_at: status === 'completed' ? completedAt! + 3600 : null,
      prompt: job.prompt,
      seconds: job.seconds,
      size: job.size,
      remixed_from_video_id: null,
      error: status === 'failed' ? job.failure : null,
    };
  };

  let fake: OpenAIVideosFake;
  const handle = async (req: IncomingMessage, res: ServerResponse, recorded: RecordedRequest) => {
    res.setHeader('x-request-id', `req_${randomBytes(12).toString('hex')}`);
    const route = /^\/v1\/videos\/?$/.test(recorded.path)
      ? recorded.method === 'POST'
        ? 'create'
        : 'list'
      : /^\/v1\/videos\/[^/]+\/content$/.test(recorded.path)
        ? 'content'
        : /^\/v1\/videos\/[^/]+$/.test(recorded.path)
          ? recorded.method === 'DELETE'
            ? 'delete'
            : 'retrieve'
          : undefined;
    if (!route) return sendJson(res, 404, envelope(`Invalid URL (${recorded.method} ${recorded.path})`, 'invalid_request_error', null, null));
    const auth = String(req.headers.authorization ?? '');
    if (!auth.startsWith('Bearer ') || !keys.has(auth.slice(7))) {
      return sendJson(res, 401, envelope(`Incorrect API key provided: ${auth.slice(7, 10)}***. You can find your API key at https://platform.openai.com/account/api-keys.`, 'invalid_request_error', null, 'invalid_api_key'));
    }
    if (route !== 'list') counts[route]++;
    if (route !== 'list' && route !== 'delete' && (await applyFault(res, fake.faults.take(route)))) return;

    if (route === 'create') {
      let fields: Record<string, string>;
      let files: { field: string; mimeType: string; data: Buffer }[] = [];
      const type = String(req.headers['content-type'] ?? '');
      if (type.startsWith('multipart/form-data')) ({ fields, files } = await parseForm(req, recorded.body));
      else {
        const json = recorded.json as Record<string, unknown> | undefined;
        if (!json) return sendJson(res, 400, envelope('We could not parse the JSON body of your request.', 'invalid_request_error', null, null));
        if (typeof json.seconds === 'number') {
          return sendJson(res, 400, envelope(`Invalid type for 'seconds': expected one of '4', '8', or '12', but got an integer instead.`, 'invalid_request_error', 'seconds', 'invalid_type'));
        }
        fields = Object.fromEntries(Object.entries(json).map(([k, v]) => [k, String(v)]));
        if (typeof json.input_reference === 'string') {
          return sendJson(res, 400, envelope(`Invalid type for 'input_reference': expected a file, but got a string instead.`, 'invalid_request_error', 'input_reference', 'invalid_type'));
        }
      }
      if (fields.input_reference !== undefined) {
        return sendJson(res, 400, envelope(`Invalid type for 'input_reference': expected a file, but got a string instead.`, 'invalid_request_error', 'input_reference', 'invalid_type'));
      }
      if (!fields.prompt) return sendJson(res, 400, envelope("Missing required parameter: 'prompt'.", 'invalid_request_error', 'prompt', 'missing_required_parameter'));
      const model = fields.model ?? 'sora-2';
      if (!MODELS.has(model)) return sendJson(res, 400, envelope(`Invalid value: '${model}'. Supported values are: ${[...MODELS].map((m) => `'${m}'`).join(', ')}.`, 'invalid_request_error', 'model', 'invalid_value'));
      const seconds = fields.seconds ?? '4';
      if (!['4', '8', '12'].includes(seconds)) {
        return sendJson(res, 400, envelope(`Invalid value: '${seconds}'. Supported values are: '4', '8', and '12'.`, 'invalid_request_error', 'seconds', 'invalid_value'));
      }
      const size = fields.size ?? '720x1280';
      if (!SIZES.has(size) || (PRO_SIZES.has(size) && !model.startsWith('sora-2-pro'))) {
        return sendJson(res, 400, envelope(`Invalid value: '${size}'. Supported values are: '720x1280' and '1280x720'.`, 'invalid_request_error', 'size', 'invalid_value'));
      }
      const file = files.find((f) => f.field === 'input_reference');
      if (file && !['image/jpeg', 'image/png', 'image/webp'].includes(file.mimeType)) {
        return sendJson(res, 400, envelope(`Invalid file format for 'input_reference'. Supported formats are: 'image/jpeg', 'image/png', and 'image/webp'.`, 'invalid_request_error', 'input_reference', 'invalid_value'));
      }
      const now = Date.now();
      const duration = options.durationFor?.(fields.prompt) ?? options.jobDurationMs ?? 2000;
      const job: FakeVideoJob = {
        id: `video_${randomBytes(16).toString('hex')}`,
        model,
        prompt: fields.prompt,
        seconds,
        size,
        idempotencyKey: typeof req.headers['idempotency-key'] === 'string' ? req.headers['idempotency-key'] : undefined,
        inputReference: file ? { mimeType: file.mimeType, bytes: file.data.length } : undefined,
        createdAt: now,
        doneAt: duration === 'never' ? undefined : now + duration,
        failure: failWhen(fields.prompt),
        expired: false,
        downloads: 0,
      };
      jobs.set(job.id, job);
      return sendJson(res, 200, videoObject(job, now));
    }

    if (route === 'list') {
      const data = [...jobs.values()].slice(-20).reverse().map((j) => videoObject(j));
      return sendJson(res, 200, { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: jobs.size > 20 });
    }

    const id = decodeURIComponent(recorded.path.split('/')[3]!);
    const job = jobs.get(id);
    if (!job) return sendJson(res, 404, envelope(`Video with id '${id}' not found.`, 'invalid_request_error', null, null));
    // A request's answer is what the job was when the request arrived (recorded.receivedAt), so a
    // test comparing the recorded times with doneAt reads the same status the client was answered.
    if (route === 'retrieve') return sendJson(res, 200, videoObject(job, recorded.receivedAt));
    if (route === 'delete') {
      jobs.delete(id);
      return sendJson(res, 200, { id, object: 'video.deleted', deleted: true });
    }
    // content — ASSUMPTION: before completion and after expiry the API answers 404 with the envelope.
    const status = videoObject(job, recorded.receivedAt).status;
    if (status !== 'completed') return sendJson(res, 404, envelope(`Video '${id}' is not ready: its status is '${status}'.`, 'invalid_request_error', null, null));
    if (job.expired) return sendJson(res, 404, envelope(`The content of video '${id}' has expired.`, 'invalid_request_error', null, null));
    const variant = recorded.query.get('variant') ?? 'video';
    const typeOf: Record<string, string> = { video: 'video/mp4', thumbnail: 'image/webp', spritesheet: 'image/jpeg' };
    if (!typeOf[variant]) return sendJson(res, 400, envelope(`Invalid value: '${variant}'. Supported values are: 'video', 'thumbnail', and 'spritesheet'.`, 'invalid_request_error', 'variant', 'invalid_value'));
    job.downloads++;
    const bytes = variant === 'video' ? content : content.subarray(0, 1024);
    res.writeHead(200, { 'content-type': typeOf[variant]!, 'content-length': String(bytes.length) });
    // Streamed in chunks, as a large file would be.
    Readable.from((function* () {
      for (let i = 0; i < bytes.length; i += 64 * 1024) yield bytes.subarray(i, i + 64 * 1024);
    })()).pipe(res);
  };

  const server = await startFakeServer(handle);
  fake = Object.assign(server, {
    jobs,
    counts,
    rateLimitNext(route: 'create' | 'retrieve' | 'content', retryAfterSeconds: number) {
      server.faults.push(route, {
        status: 429,
        headers: { 'retry-after': String(retryAfterSeconds), 'x-ratelimit-limit-requests': '50', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': `${retryAfterSeconds}s` },
        body: envelope('Rate limit reached for requests per min (RPM). Please try again later.', 'requests', null, 'rate_limit_exceeded'),
      });
    },
    quotaExhaustedNext(route: 'create' | 'retrieve' | 'content') {
      server.faults.push(route, { status: 429, body: envelope('You exceeded your current quota, please check your plan and billing details.', 'insufficient_quota', null, 'insufficient_quota') });
    },
    expire(id: string) {
      const job = jobs.get(id);
      if (job) job.expired = true;
    },
  });
  // Benchmarks with thousands of jobs keep no request log.
  if (options.record === false) server.requests.push = () => 0;
  return fake;
}
