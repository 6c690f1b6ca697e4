import type { MediagateApi } from './api.ts';
import { MediagateError, MediagateNetworkError, sendRequest } from './mediagate-error.ts';
import type { FinishedVideoTask, VideoTask } from './types.ts';

/** Options of `waitForVideo`. */
export interface WaitForVideoOptions {
  /** Pause between two reads, in milliseconds (default 5000). */
  intervalMs?: number;
  /**
   * Give up after this many milliseconds (default 600000) with a `VideoWaitTimeoutError`;
   * `Infinity` waits without a deadline.
   */
  timeoutMs?: number;
  /** Aborting rejects at once (in-flight read and pause included) with the signal's reason. */
  signal?: AbortSignal;
}

/** The longest delay `setTimeout` takes: a longer one (`Infinity` too) fires at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** Bounds of the pause after reads that failed in a row without a `Retry-After`. */
const MIN_BACKOFF_MS = 500;
const MAX_BACKOFF_MS = 30_000;
/** What a reverse proxy answers, with its own body, when the gateway behind it is down or restarting. */
const PROXY_STATUSES = new Set([502, 504]);

/** Rejection of `waitForVideo` when the task did not finish within `timeoutMs`. */
export class VideoWaitTimeoutError extends Error {
  override readonly name = 'TimeoutError';
  /** The id that was polled. */
  readonly taskId: string;
  /** The last state read before giving up, if any read succeeded. */
  readonly lastTask: VideoTask | undefined;

  /** `cause`: the error of the last read when it failed (a 503, no answer), else undefined. */
  constructor(taskId: string, timeoutMs: number, lastTask: VideoTask | undefined, lastError?: unknown) {
    super(
      `Video task ${taskId} did not finish within ${timeoutMs} ms (last status: ${lastTask?.status ?? 'unknown'}${
        lastError instanceof Error ? `; last read failed: ${lastError.message}` : ''
      })`,
      lastError === undefined ? undefined : { cause: lastError },
    );
    this.taskId = taskId;
    this.lastTask = lastTask;
  }
}

/**
 * Polls `GET /v1/videos/{id}` until the task is `completed` or `failed` and resolves with it; a
 * failed task is a result (read `error.message`), not a rejection. A read that fails for a passing
 * reason (`503`, such as `database_unavailable` or `not_ready` while the gateway restarts; a `502`
 * or `504` of a proxy in front of it, whose body is not a Mediagate error; or no answer at all) is
 * retried after its `Retry-After`, else after a growing pause, until the deadline.
 * Rejects with `MediagateError` on any other HTTP error (`404 task_not_found`, `401`, …),
 * `VideoWaitTimeoutError` after `timeoutMs`, and the signal's reason (an `AbortError` by default)
 * when `signal` aborts.
 */
export async function waitForVideo(
  api: MediagateApi,
  id: string,
  options: WaitForVideoOptions = {},
): Promise<FinishedVideoTask> {
  const { intervalMs = 5_000, timeoutMs = 600_000, signal } = options;
  if (Number.isNaN(timeoutMs)) throw new RangeError('timeoutMs must be a number of milliseconds or Infinity');
  signal?.throwIfAborted();

  const deadline = new AbortController();
  // Infinity means no deadline; a finite value over setTimeout's limit is clamped to it (24.8 days).
  const timer = timeoutMs === Infinity ? undefined : setTimeout(() => deadline.abort(), Math.min(timeoutMs, MAX_TIMER_MS));
  const stop = signal ? AbortSignal.any([signal, deadline.signal]) : deadline.signal;
  let lastTask: VideoTask | undefined;
  let lastError: unknown;
  let failures = 0;
  try {
    for (;;) {
      const read = await readTask(api, id, stop);
      if ('task' in read) {
        lastTask = read.task;
        lastError = undefined;
        failures = 0;
        if (isFinished(read.task)) return read.task;
        await sleep(intervalMs, stop);
      } else {
        lastError = read.retry;
        failures += 1;
        const retryAfterMs = read.retry instanceof MediagateError ? read.retry.retryAfterMs : undefined;
        await sleep(retryAfterMs ?? backoff(intervalMs, failures), stop);
      }
    }
  } catch (err) {
    // The caller's abort wins over the deadline; both win over the error they caused in fetch.
    if (signal?.aborted) throw signal.reason;
    if (deadline.signal.aborted) throw new VideoWaitTimeoutError(id, timeoutMs, lastTask, lastError);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** One read: the task, or a failure worth retrying. Other failures throw. */
async function readTask(
  api: MediagateApi,
  id: string,
  stop: AbortSignal,
): Promise<{ task: VideoTask } | { retry: MediagateError | MediagateNetworkError }> {
  let read;
  try {
    read = await sendRequest((middleware) => api.GET('/v1/videos/{id}', { params: { path: { id } }, signal: stop, middleware }), stop);
  } catch (err) {
    if (err instanceof MediagateNetworkError) return { retry: err };
    throw err;
  }
  const { data, error, response } = read;
  if (response.ok && data !== undefined) {
    // Readable<> of openapi-typescript-helpers drops keys typed exactly `null`; see create-video.ts.
    return { task: data as VideoTask };
  }
  const failure = MediagateError.fromResponse(response, error);
  // 503 is this read's only passing error (`database_unavailable`, `not_ready`, a restart); a read
  // changes nothing, so any 503 is retried. So is a 502 or 504 that is not Mediagate's (no error
  // code): a proxy in front of it (nginx, a load balancer) answers so while the gateway restarts.
  // Other errors (404, 401, 403, 400, 500) would recur.
  if (failure.status === 503 || (PROXY_STATUSES.has(failure.status) && failure.code === null)) return { retry: failure };
  throw failure;
}

/** The pause after `failures` failed reads in a row: the interval (500 ms at least), doubled each time. */
function backoff(intervalMs: number, failures: number): number {
  const ms = Math.min(Math.max(intervalMs, MIN_BACKOFF_MS) * 2 ** (failures - 1), Math.max(MAX_BACKOFF_MS, intervalMs));
  // Between half and all of it, so that waiters cut off by one restart do not come back in step.
  return ms * (0.5 + Math.random() / 2);
}

function isFinished(task: VideoTask): task is FinishedVideoTask {
  return task.status === 'completed' || task.status === 'failed';
}

/** Resolves after `ms` (at most setTimeout's limit); rejects with the reason when `signal` aborts. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal === undefined) {
      setTimeout(resolve, Math.min(ms, MAX_TIMER_MS));
      return;
    }
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, Math.min(ms, MAX_TIMER_MS));
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
