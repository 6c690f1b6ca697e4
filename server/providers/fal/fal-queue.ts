/**
 * The calls of fal's queue (fal-api.ts) that both adapters make: submit a mapped input, one status
 * check, the result's outputs as the mapping finds them, cancel.
 *
 * Status words: fal-js polls until `COMPLETED` only, and a request that failed still reaches
 * `COMPLETED` (its failure is the result's error answer). LiteLLM's fal adapter also reads `FAILED`
 * and `CANCELLED` and any `error` field on the status body (§10.1); both are read here (`ERROR` and
 * `CANCELED` too): a word not in the list is retried, not guessed.
 */
import { ProviderError, jobStatus, jsonStream, mappedInput, mappedOutputs, sanitizeMessage, MappingError, type UpstreamAccount, type UpstreamMapping } from '../kit.ts';
import type { MappingRequest } from '../kit/mapping.ts';
import type { InlineMedia } from '../upstream-http.ts';
import { falCall, falError, falFailure, jobIdOf, parseJobId, type FalAnswer } from './fal-api.ts';

const falStatus = jobStatus({ running: ['IN_QUEUE', 'IN_PROGRESS'], succeeded: ['COMPLETED'], failed: ['FAILED', 'ERROR', 'CANCELLED', 'CANCELED'] }, 'fal request');

/** The mapping's input for a request; a mapping that fails on it is the operator's to fix. */
export async function inputOf(mapping: UpstreamMapping, request: MappingRequest): Promise<Record<string, unknown>> {
  try {
    return await mappedInput(mapping, request);
  } catch (err) {
    if (err instanceof MappingError && err.refusal) throw new ProviderError('invalid_request', err.message.replace(/\.$/, ''), { cause: err, upstreamCode: 'mapping_refusal' });
    if (err instanceof MappingError) throw new ProviderError('misconfigured', `the fal mapping's '${err.path}' ${err.message.replace(/\.$/, '')}`, { cause: err, upstreamCode: 'mapping' });
    throw err;
  }
}

/**
 * fal's start timeout (`X-Fal-Request-Timeout`, seconds; docs.fal.ai platform headers: "> 0.1"):
 * what is left until `deadline`, in whole seconds. It bounds the queue wait (and fal's own retries)
 * only, never a request that started: fal then ends a request still queued when the gateway gives
 * its task up, and one it started runs to its end.
 */
export function startTimeoutOf(deadline: Date, now = Date.now()): string {
  return String(Math.max(1, Math.ceil((deadline.getTime() - now) / 1000)));
}

/**
 * Submits the input to the mapping's endpoint; returns the job id (`{owner}/{app}/{request_id}`).
 * `startBy`: the task's deadline, sent as the request's start timeout (`startTimeoutOf`).
 */
export async function falSubmit(account: UpstreamAccount, mapping: UpstreamMapping, input: Record<string, unknown>, signal: AbortSignal, what: string, startBy?: Date): Promise<string> {
  const headers = startBy ? { 'X-Fal-Request-Timeout': startTimeoutOf(startBy) } : undefined;
  const answer = await falCall(account, { method: 'POST', path: `/${mapping.endpoint}`, body: jsonStream(input), headers }, signal, what);
  if (answer.status < 200 || answer.status >= 300) throw falError(answer, what, mapping.endpoint);
  const id = (answer.body as { request_id?: unknown } | undefined)?.request_id;
  if (typeof id !== 'string' || id === '') throw new ProviderError('retryable', `the fal ${what} was accepted without a request id`, { maybeAccepted: true });
  return jobIdOf(mapping.endpoint, id);
}

export type FalProgress = { state: 'running'; queuePosition?: number } | { state: 'completed'; error?: ProviderError } | { state: 'failed'; error: ProviderError };

/**
 * One status check (`?logs=0`: the logs fal may send anyway are not read). A request that ended
 * (COMPLETED, or FAILED/ERROR where fal says so) is `completed`, with the status body's error if it
 * has one: its result says more (a 422's `detail[]`). A cancelled one has no result to read.
 */
export async function falStatusOf(account: UpstreamAccount, jobId: string, signal: AbortSignal, what: string): Promise<FalProgress> {
  const { app, requestId } = parseJobId(jobId);
  const answer = await falCall(account, { method: 'GET', path: `/${app}/requests/${encodeURIComponent(requestId)}/status?logs=0` }, signal, what);
  if (answer.status === 404) return { state: 'failed', error: new ProviderError('failed', `fal does not know the request ${requestId} (any more)`, { upstreamStatus: 404 }) };
  if (answer.status < 200 || answer.status >= 300) throw falError(answer, what, app);
  const body = (answer.body ?? {}) as { status?: unknown; queue_position?: unknown; error?: unknown; error_type?: unknown };
  const state = falStatus(body.status);
  if (state === 'running') return { state: 'running', ...(typeof body.queue_position === 'number' && { queuePosition: body.queue_position }) };
  const word = String(body.status);
  const code = typeof body.error_type === 'string' ? body.error_type : word;
  if (word === 'CANCELLED' || word === 'CANCELED') return { state: 'failed', error: new ProviderError('failed', 'the fal request was cancelled', { upstreamCode: code }) };
  if (state === 'succeeded' && !body.error) return { state: 'completed' };
  const reason = sanitizeMessage(typeof body.error === 'string' ? body.error : undefined, `the request ended ${word}`);
  return { state: 'completed', error: new ProviderError('failed', `fal reported the request failed (${reason})`, { upstreamCode: code }) };
}

/**
 * The outputs of a completed request, as the mapping's `output` finds them in its result: URLs,
 * or the media of data URLs (`sync_mode`), decoded while the result was read. A result that is an
 * error answer is the request's failure (returned, not thrown): fal's error body, whatever its
 * status (`falFailure`: a model's 500 internal_server_error is as final as a 422); only a bare 429
 * or 5xx of fal's edge, which may pass, is thrown to be asked again. So is the key refused. A result
 * too large to read is thrown as `failed` (readJsonWithMedia): reading it again would only download
 * it again.
 */
export async function falResult(account: UpstreamAccount, jobId: string, mapping: UpstreamMapping, signal: AbortSignal, what: string): Promise<{ outputs: (string | InlineMedia)[] } | { error: ProviderError }> {
  const { app, requestId } = parseJobId(jobId);
  const answer: FalAnswer = await falCall(account, { method: 'GET', path: `/${app}/requests/${encodeURIComponent(requestId)}` }, signal, what, 'media');
  if (answer.status < 200 || answer.status >= 300) {
    const error = falError(answer, what, mapping.endpoint);
    // The request has ended: only what may pass (a rate limit, fal's edge failing, the key) is asked again.
    if (error.kind === 'auth' || error.kind === 'account_disabled') throw error;
    if (answer.status === 404) return { error: new ProviderError('failed', `fal no longer has the result of request ${requestId}`, { upstreamStatus: 404 }) };
    if (!error.transient) return { error };
    const failure = falFailure(answer);
    if (!failure) throw error;
    return { error: failure };
  }
  // The request ran, billed: a result the mapping finds nothing in is the mapping's (the operator's)
  // to fix, and never a reason to run the request again on another member (maybe accepted).
  let urls: string[];
  try {
    urls = await mappedOutputs(mapping, answer.body);
  } catch (err) {
    if (err instanceof MappingError) return { error: new ProviderError('misconfigured', `the fal mapping's 'output' ${err.message.replace(/\.$/, '')}`, { upstreamCode: 'mapping', maybeAccepted: true }) };
    throw err;
  }
  if (urls.length === 0) return { error: new ProviderError('misconfigured', `the fal mapping's output '${mapping.output}' found no URL in the result of ${mapping.endpoint}`, { upstreamCode: 'mapping', maybeAccepted: true }) };
  return { outputs: urls.map((url) => answer.media.get(url) ?? url) };
}

/** Cancels a request (best effort): a request already finished or unknown is no error. */
export async function falCancel(account: UpstreamAccount, jobId: string, signal: AbortSignal): Promise<void> {
  const { app, requestId } = parseJobId(jobId);
  const answer = await falCall(account, { method: 'PUT', path: `/${app}/requests/${encodeURIComponent(requestId)}/cancel` }, signal, 'cancel');
  const word = (answer.body as { status?: unknown } | undefined)?.status;
  if (answer.status >= 200 && answer.status < 300) return;
  if (word === 'ALREADY_COMPLETED' || word === 'NOT_FOUND' || answer.status === 404) return;
  throw falError(answer, 'cancel', app);
}
