import { expect } from 'vitest';

/** One request the fake expects, in order, and the response it answers with. */
export interface Exchange {
  method: 'GET' | 'POST';
  /** Path plus query, such as `/v1/videos/vid_1`. */
  path: string;
  /** Expected JSON body; omitted means the request must have none. */
  body?: unknown;
  /** Headers that must be present with these values (names case-insensitive). */
  headers?: Record<string, string>;
  respond: (request: Request) => Response | Promise<Response>;
  /** Answer every further request with this exchange too (polling). */
  repeat?: boolean;
}

export const API_KEY = 'mg_test_key';
export const BASE_URL = 'http://mediagate.test';

/**
 * A strict fake `fetch`: every request must be the next expected exchange (method, path, auth,
 * headers, exact JSON body); an unexpected request throws, so the helper under test rejects.
 */
export function strictFetch(exchanges: Exchange[]) {
  const queue = [...exchanges];
  const bodies: unknown[] = [];
  let calls = 0;
  async function fetch(request: Request): Promise<Response> {
    // Like real fetch: a request whose signal is already aborted never leaves.
    request.signal.throwIfAborted();
    calls += 1;
    const next = queue[0];
    if (next === undefined) throw new Error(`unexpected request ${request.method} ${request.url}`);
    if (!next.repeat) queue.shift();
    const url = new URL(request.url);
    expect(`${request.method} ${url.origin}${url.pathname}${url.search}`).toBe(`${next.method} ${BASE_URL}${next.path}`);
    expect(request.headers.get('authorization')).toBe(`Bearer ${API_KEY}`);
    for (const [name, value] of Object.entries(next.headers ?? {})) expect(request.headers.get(name)).toBe(value);
    if ('body' in next) {
      expect(request.headers.get('content-type')).toBe('application/json');
      const body: unknown = await request.json();
      bodies.push(body);
      expect(body).toEqual(next.body);
    } else {
      expect(request.body).toBeNull();
    }
    return next.respond(request);
  }
  return {
    fetch,
    /** JSON bodies received, in order. */
    bodies,
    get calls(): number {
      return calls;
    },
    /** Fails unless every non-repeating exchange was used. */
    assertDone(): void {
      expect(queue.filter((e) => !e.repeat)).toEqual([]);
    },
  };
}

export function jsonResponse(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json', 'X-Request-Id': 'req_test_1', ...headers },
  });
}

/** A response whose body arrives in the given chunks; `cancelled` turns true when the reader cancels. */
export function chunkedResponse(chunks: Uint8Array[], options: { keepOpen?: boolean } = {}) {
  const state = { cancelled: false, cancelReason: undefined as unknown };
  let index = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      const chunk = chunks[index++];
      if (chunk !== undefined) {
        controller.enqueue(chunk);
      } else if (!options.keepOpen) {
        controller.close();
      }
      // keepOpen: stay pending like a server that is still generating.
    },
    cancel(reason) {
      state.cancelled = true;
      state.cancelReason = reason;
    },
  });
  const response = new Response(stream, {
    status: 200,
    headers: { 'Content-Type': 'text/event-stream; charset=utf-8', 'X-Request-Id': 'req_stream_1' },
  });
  return { response, state };
}

/** Splits bytes into chunks of the given sizes (cycled), to cut lines, names and characters apart. */
export function splitBytes(bytes: Uint8Array, sizes: number[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  let offset = 0;
  let i = 0;
  while (offset < bytes.length) {
    const size = sizes[i++ % sizes.length] ?? 1;
    out.push(bytes.slice(offset, offset + size));
    offset += size;
  }
  return out;
}

/** One SSE frame as the server writes it. */
export function sseFrame(payload: { type: string }): string {
  return `event: ${payload.type}\ndata: ${JSON.stringify(payload)}\n\n`;
}
