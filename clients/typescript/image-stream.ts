import { createParser, type EventSourceMessage } from 'eventsource-parser';
import type { Middleware } from 'openapi-fetch';
import type { MediagateApi } from './api.ts';
import { isPassing, retryDelay } from './create-video.ts';
import { MediagateError, MediagateNetworkError, readBody, sendRequest } from './mediagate-error.ts';
import { sleep } from './wait-for-video.ts';
import type {
  ImageEditStreamEvent,
  ImageEditStreamRequest,
  ImageGenerationStreamEvent,
  ImageStreamRequest,
} from './types.ts';

/** Options of the streaming helpers. */
export interface ImageStreamOptions {
  /** Aborts the request or the running stream; the iterator then throws the signal's reason. */
  signal?: AbortSignal;
  /**
   * How many times a request refused before its stream began, for a passing reason that charged
   * nothing (`429`, `507`, `503` `no_upstream_capacity` / `database_unavailable` / `not_ready` /
   * `server_busy` / `storage_unavailable`), is sent again after its `Retry-After` (default 2; 0
   * turns retries off). Never after the stream began, nor after no answer came (images may have
   * been delivered and charged).
   */
  maxRetries?: number;
}

/** Whether a refusal before the stream began charged nothing and may pass: `createVideo`'s list, and no free upstream account. */
function isPassingRefusal(error: MediagateError): boolean {
  return isPassing(error) || (error.status === 503 && error.code === 'no_upstream_capacity');
}

/** What the openapi-fetch call of a streaming helper resolves to (`parseAs: 'stream'`). */
interface OpenedStream {
  data?: ReadableStream<Uint8Array> | null;
  error?: unknown;
  response: Response;
}

function isGenerationEvent(payload: { type: string }): payload is ImageGenerationStreamEvent {
  return payload.type === 'image_generation.partial_image' || payload.type === 'image_generation.completed';
}

function isEditEvent(payload: { type: string }): payload is ImageEditStreamEvent {
  return payload.type === 'image_edit.partial_image' || payload.type === 'image_edit.completed';
}

/**
 * Streams `POST /v1/images/generations` (`stream: true`). Yields the partial and completed events
 * in arrival order; throws `MediagateError` on a non-2xx answer and on an `event: error` frame, and
 * `MediagateNetworkError` when no answer came or the connection broke off (after yielding the
 * events that did arrive). A stream that ends cleanly after fewer completed events than `n` is the
 * server's whole answer: the upstream returned fewer images, and only those are charged. Leaving
 * the loop early (`break`, `return`, a throw) cancels the response body, so the server stops the
 * work and releases the credits of the images not delivered.
 */
export function streamImage(
  api: MediagateApi,
  body: ImageStreamRequest,
  options: ImageStreamOptions = {},
): AsyncGenerator<ImageGenerationStreamEvent, void, undefined> {
  const open = (middleware: Middleware[]): Promise<OpenedStream> =>
    api.POST('/v1/images/generations', {
      body: { ...body, stream: true },
      headers: { Accept: 'text/event-stream' },
      parseAs: 'stream',
      signal: options.signal,
      middleware,
    });
  return readImageStream(open, isGenerationEvent, options);
}

/**
 * Streams `POST /v1/images/edits` with a JSON body (`stream: true`); same behaviour as
 * `streamImage`, with `image_edit.*` events. Multipart uploads are not streamed by this helper.
 */
export function streamImageEdit(
  api: MediagateApi,
  body: ImageEditStreamRequest,
  options: ImageStreamOptions = {},
): AsyncGenerator<ImageEditStreamEvent, void, undefined> {
  const open = (middleware: Middleware[]): Promise<OpenedStream> =>
    api.POST('/v1/images/edits', {
      body: { ...body, stream: true },
      headers: { Accept: 'text/event-stream' },
      parseAs: 'stream',
      signal: options.signal,
      middleware,
    });
  return readImageStream(open, isEditEvent, options);
}

async function* readImageStream<E extends { type: string }>(
  open: (middleware: Middleware[]) => Promise<OpenedStream>,
  accepts: (payload: { type: string }) => payload is E,
  options: ImageStreamOptions,
): AsyncGenerator<E, void, undefined> {
  const { signal, maxRetries = 2 } = options;
  if (!(maxRetries >= 0)) throw new RangeError('maxRetries must be 0 or more');
  let opened: OpenedStream;
  for (let attempt = 0; ; attempt += 1) {
    opened = await sendRequest(open, signal);
    if (opened.response.ok) break;
    const failure = MediagateError.fromResponse(opened.response, opened.error);
    const delayMs = retryDelay(failure, attempt, maxRetries, isPassingRefusal);
    if (delayMs === undefined) throw failure;
    await sleep(delayMs, signal);
  }
  const { data: stream, response } = opened;
  const contentType = response.headers.get('Content-Type') ?? '';
  if (!stream || !contentType.startsWith('text/event-stream')) {
    await stream?.cancel();
    throw protocolError(response, `Expected a text/event-stream response, got '${contentType || 'no body'}'`, null);
  }

  const frames: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (frame) => frames.push(frame) });
  const decoder = new TextDecoder();
  const reader = stream.getReader();
  let finished = false;
  /** The last text fed: whether the stream ended on a CR. */
  let last = '';
  try {
    for (;;) {
      let frame: EventSourceMessage | undefined;
      while ((frame = frames.shift()) !== undefined) {
        const event = readFrame(response, frame, accepts);
        if (event !== undefined) yield event;
      }
      if (finished) break;
      const chunk = await readBody(() => reader.read(), signal);
      if (chunk.done) {
        finished = true;
        // Flush a multi-byte character split at the very end. A last line ended by a lone CR is
        // complete (the parser waits to see whether an LF follows it); an unterminated last frame
        // is still dropped, as the SSE rules require (no blank line after it).
        const rest = decoder.decode();
        if (rest !== '') last = rest;
        parser.feed(last.endsWith('\r') ? `${rest}\n` : rest);
      } else {
        const text = decoder.decode(chunk.value, { stream: true });
        if (text !== '') last = text;
        parser.feed(text);
      }
    }
  } finally {
    // Runs on break/return/throw too: cancelling closes the connection, which the server
    // treats as a client disconnect.
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

function readFrame<E extends { type: string }>(
  response: Response,
  frame: EventSourceMessage,
  accepts: (payload: { type: string }) => payload is E,
): E | undefined {
  let payload: unknown;
  try {
    payload = JSON.parse(frame.data);
  } catch {
    throw protocolError(response, `Malformed image stream frame (event '${frame.event ?? ''}')`, frame.data);
  }
  const type = isTyped(payload) ? payload.type : undefined;
  if (frame.event === 'error' || type === 'error') throw MediagateError.fromStreamFrame(response, payload);
  if (!isTyped(payload)) throw protocolError(response, 'Image stream frame without a type', frame.data);
  // Event types newer than this client are skipped rather than surfaced untyped.
  return accepts(payload) ? payload : undefined;
}

function isTyped(payload: unknown): payload is { type: string } {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    'type' in payload &&
    typeof (payload as { type: unknown }).type === 'string'
  );
}

function protocolError(response: Response, message: string, body: unknown): MediagateError {
  return new MediagateError({
    status: response.status,
    message,
    code: null,
    param: null,
    type: null,
    requestId: response.headers.get('X-Request-Id'),
    body,
  });
}
