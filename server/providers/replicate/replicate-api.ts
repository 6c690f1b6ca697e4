/**
 * Replicate's predictions API (upstream-apis.md §7.2, §10.1), shared by the Replicate video and
 * image adapters. Every model on Replicate is a prediction with the same wire; what differs per
 * model is its `input` and its `output`, which the catalog model's mapping says (kit/mapping.ts).
 * Base URL (the member's, default https://api.replicate.com/v1), `Authorization: Bearer <api_token>`.
 *
 *   create   POST /models/{owner}/{name}/predictions          `{input}` (an official model, endpoint `owner/name`)
 *            POST /predictions                               `{version, input}` (endpoint `owner/name:<version>` or a bare version id)
 *            POST /deployments/{owner}/{name}/predictions     `{input}` (endpoint `deployments/owner/name`)
 *            `Prefer: wait=N` (images whose mapping says `wait`): the answer waits up to N s for the
 *            prediction to finish, else it comes back `starting`/`processing` and is polled
 *            `Cancel-After: <n>s` (videos): the prediction's deadline, the task's (`cancelAfterOf`)
 *   get      GET  /predictions/{id}    starting | processing → running; succeeded → `output`;
 *                                      failed (`error`), canceled, aborted → failed
 *   cancel   POST /predictions/{id}/cancel
 *
 * Errors are problem details `{title, detail, status}` (§7.2; `invalid_fields` on a 422, read when
 * present). 422 is the input the mapping made, refused: the member's misconfiguration, said in full
 * in member health (the client gets a generic error); 401/403 the token; 402 billing (out until the
 * operator acts); 404 the endpoint; 429 with Retry-After a rate limit; 5xx retryable. Output files
 * (`replicate.delivery`, another origin) expire an hour after the prediction: downloaded at once,
 * without credentials. In sync mode Replicate may put a model's files in `output` as data URLs
 * instead (replicate-javascript's README: "an optimization we make on certain models"), and a
 * prediction echoes its `input` (data URLs included, with `media: data_url`): a prediction is read
 * as an answer that may carry media (readJsonWithMedia), never as a short one.
 */
import { ProviderError, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, MappingError, mappedInput, mappedOutputs, jsonStream, type ProviderErrorKind, type UpstreamAccount, type UpstreamMapping, type UpstreamResponse } from '../kit.ts';
import { jobStatus } from '../kit.ts';
import type { MappingRequest } from '../kit/mapping.ts';
import { readJsonWithMedia, topLevelString, type InlineMedia } from '../upstream-http.ts';

export function replicateAuth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_token ?? ''}` };
}

/** The model's mapping, or the member's misconfiguration (a catalog model sold on Replicate without one). */
export function mappingOf(job: { model: string; mapping?: UpstreamMapping }): UpstreamMapping {
  if (!job.mapping) {
    throw new ProviderError('misconfigured', `the catalog model '${job.model}' has no replicate mapping, so a Replicate member cannot run it (set one: models set-mapping ${job.model} --provider replicate --file <mapping.json>)`, { upstreamCode: 'no_mapping' });
  }
  return job.mapping;
}

/** Where a prediction of the endpoint is created, and the body's `version` when it names one. */
export function createPathOf(endpoint: string): { path: string; version?: string } {
  if (/^[a-f0-9]{64}$/.test(endpoint)) return { path: '/predictions', version: endpoint };
  const versioned = /^([^/:]+\/[^/:]+):([a-f0-9]{64})$/.exec(endpoint);
  if (versioned) return { path: '/predictions', version: versioned[2]! };
  const deployment = /^deployments\/([^/]+)\/([^/]+)$/.exec(endpoint);
  if (deployment) return { path: `/deployments/${deployment[1]}/${deployment[2]}/predictions` };
  const [owner, name] = endpoint.split('/');
  return { path: `/models/${owner}/${name}/predictions` };
}

export interface Prediction {
  id?: unknown;
  status?: unknown;
  output?: unknown;
  error?: unknown;
  logs?: unknown;
}

export interface ReplicateAnswer {
  status: number;
  headers: UpstreamResponse['headers'];
  body: unknown;
  /** The media of the data URLs a prediction held, by the token in their place in `body` (readJsonWithMedia). */
  media: ReadonlyMap<string, InlineMedia>;
  /** A create answer that could not be read whole: `body` is only the prediction's id, read from what came. */
  unread?: true;
}

/** A prediction as read, and the media of its data URLs. */
export interface PredictionAnswer {
  prediction: Prediction;
  media: ReadonlyMap<string, InlineMedia>;
  /** Only its id could be read (a create answer that could not be read whole): its state is read afresh. */
  unread?: true;
}

const NO_MEDIA: ReadonlyMap<string, InlineMedia> = new Map();

/**
 * One call to Replicate's API; a 2xx answer (a prediction) is read as one that may carry media, an
 * error answer as a short one. A prediction too large to read is final (`failed`: reading it again
 * reads the same), except the answer of a create that only accepted the job (`accepts`): like any
 * submit whose answer cannot be read, it may have been accepted (retryable, `maybeAccepted`).
 *
 * A create's answer (`creates`) that arrived but cannot be read whole (it breaks off, passes a
 * limit, or is no JSON past some point) is the prediction's id when that much of it could be read
 * (Replicate answers `id` first): the prediction exists, is paid for, and is looked at by its id
 * (`unread`), never created again nor left running unseen.
 */
export async function replicateCall(
  account: UpstreamAccount,
  call: { method: 'GET' | 'POST'; path: string; body?: { body: NonNullable<Parameters<typeof upstreamFetch>[1]['body']>; length: number }; headers?: Record<string, string>; timeoutMs?: number; accepts?: boolean; creates?: boolean },
  signal: AbortSignal,
  what: string,
): Promise<ReplicateAnswer> {
  const headers: Record<string, string> = { ...replicateAuth(account), Accept: 'application/json', ...call.headers };
  if (call.body) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(call.body.length);
  }
  const res = await upstreamFetch(upstreamUrl(account, call.path), { method: call.method, headers, body: call.body?.body, redirect: 'manual', timeoutMs: call.timeoutMs }, signal, what);
  if (res.ok) {
    let partial = '';
    const idOf = () => (call.creates && !signal.aborted ? topLevelString(partial, 'id') : undefined);
    const salvaged = (id: string): ReplicateAnswer => ({ status: res.status, headers: res.headers, body: { id }, media: NO_MEDIA, unread: true });
    try {
      const read = await readJsonWithMedia(res, what, undefined, (text) => (partial = text));
      const id = read.body === undefined ? idOf() : undefined;
      return id ? salvaged(id) : { status: res.status, headers: res.headers, ...read };
    } catch (err) {
      const id = idOf();
      if (id) return salvaged(id);
      throw call.accepts ? res.unreadAnswer(err) : err;
    }
  }
  return { status: res.status, headers: res.headers, body: await readJson(res), media: NO_MEDIA };
}

/** Problem details as one line: `detail`, and the fields a 422 names. */
function detailOf(body: unknown): string | undefined {
  const b = (body ?? {}) as { detail?: unknown; title?: unknown; invalid_fields?: unknown };
  const fields = Array.isArray(b.invalid_fields)
    ? b.invalid_fields.map((f) => {
        const { field, description } = (f ?? {}) as { field?: unknown; description?: unknown };
        return `${typeof field === 'string' ? `${field}: ` : ''}${typeof description === 'string' ? description : 'invalid'}`;
      })
    : [];
  if (fields.length) return fields.join('; ');
  if (typeof b.detail === 'string') return b.detail.replace(/^\s*-\s*/gm, '').trim();
  if (Array.isArray(b.detail)) return b.detail.map((d) => (typeof d === 'string' ? d : (d as { msg?: unknown })?.msg)).filter((d) => typeof d === 'string').join('; ');
  return typeof b.title === 'string' ? b.title : undefined;
}

/** A Replicate error answer as a ProviderError (`where`: the endpoint, for the operator). */
export function replicateError(answer: ReplicateAnswer, what: string, where: string): ProviderError {
  const { status, headers, body } = answer;
  const said = sanitizeMessage(detailOf(body), `HTTP ${status}`);
  const opts = { upstreamStatus: status };
  if (status === 422 || status === 400) return new ProviderError('misconfigured', `Replicate refused the input that the mapping made for ${where} (HTTP ${status}: ${said})`, opts);
  if (status === 402) return new ProviderError('account_disabled', `the Replicate account cannot pay for predictions (HTTP 402: ${said})`, opts);
  const kind: ProviderErrorKind = kindOfStatus(status);
  if (kind === 'auth') return new ProviderError('auth', `Replicate refused the member's API token (HTTP ${status}: ${said})`, opts);
  if (kind === 'misconfigured') return new ProviderError('misconfigured', `Replicate has no model ${where} (HTTP ${status}: ${said})`, opts);
  const wait = kind === 'rate_limited' ? retryAfterMs(headers) : undefined;
  return new ProviderError(kind, `the Replicate ${what} answered HTTP ${status} (${said})`, { ...opts, ...(wait !== undefined && { retryAfterMs: wait }) });
}

/** The mapping's input for a request; a mapping that fails on it is the operator's to fix. */
export async function inputOf(mapping: UpstreamMapping, request: MappingRequest): Promise<Record<string, unknown>> {
  try {
    return await mappedInput(mapping, request);
  } catch (err) {
    if (err instanceof MappingError && err.refusal) throw new ProviderError('invalid_request', err.message.replace(/\.$/, ''), { cause: err, upstreamCode: 'mapping_refusal' });
    if (err instanceof MappingError) throw new ProviderError('misconfigured', `the replicate mapping's '${err.path}' ${err.message.replace(/\.$/, '')}`, { cause: err, upstreamCode: 'mapping' });
    throw err;
  }
}

/** The shortest deadline Replicate takes (ASSUMPTION: the docs' minimum of 5 s; a longer one is harmless). */
const MIN_CANCEL_AFTER_SECONDS = 5;

/**
 * Replicate's prediction deadline (`Cancel-After`, a duration: "1m", "90s"; changelog 2025-10-16):
 * what is left until `deadline`, in whole seconds. Measured from the prediction's creation; at it a
 * prediction that has not started is `aborted` (not charged), a running one `canceled`.
 */
export function cancelAfterOf(deadline: Date, now = Date.now()): string {
  return `${Math.max(MIN_CANCEL_AFTER_SECONDS, Math.ceil((deadline.getTime() - now) / 1000))}s`;
}

/**
 * Creates a prediction; returns it (finished already when `wait` was long enough). `until`: the
 * task's deadline, sent as the prediction's (`cancelAfterOf`), so that one whose cancel at the
 * deadline got no answer does not run later, billed, for a refunded client.
 */
export async function createPrediction(account: UpstreamAccount, mapping: UpstreamMapping, input: Record<string, unknown>, signal: AbortSignal, what: string, wait?: number, until?: Date): Promise<PredictionAnswer & { id: string }> {
  const { path, version } = createPathOf(mapping.endpoint);
  const headers = { ...(wait && { Prefer: `wait=${wait}` }), ...(until && { 'Cancel-After': cancelAfterOf(until) }) };
  const answer = await replicateCall(
    account,
    // Waited for, the answer may be the prediction's end, its outputs inline.
    { method: 'POST', path, body: jsonStream(version ? { version, input } : { input }), creates: true, headers, ...(wait ? { timeoutMs: (wait + 30) * 1000 } : { accepts: true }) },
    signal,
    what,
  );
  if (answer.status < 200 || answer.status >= 300) throw replicateError(answer, what, mapping.endpoint);
  const prediction = (answer.body ?? {}) as Prediction;
  if (typeof prediction.id !== 'string' || prediction.id === '') throw new ProviderError('retryable', `the Replicate ${what} was accepted without a prediction id`, { maybeAccepted: true });
  return { id: prediction.id, prediction, media: answer.media, ...(answer.unread && { unread: true as const }) };
}

export async function getPrediction(account: UpstreamAccount, id: string, signal: AbortSignal, what: string): Promise<PredictionAnswer | { gone: true }> {
  const answer = await replicateCall(account, { method: 'GET', path: `/predictions/${encodeURIComponent(id)}` }, signal, what);
  // A prediction Replicate does not know (any more): asking again cannot help.
  if (answer.status === 404) return { gone: true };
  if (answer.status < 200 || answer.status >= 300) throw replicateError(answer, what, `prediction ${id}`);
  return { prediction: (answer.body ?? {}) as Prediction, media: answer.media };
}

export async function cancelPrediction(account: UpstreamAccount, id: string, signal: AbortSignal): Promise<void> {
  const answer = await replicateCall(account, { method: 'POST', path: `/predictions/${encodeURIComponent(id)}/cancel` }, signal, 'cancel');
  if ((answer.status >= 200 && answer.status < 300) || answer.status === 404) return;
  throw replicateError(answer, 'cancel', `prediction ${id}`);
}

const predictionState = jobStatus({ running: ['starting', 'processing'], succeeded: ['succeeded'], failed: ['failed', 'canceled', 'aborted'] }, 'Replicate prediction');

/** Replicate's error text for a refusal of its safety checker (Flux's "NSFW content detected", …). */
const POLICY = /nsfw|safety (checker|filter)|content (policy|moderation)|flagged as sensitive|sensitive content/i;

export type PredictionOutcome = { state: 'running' } | { state: 'failed'; error: ProviderError } | { state: 'succeeded'; outputs: (string | InlineMedia)[] };

/** A prediction's state, and for a succeeded one the outputs the mapping finds in it: URLs, or the media of its data URLs. */
export async function outcomeOf(answer: PredictionAnswer | { gone: true }, mapping: UpstreamMapping): Promise<PredictionOutcome> {
  if ('gone' in answer) return { state: 'failed', error: new ProviderError('failed', 'Replicate does not know this prediction (any more)', { upstreamStatus: 404 }) };
  // Only its id was read: the next look (getPrediction) says where it is.
  if (answer.unread) return { state: 'running' };
  const { prediction } = answer;
  const state = predictionState(prediction.status);
  if (state === 'running') return { state };
  if (state === 'failed') {
    const word = String(prediction.status);
    if (word === 'canceled') return { state, error: new ProviderError('failed', 'the Replicate prediction was canceled', { upstreamCode: word }) };
    if (word === 'aborted') return { state, error: new ProviderError('failed', 'Replicate aborted the prediction before it started', { upstreamCode: word }) };
    const reason = sanitizeMessage(typeof prediction.error === 'string' ? prediction.error : undefined, 'no reason given');
    const kind: ProviderErrorKind = POLICY.test(reason) ? 'policy' : 'failed';
    return { state, error: new ProviderError(kind, `the Replicate prediction failed (${reason})`, { upstreamCode: word }) };
  }
  let urls: string[];
  try {
    urls = await mappedOutputs(mapping, prediction);
  } catch (err) {
    if (err instanceof MappingError) return { state: 'failed', error: new ProviderError('misconfigured', `the replicate mapping's 'output' ${err.message.replace(/\.$/, '')}`, { upstreamCode: 'mapping', maybeAccepted: true }) };
    throw err;
  }
  if (urls.length === 0) return { state: 'failed', error: new ProviderError('misconfigured', `the replicate mapping's output '${mapping.output}' found no URL in the prediction of ${mapping.endpoint}`, { upstreamCode: 'mapping', maybeAccepted: true }) };
  return { state: 'succeeded', outputs: urls.map((url) => answer.media.get(url) ?? url) };
}
