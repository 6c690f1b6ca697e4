import type { MediagateApi } from './api.ts';
import { MediagateError } from './mediagate-error.ts';
import type { FinishedVideoTask, VideoTask } from './types.ts';

/** Options of `waitForVideo`. */
export interface WaitForVideoOptions {
  /** Pause between two reads, in milliseconds (default 5000). */
  intervalMs?: number;
  /** Give up after this many milliseconds (default 600000) with a `VideoWaitTimeoutError`. */
  timeoutMs?: number;
  /** Aborting rejects at once (in-flight read and pause included) with the signal's reason. */
  signal?: AbortSignal;
}

/** Rejection of `waitForVideo` when the task did not finish within `timeoutMs`. */
export class VideoWaitTimeoutError extends Error {
  override readonly name = 'TimeoutError';
  /** The id that was polled. */
  readonly taskId: string;
  /** The last state read before giving up, if any read succeeded. */
  readonly lastTask: VideoTask | undefined;

  constructor(taskId: string, timeoutMs: number, lastTask: VideoTask | undefined) {
    super(`Video task ${taskId} did not finish within ${timeoutMs} ms (last status: ${lastTask?.status ?? 'unknown'})`);
    this.taskId = taskId;
    this.lastTask = lastTask;
  }
}

/**
 * Polls `GET /v1/videos/{id}` until the task is `completed` or `failed` and resolves with it; a
 * failed task is a result (read `error.message`), not a rejection. Rejects with `MediagateError`
 * on an HTTP error, `VideoWaitTimeoutError` after `timeoutMs`, and the signal's reason (an
 * `AbortError` by default) when `signal` aborts.
 */
export async function waitForVideo(
  api: MediagateApi,
  id: string,
  options: WaitForVideoOptions = {},
): Promise<FinishedVideoTask> {
  const { intervalMs = 5_000, timeoutMs = 600_000, signal } = options;
  signal?.throwIfAborted();

  const deadline = new AbortController();
  const timer = setTimeout(() => deadline.abort(), timeoutMs);
  const stop = signal ? AbortSignal.any([signal, deadline.signal]) : deadline.signal;
  let lastTask: VideoTask | undefined;
  try {
    for (;;) {
      const { data, error, response } = await api.GET('/v1/videos/{id}', { params: { path: { id } }, signal: stop });
      if (!response.ok || data === undefined) throw MediagateError.fromResponse(response, error);
      // Readable<> of openapi-typescript-helpers drops keys typed exactly `null`; see create-video.ts.
      const task = data as VideoTask;
      lastTask = task;
      if (isFinished(task)) return task;
      await sleep(intervalMs, stop);
    }
  } catch (err) {
    // The caller's abort wins over the deadline; both win over the error they caused in fetch.
    if (signal?.aborted) throw signal.reason;
    if (deadline.signal.aborted) throw new VideoWaitTimeoutError(id, timeoutMs, lastTask);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

function isFinished(task: VideoTask): task is FinishedVideoTask {
  return task.status === 'completed' || task.status === 'failed';
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
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
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
