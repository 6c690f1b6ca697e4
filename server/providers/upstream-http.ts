/**
 * How adapters talk HTTP to an upstream: one keep-alive connection pool per process (undici's
 * `request`, much cheaper per call than `fetch` for thousands of polls a second), a timeout on the
 * answer's headers and on every pause of its body, the step's signal to abort it, no proxy
 * environment variables, and the helpers every adapter needs to turn an answer into a classified
 * ProviderError: Retry-After parsing and message sanitizing.
 *
 * Every answer's body must be read, handed on as a stream, or discarded (`discard()`): an unread
 * body keeps its connection from being reused.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { pipeline, Readable, Transform } from 'node:stream';
import { Agent, request, type Dispatcher } from 'undici';
import { indexOfEither } from '../lib/media-json-scanner.ts';
import { StorageError } from '../storage/storage-error.ts';
import { ProviderError, type ProviderErrorKind } from './provider-error.ts';
import { PROVIDERS, type ProviderKind } from './provider-kinds.ts';
import type { UpstreamAccount, VideoContent } from './types.ts';

/** Default time an upstream call may wait for its answer's headers, and for each part of its body. */
export const UPSTREAM_TIMEOUT_MS = 60_000;
const MAX_REDIRECTS = 5;
/** Most bytes `UpstreamResponse.text()` keeps (status, job and error answers are a few KiB). */
export const MAX_TEXT_BYTES = 4 * 1024 * 1024;

const direct = new Agent({ connect: { timeout: 10_000 } });
const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);

/** The member's base URL (or the provider's public default) joined with `path`. */
export function upstreamUrl(account: UpstreamAccount, path: string): string {
  const base = (account.baseUrl ?? PROVIDERS[account.provider as ProviderKind]?.defaultBaseUrl ?? '').replace(/\/+$/, '');
  return `${base}${path.startsWith('/') ? path : `/${path}`}`;
}

export interface UpstreamRequest {
  method?: string;
  headers?: Record<string, string>;
  /**
   * A FormData body is sent as multipart/form-data with its boundary; a stream (a JSON body with
   * inputs streamed into it: `jsonStream`) as it is read, never held in memory — it cannot follow
   * a redirect, so send it with `redirect: 'manual'` or to an URL that does not redirect.
   */
  body?: string | Buffer | FormData | Readable;
  /**
   * `manual`: a redirect comes back as the answer. Default `follow`: up to 5 redirects within the
   * URL's origin (scheme, host and port); a redirect to another origin fails the call as the
   * member's misconfiguration, so that no credential header (`x-goog-api-key`, `x-api-key`, …) is
   * ever sent elsewhere. `anywhere`: up to 5 redirects to any origin, for a request that carries
   * credentials only for the first origin (an output link signed by itself, or an upstream's files
   * endpoint that redirects to its storage host): once a redirect leaves that origin, only `Accept`
   * goes on, and nothing is sent with credentials again. The answer's `url` says where it came from.
   */
  redirect?: 'follow' | 'manual' | 'anywhere';
  timeoutMs?: number;
}

/** The part of a header map adapters read (WHATWG `Headers` has it too). */
export interface UpstreamHeaders {
  get(name: string): string | null;
}

/** An upstream's answer: status, headers, and the body as a Node stream. */
export class UpstreamResponse {
  readonly ok: boolean;
  readonly headers: UpstreamHeaders;

  constructor(
    readonly status: number,
    raw: IncomingHttpHeaders,
    readonly body: Readable,
    private readonly onHandOff: () => void = () => undefined,
    /** The URL that answered: the one asked for, or where its redirects led. */
    readonly url = '',
    /** The call: the caller's signal (its abort stays an abort) and what it was, for messages. */
    private readonly call: { signal?: AbortSignal; what?: string } = {},
  ) {
    this.ok = status >= 200 && status < 300;
    this.headers = {
      get: (name) => {
        const value = raw[name.toLowerCase()];
        return value === undefined ? null : Array.isArray(value) ? value.join(', ') : value;
      },
    };
  }

  /**
   * The whole body as text: a status, a job or an error answer, never media. A body over
   * `maxBytes` (default MAX_TEXT_BYTES) is not kept. A body that cannot be read (over the cap,
   * broken off, timed out) fails as `unreadAnswer` says.
   */
  async text(maxBytes = MAX_TEXT_BYTES): Promise<string> {
    const chunks: Buffer[] = [];
    let total = 0;
    try {
      for await (const chunk of this.body) {
        total += (chunk as Buffer).byteLength;
        if (total > maxBytes) {
          this.body.destroy();
          throw new ProviderError('retryable', `the upstream answered more than ${maxBytes >= 1 << 20 ? `${maxBytes / (1 << 20)} MiB` : `${maxBytes} bytes`} where a short JSON answer was expected`);
        }
        chunks.push(chunk as Buffer);
      }
    } catch (err) {
      throw this.unreadAnswer(err);
    }
    return Buffer.concat(chunks).toString('utf8');
  }

  /**
   * A failure to read the body as the error to throw; the caller's abort stays an abort. On a 2xx
   * the upstream took the request (a submit: its job may be running), so it is retryable and
   * `maybeAccepted`. Any other status is the upstream's refusal, whole in its status line: nothing
   * was accepted (the pool fails over, a submit is not counted as unanswered). What it refused for
   * was in the body: only a 429 (with its Retry-After) and a 401/403 say it in the status line;
   * anything else is a passing failure (retryable), never the client's request (a cut 400 on a
   * status call must not fail a running job as the client's, nor a look give the job up).
   */
  unreadAnswer(err: unknown): unknown {
    if (this.call.signal?.aborted) return this.call.signal.reason ?? err;
    const message = err instanceof ProviderError ? err.message : `the upstream ${this.call.what ?? 'call'} answered HTTP ${this.status}, then its body ${isTimeout(err) ? 'timed out' : 'could not be read'}`;
    if (!this.ok) {
      const kind = this.status === 429 ? 'rate_limited' : this.status === 401 || this.status === 403 ? 'auth' : 'retryable';
      return new ProviderError(kind, message, { cause: err, upstreamStatus: this.status, retryAfterMs: retryAfterMs(this.headers) });
    }
    return new ProviderError('retryable', message, { cause: err, upstreamStatus: this.status, maybeAccepted: true });
  }

  /** Drops the rest of the body (a small rest is read so that the connection can be reused). */
  discard(): void {
    const body = this.body as Readable & { dump?: (opts?: { limit: number }) => Promise<void> };
    if (body.dump) void body.dump({ limit: 64 * 1024 }).catch(() => undefined);
    else body.destroy();
  }

  /**
   * The body, handed on as a stream (a download into the media store): from here on only pauses
   * longer than the call's timeout end it, not its total time.
   */
  stream(): Readable {
    this.onHandOff();
    return this.body;
  }
}

class UpstreamTimeout extends Error {
  override readonly name = 'TimeoutError';
}

/** Request bodies larger than this are sent in slices, so that the upload's progress is watched. */
const WATCHED_BODY_BYTES = 1 << 20;

/**
 * One upstream call, bounded by the caller's signal and by `timeoutMs`: from start to the end of the
 * answer's body (unless the body is handed on with `stream()`), except that a request body that is a
 * stream or over 1 MiB is bounded while it is sent by its progress (no part sent for `timeoutMs`),
 * and the answer's `timeoutMs` starts once all of it was sent: a large upload on a slow link takes
 * what it takes while it moves (a 680 MiB Veo body at 100 Mbit/s is about a minute). A connection
 * error or timeout becomes a `retryable` ProviderError (never an unclassified error), an abort by
 * the caller stays an abort.
 */
export async function upstreamFetch(url: string, init: UpstreamRequest, signal: AbortSignal, what: string): Promise<UpstreamResponse> {
  if (signal.aborted) throw signal.reason;
  const timeoutMs = init.timeoutMs ?? UPSTREAM_TIMEOUT_MS;
  const call = new AbortController();
  const onAbort = () => call.abort(signal.reason);
  signal.addEventListener('abort', onAbort, { once: true });
  const answerTimeout = () => call.abort(new UpstreamTimeout(`no complete answer within ${timeoutMs} ms`));
  let timer = setTimeout(answerTimeout, timeoutMs);
  const done = () => {
    clearTimeout(timer);
    signal.removeEventListener('abort', onAbort);
  };
  // A watched body not read to its end when the call failed (a timeout during a long upload, a
  // connection lost midway) never reached the upstream whole: nothing can have been accepted.
  let bodyRead = true;
  /**
   * The body as sent, its progress watched: each slice sent restarts the upload's idle limit, and
   * the last one starts the answer's time limit.
   */
  const watched = (source: Readable): Readable => {
    bodyRead = false;
    clearTimeout(timer);
    timer = setTimeout(() => call.abort(new UpstreamTimeout(`the upload made no progress for ${timeoutMs} ms`)), timeoutMs);
    const watch = new Transform({
      transform(chunk, _encoding, next) {
        timer.refresh();
        next(null, chunk);
      },
      flush(next) {
        bodyRead = true;
        clearTimeout(timer);
        timer = setTimeout(answerTimeout, timeoutMs);
        next();
      },
    });
    return pipeline(source, watch, () => undefined);
  };
  // The request body's own source failing (a stored input the media store could not read) cuts the
  // request before the upstream had all of it: nothing can have been accepted, and the failure is
  // the gateway's, not the upstream's. Its error is kept to be thrown as it is. (undici also
  // destroys the body with the socket's error when the connection fails during the upload: that one
  // is the upstream's, classified below.)
  let bodyFailure: StorageError | undefined;
  if (init.body instanceof Readable) init.body.on('error', (error: unknown) => void (error instanceof StorageError && (bodyFailure ??= error)));
  try {
    let { body, headers } = init;
    // A large text body (Gemini's JSON with its input images inlined) is sent as bytes, watched.
    if (typeof body === 'string' && body.length > WATCHED_BODY_BYTES) body = Buffer.from(body);
    if (body instanceof FormData) {
      // The platform's encoder writes the parts and picks the boundary; inputs are in memory anyway.
      const encoded = new Response(body);
      headers = { ...headers, 'content-type': encoded.headers.get('content-type')! };
      body = Buffer.from(await encoded.arrayBuffer());
    }
    let target = url;
    let method = (init.method ?? 'GET') as Dispatcher.HttpMethod;
    for (let hops = 0; ; hops++) {
      // A large or streamed body is sent with its progress watched (a large buffer in 64 KiB slices,
      // its length declared: a redirect that keeps the body sends it again); undici's own limit on
      // the answer's headers, which starts before the upload, gives way to the watch.
      const large = Buffer.isBuffer(body) && body.byteLength > WATCHED_BODY_BYTES;
      const sent = body instanceof Readable ? watched(body) : large ? watched(Readable.from(slices(body as Buffer))) : body;
      const sentHeaders = large && !hasHeader(headers, 'content-length') ? { ...headers, 'content-length': String((body as Buffer).byteLength) } : headers;
      const res = await request(target, { method, headers: sentHeaders, body: sent, signal: call.signal, dispatcher: direct, headersTimeout: sent instanceof Readable ? 0 : timeoutMs, bodyTimeout: timeoutMs });
      const location = res.headers.location;
      // A streamed body cannot be sent twice: its redirect comes back as the answer.
      const follow = init.redirect !== 'manual' && REDIRECT_STATUSES.has(res.statusCode) && typeof location === 'string' && (body === undefined || typeof body === 'string' || Buffer.isBuffer(body));
      if (!follow) {
        res.body.once('close', done);
        return new UpstreamResponse(res.statusCode, res.headers, res.body, () => clearTimeout(timer), target, { signal, what });
      }
      await res.body.dump({ limit: 64 * 1024 }).catch(() => undefined);
      const next = new URL(location, target);
      // Parsed only here: an answer that is not a redirect (nearly every one) pays nothing for it.
      if (next.origin !== new URL(url).origin) {
        if (init.redirect !== 'anywhere') {
          throw new ProviderError('misconfigured', `the upstream ${what} was redirected to another origin (${next.origin}); the account's credentials are not sent there`, { upstreamStatus: res.statusCode });
        }
        // The caller sends no credentials; whatever else it sent stays with the first origin all the same.
        if (headers) headers = Object.fromEntries(Object.entries(headers).filter(([name]) => /^accept$/i.test(name)));
      }
      if (hops >= MAX_REDIRECTS) {
        // With credentials, the member's base URL is wrong; a link's loop is the link's (its host's) failure.
        const kind = init.redirect === 'anywhere' ? 'retryable' : 'misconfigured';
        throw new ProviderError(kind, `the upstream ${what} was redirected more than ${MAX_REDIRECTS} times`, { upstreamStatus: res.statusCode });
      }
      // As fetch does: 303, and 301/302 after a POST, go on as a GET without the body.
      if (res.statusCode === 303 || ((res.statusCode === 301 || res.statusCode === 302) && method === 'POST')) {
        method = 'GET';
        body = undefined;
        if (headers) headers = Object.fromEntries(Object.entries(headers).filter(([name]) => !/^content-(type|length|encoding)$/i.test(name)));
      }
      target = next.href;
    }
  } catch (err) {
    done();
    if (err instanceof ProviderError) throw err;
    if (signal.aborted) throw signal.reason ?? err;
    if (bodyFailure) throw bodyFailure;
    const reason = call.signal.aborted || isTimeout(err) ? 'timed out' : 'could not be reached';
    throw new ProviderError('retryable', `the upstream ${what} ${reason}`, { cause: err, maybeAccepted: bodyRead && !neverSent(err) });
  }
}

/** Errors that prove the request never reached the upstream: no connection was made. */
const NOT_CONNECTED = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT']);

function neverSent(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && NOT_CONNECTED.has(code)) return true;
  }
  return false;
}

/** A timeout of the call (ours, or undici's connect, headers or body timeout). */
export function isTimeout(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return (err instanceof Error && err.name === 'TimeoutError') || code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT';
}

/**
 * A download answer as video content: its body handed on as a stream into the media store, checked
 * on its way. An answer that is not a video is a retryable failure of the download (a CDN's "link
 * expired" page or an error served with 200 must never be stored, served and charged as the
 * video): a text, JSON or XML answer at once, any other one unless its first bytes are those of an
 * ISO base media file (MP4), and an empty one (the stream fails). What passes is video/mp4, the one
 * video type of the contract, whatever the answer's Content-Type said (`application/octet-stream`).
 */
export function contentOf(res: UpstreamResponse): VideoContent {
  const type = res.headers.get('content-type')?.split(';')[0]!.trim().toLowerCase() ?? '';
  if (/^text\/|[/+](json|xml)$/.test(type)) {
    res.discard();
    throw new ProviderError('retryable', `the upstream video download answered ${type}, not a video`);
  }
  const length = Number(res.headers.get('content-length'));
  // The check fails with the body, and destroying it (the store refused it) destroys the body too.
  const stream = pipeline(res.stream(), isoMediaCheck(), () => undefined);
  return { stream, contentType: 'video/mp4', bytes: Number.isFinite(length) && length > 0 ? length : undefined };
}

/**
 * Passes a body on once its first 8 bytes are those of an ISO base media file: a box whose type,
 * at offset 4, is `ftyp` (MP4 and the other brands of the family: isom, mp42, avc1, M4V, qt, 3gp4,
 * …). Anything else, or no bytes at all, fails it as a retryable download.
 */
function isoMediaCheck(): Transform {
  let head: Buffer | undefined = Buffer.alloc(0);
  const notVideo = () => new ProviderError('retryable', 'the upstream video download answered something other than an MP4 video');
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      if (head === undefined) return done(null, chunk);
      head = Buffer.concat([head, chunk]);
      if (head.length < 8) return done();
      const first = head;
      head = undefined;
      if (first.toString('latin1', 4, 8) !== 'ftyp') return done(notVideo());
      done(null, first);
    },
    flush(done) {
      if (head === undefined) return done();
      done(head.length === 0 ? new ProviderError('retryable', 'the upstream video download answered no bytes') : notVideo());
    },
  });
}

/**
 * Milliseconds an upstream asked to wait: `retry-after-ms`, or `retry-after` in seconds or as an
 * HTTP date (as the OpenAI SDK reads them). Undefined when absent or unreadable; capped at an hour.
 */
export function retryAfterMs(headers: UpstreamHeaders, now = Date.now()): number | undefined {
  const ms = Number(headers.get('retry-after-ms'));
  if (headers.get('retry-after-ms') !== null && Number.isFinite(ms) && ms >= 0) return Math.min(ms, 3_600_000);
  const value = headers.get('retry-after');
  if (value === null || value.trim() === '') return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds) && seconds >= 0) return Math.min(seconds * 1000, 3_600_000);
  const date = Date.parse(value);
  return Number.isFinite(date) ? Math.min(Math.max(0, date - now), 3_600_000) : undefined;
}

/**
 * An upstream's reason as it may reach a client: one line, no URLs (they can carry signed
 * parameters), nothing that looks like a key or token, at most 300 characters.
 */
export function sanitizeMessage(message: unknown, fallback: string): string {
  if (typeof message !== 'string' || message.trim() === '') return fallback;
  const clean = message
    .replace(/\s+/g, ' ')
    .replace(/https?:\/\/\S+/gi, '[url]')
    // JWTs (MiniMax keys, Kling tokens), fal's `<uuid>:<secret>`, Replicate's `r8_…`, then `sk-…`-style keys.
    .replace(/\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]*)?/g, '[redacted]')
    .replace(/\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:[0-9a-f]{16,}/gi, '[redacted]')
    .replace(/\b(sk|pk|rk|r8|whsec|key|AIza)[-_A-Za-z0-9*]{8,}/g, '[redacted]')
    .replace(/\b(Bearer)\s+\S+/gi, '$1 [redacted]')
    .trim();
  return clean.length > 300 ? `${clean.slice(0, 297)}...` : clean;
}

/**
 * The kind of error an HTTP status means when the body does not say more. A redirect that reaches
 * an error path (an API call sent with `redirect: 'manual'`, a base URL on `http://` or behind a
 * proxy that moved) is the member's base URL, never the client's request.
 */
export function kindOfStatus(status: number): ProviderErrorKind {
  if (status >= 300 && status < 400) return 'misconfigured';
  if (status === 401 || status === 403) return 'auth';
  if (status === 429) return 'rate_limited';
  if (status === 404 || status === 405) return 'misconfigured';
  if (status === 408 || status === 409 || status >= 500) return 'retryable';
  return 'invalid_request';
}

/**
 * Reads a JSON body, or undefined when it is not JSON (an HTML error page from a proxy, say). A
 * body that cannot be read (the connection lost, a timeout, over the text cap) fails as
 * `unreadAnswer` says: on a 2xx as `maybeAccepted`, so a video job the upstream may be running is
 * asked again of the same member, never sent to a second account (design §8); on any other status
 * as the refusal its status says.
 */
export async function readJson(res: UpstreamResponse): Promise<unknown> {
  const text = await res.text();
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** Limits of an answer read with its data URLs decoded (readJsonWithMedia). */
export interface InlineMediaLimits {
  /** Bytes of the whole answer, as received. */
  maxBytes: number;
  /** Decoded bytes of all its data URLs. */
  maxMediaBytes: number;
  /** Bytes of the JSON besides its data URLs. */
  maxOtherBytes: number;
}

/**
 * An aggregator's finished job (a fal result, a Replicate prediction) may carry its outputs inline
 * as data URLs (fal's `sync_mode`, on by default on some endpoints; Replicate's sync mode): a few
 * MB to tens of MB an image, up to several images. Hundreds of MiB in all, as Ark's image answers;
 * the JSON besides them what a short answer could always hold (prompt echoes, Replicate's logs).
 */
export const INLINE_MEDIA_LIMITS: InlineMediaLimits = { maxBytes: 512 * 1024 * 1024, maxMediaBytes: 512 * 1024 * 1024, maxOtherBytes: MAX_TEXT_BYTES };

/** A data URL of an answer, decoded. */
export interface InlineMedia {
  mimeType: string;
  bytes: Buffer;
}

export interface JsonWithMedia {
  /**
   * The answer's JSON (undefined when it is not JSON), each base64 data URL replaced by a token:
   * a short `data:<type>;…,` string, which an aggregator's output mapping finds where the data URL was.
   */
  body: unknown;
  /** The media of each token. */
  media: ReadonlyMap<string, InlineMedia>;
}

/**
 * Reads a 2xx JSON answer whose strings may be media: every base64 data URL, wherever it is, is
 * decoded as it arrives and kept as bytes (`media`), never as text; the rest is parsed as
 * `readJson` does. A string that only starts like one (a prompt echoed back, `data:text/plain;
 * base64,a fox`) stays the string it was. An answer over `limits` fails as `failed`: it is what
 * the upstream has to say, so reading it again (a re-poll, a billed new job elsewhere) cannot
 * help. A body that breaks off fails as `readJson`'s does (`unreadAnswer`).
 *
 * `unread`, when the answer cannot be read (it fails, or is no JSON), is handed the JSON read
 * before that (its data URLs as tokens): a caller may still find in it what it cannot do without
 * (a create answer's id: `topLevelString`).
 */
export async function readJsonWithMedia(res: UpstreamResponse, what: string, limits: InlineMediaLimits = INLINE_MEDIA_LIMITS, unread?: (partial: string) => void): Promise<JsonWithMedia> {
  const scanner = new DataUrlScanner(limits, what);
  let total = 0;
  try {
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      total += chunk.byteLength;
      if (total > limits.maxBytes) throw new ProviderError('failed', `the upstream ${what} answered more than ${sizeOf(limits.maxBytes)}`);
      scanner.push(chunk);
    }
  } catch (err) {
    res.body.destroy();
    unread?.(scanner.partial());
    if (err instanceof ProviderError && err.kind === 'failed') throw err;
    throw res.unreadAnswer(err);
  }
  const read = scanner.end();
  if (read.body === undefined) unread?.(scanner.partial());
  return read;
}

/**
 * The string value of `key` in the object at the top of `json`, read as far as it goes (an answer
 * that broke off, or is no JSON past some point), or undefined when that far holds none.
 */
export function topLevelString(json: string, key: string): string | undefined {
  let depth = 0;
  /** The last string read in the top object, and whether a colon made it the key of what follows. */
  let last: string | undefined;
  let valueOf: string | undefined;
  for (let i = 0; i < json.length; i++) {
    const c = json[i];
    if (c === '"') {
      let end = i + 1;
      while (end < json.length && json[end] !== '"') end += json[end] === '\\' ? 2 : 1;
      if (end >= json.length) return undefined;
      if (depth === 1) {
        let text: string;
        try {
          text = JSON.parse(json.slice(i, end + 1)) as string;
        } catch {
          return undefined;
        }
        if (valueOf === key) return text;
        last = text;
        valueOf = undefined;
      }
      i = end;
    } else if (c === '{' || c === '[') {
      if (depth === 0 && c === '[') return undefined;
      depth++;
      valueOf = undefined;
    } else if (c === '}' || c === ']') {
      depth--;
      if (depth <= 0) return undefined;
    } else if (depth === 1 && c === ':') {
      valueOf = last;
      last = undefined;
    } else if (depth === 1 && c === ',') {
      last = valueOf = undefined;
    }
  }
  return undefined;
}

/** A byte limit as a message says it (`4 MiB`, else its bytes). */
export const sizeOf = (n: number) => (n % (1024 * 1024) === 0 ? `${n / 1024 / 1024} MiB` : `${n} bytes`);

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const SLASH = 0x2f;
/** Longest start of a string read to see whether it is a data URL (`data:<type>[;<param>…];base64,`). */
const MAX_DATA_URL_HEAD = 256;
const DATA_URL_HEAD = /^data:([a-z0-9!#$&^_.+-]+\/[a-z0-9!#$&^_.+-]+)(?:;[^;,]*)*;base64,$/i;
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/**
 * The JSON of an answer as it arrives, its base64 data URLs decoded into `media` and replaced by
 * tokens. It tracks only strings (the rest is copied as it is; JSON.parse judges it at the end):
 * a string's first bytes say whether it may be a data URL; one that is not is copied through.
 *
 * A string that starts like a data URL is only a candidate until its closing quote: it is decoded
 * as it comes, and its text kept as it came, so that one that turns out not to be base64 (any
 * other character, an escape other than `\/`, data after the padding, a lone last character) is
 * copied as the ordinary string it is: an upstream echoes the client's own text (a prompt, a
 * Replicate prediction's `input`), which must neither fail the answer nor become media. The text
 * is kept only while copying it would leave the JSON besides the media within `maxOtherBytes`:
 * past that a candidate is media or nothing, and one that then turns out not to be base64 fails
 * the answer (`failed`), as copying it would have. So memory stays the decoded media and at most
 * `maxOtherBytes` of text.
 */
class DataUrlScanner {
  private at: 'outside' | 'head' | 'plain' | 'data' = 'outside';
  /** The last byte read inside a string was a backslash escaping the next one. */
  private escaped = false;
  /** The start of the string being read, until it shows whether it may be a data URL. */
  private head: number[] = [];
  private readonly out: Buffer[] = [];
  private outBytes = 0;
  /** The candidate being decoded: its type, its bytes, its base64 characters not decoded yet (under 4), whether its padding began. */
  private mimeType = '';
  private parts: Buffer[] = [];
  private partBytes = 0;
  private carry = '';
  private padded = false;
  /** The candidate's text as it came, after its opening quote (undefined once too long to copy). */
  private raw: Buffer[] | undefined;
  private rawBytes = 0;
  private mediaBytes = 0;
  private readonly media = new Map<string, InlineMedia>();
  /** Tokens name this answer only: a string of the answer that spells one is never taken for its media. */
  private readonly nonce = randomBytes(8).toString('hex');

  constructor(
    private readonly limits: InlineMediaLimits,
    private readonly what: string,
  ) {}

  push(chunk: Buffer): void {
    let pos = 0;
    while (pos < chunk.length) {
      if (this.at === 'outside') pos = this.outside(chunk, pos);
      else if (this.at === 'head') pos = this.readHead(chunk, pos);
      else if (this.at === 'plain') pos = this.plain(chunk, pos);
      else pos = this.data(chunk, pos);
    }
  }

  end(): JsonWithMedia {
    // An answer that ends inside a string is no JSON.
    if (this.at !== 'outside') return { body: undefined, media: new Map() };
    try {
      return { body: JSON.parse(this.partial()) as unknown, media: this.media };
    } catch {
      return { body: undefined, media: new Map() };
    }
  }

  /** The JSON copied so far, its data URLs as tokens. */
  partial(): string {
    return Buffer.concat(this.out, this.outBytes).toString('utf8');
  }

  private outside(chunk: Buffer, pos: number): number {
    const quote = chunk.indexOf(QUOTE, pos);
    this.emit(chunk.subarray(pos, quote === -1 ? chunk.length : quote));
    if (quote === -1) return chunk.length;
    this.at = 'head';
    this.head = [];
    this.escaped = false;
    return quote + 1;
  }

  /** A string's first bytes, one at a time until they show whether it may be a data URL. */
  private readHead(chunk: Buffer, pos: number): number {
    for (; pos < chunk.length; pos++) {
      const c = chunk[pos]!;
      if (c === QUOTE && !this.escaped) {
        this.emit(Buffer.from([QUOTE, ...this.head, QUOTE]));
        this.at = 'outside';
        return pos + 1;
      }
      this.escaped = !this.escaped && c === BACKSLASH;
      this.head.push(c);
      if (c === COMMA) {
        // JSON may escape the slash of the type (`image\/png`).
        const match = DATA_URL_HEAD.exec(Buffer.from(this.head).toString('latin1').replace(/\\\//g, '/'));
        if (match) {
          this.at = 'data';
          this.mimeType = match[1]!.toLowerCase();
          this.parts = [];
          this.partBytes = 0;
          this.carry = '';
          this.padded = false;
          this.raw = [];
          this.rawBytes = 0;
          this.remember(Buffer.from(this.head));
          return pos + 1;
        }
        return this.toPlain(pos);
      }
      if (this.head.length > MAX_DATA_URL_HEAD || (this.head.length <= 5 && !'data:'.startsWith(Buffer.from(this.head).toString('latin1').toLowerCase()))) return this.toPlain(pos);
    }
    return pos;
  }

  /** The string is no data URL: what was read of it is copied, and the rest as it comes. */
  private toPlain(pos: number): number {
    this.emit(Buffer.from([QUOTE, ...this.head]));
    this.at = 'plain';
    return pos + 1;
  }

  private plain(chunk: Buffer, start: number): number {
    let pos = start;
    while (pos < chunk.length) {
      if (this.escaped) {
        this.escaped = false;
        pos++;
        continue;
      }
      const stop = indexOfEither(chunk, QUOTE, BACKSLASH, pos);
      if (stop === -1) break;
      if (chunk[stop] === BACKSLASH) {
        this.escaped = true;
        pos = stop + 1;
        continue;
      }
      this.emit(chunk.subarray(start, stop + 1));
      this.at = 'outside';
      return stop + 1;
    }
    this.emit(chunk.subarray(start));
    return chunk.length;
  }

  /**
   * A candidate's base64, decoded as it comes; its closing quote puts its token in its place. At
   * the first byte that shows it is no base64 it goes on as an ordinary string from that byte
   * (`notMedia`): `raw` then holds every byte before it, `escaped` whether the last one escapes it.
   */
  private data(chunk: Buffer, pos: number): number {
    while (pos < chunk.length) {
      if (this.escaped) {
        // JSON may escape the slash (`\/`); no other escape belongs in base64.
        if (chunk[pos] !== SLASH || !this.decode('/')) return this.notMedia(pos);
        this.escaped = false;
        this.remember(chunk.subarray(pos, pos + 1));
        pos++;
        continue;
      }
      const stop = indexOfEither(chunk, QUOTE, BACKSLASH, pos);
      const end = stop === -1 ? chunk.length : stop;
      if (!this.decode(chunk.toString('latin1', pos, end))) return this.notMedia(pos);
      this.remember(chunk.subarray(pos, end));
      if (stop === -1) return chunk.length;
      if (chunk[stop] === BACKSLASH) {
        this.escaped = true;
        this.remember(chunk.subarray(stop, stop + 1));
        pos = stop + 1;
        continue;
      }
      // The closing quote: plain copies it as the end of the ordinary string.
      if (!this.closeData()) return this.notMedia(stop);
      this.at = 'outside';
      return stop + 1;
    }
    return pos;
  }

  /** Decodes whole quads of base64 (padding only at the very end); the rest waits for more. False: the text is no base64. */
  private decode(text: string): boolean {
    if (text === '') return true;
    const all = this.carry + text;
    if (this.padded || !BASE64.test(all)) return false;
    const usable = all.length - (all.length % 4);
    this.carry = all.slice(usable);
    if (usable === 0) return true;
    const quads = all.slice(0, usable);
    this.padded = quads.endsWith('=');
    this.keep(Buffer.from(quads, 'base64'));
    return true;
  }

  private keep(bytes: Buffer): void {
    this.mediaBytes += bytes.length;
    if (this.mediaBytes > this.limits.maxMediaBytes) throw new ProviderError('failed', `the upstream ${this.what} answered more than ${sizeOf(this.limits.maxMediaBytes)} of media`);
    this.parts.push(bytes);
    this.partBytes += bytes.length;
  }

  /** The candidate's text so far, kept while copying it could still fit in `maxOtherBytes` (with its two quotes). */
  private remember(bytes: Buffer): void {
    if (this.raw === undefined) return;
    this.rawBytes += bytes.length;
    if (this.outBytes + this.rawBytes + 2 > this.limits.maxOtherBytes) {
      this.raw = undefined;
      return;
    }
    // A copy: a slice would keep the whole chunk (media included) alive.
    this.raw.push(Buffer.from(bytes));
  }

  /** A candidate that turned out to be no base64, from `pos` on: an ordinary string, copied as it came. */
  private notMedia(pos: number): number {
    if (this.raw === undefined) throw new ProviderError('failed', `the upstream ${this.what} answered a data URL that is not valid base64 (too long to keep as text)`);
    this.mediaBytes -= this.partBytes;
    this.parts = [];
    this.emit(Buffer.concat([Buffer.from([QUOTE]), ...this.raw]));
    this.raw = undefined;
    this.at = 'plain';
    return pos;
  }

  /** The candidate ends: false when its end is no base64's (a lone character, padding that completes no quad). */
  private closeData(): boolean {
    // Unpadded base64 ends in 2 or 3 characters; padding that does not complete a quad is no base64.
    if (this.carry.length === 1 || this.carry.includes('=')) return false;
    if (this.carry !== '') this.keep(Buffer.from(this.carry, 'base64'));
    const token = `data:${this.mimeType};mediagate-inline=${this.nonce}.${this.media.size},`;
    this.media.set(token, { mimeType: this.mimeType, bytes: this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts) });
    this.parts = [];
    this.raw = undefined;
    this.emit(Buffer.from(JSON.stringify(token)));
    return true;
  }

  private emit(bytes: Buffer): void {
    if (bytes.length === 0) return;
    this.outBytes += bytes.length;
    if (this.outBytes > this.limits.maxOtherBytes) throw new ProviderError('failed', `the upstream ${this.what} answered more than ${sizeOf(this.limits.maxOtherBytes)} besides its media`);
    // A copy: a slice would keep the whole chunk (media included) alive.
    this.out.push(Buffer.from(bytes));
  }
}

function* slices(buffer: Buffer): Generator<Buffer> {
  for (let at = 0; at < buffer.byteLength; at += 64 * 1024) yield buffer.subarray(at, at + 64 * 1024);
}

function hasHeader(headers: Record<string, string> | undefined, name: string): boolean {
  return headers !== undefined && Object.keys(headers).some((key) => key.toLowerCase() === name);
}
