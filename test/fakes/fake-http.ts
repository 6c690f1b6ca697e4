/**
 * What every fake upstream server shares: a loopback HTTP listener, a log of the requests it
 * received (for assertions about the wire format an adapter sent), a queue of injected faults per
 * route, and small body/JSON helpers. The fakes themselves follow
 * ../shared/reference/upstream-apis.md; they are never shaped to fit an adapter.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface RecordedRequest {
  method: string;
  /** Path without the query string. */
  path: string;
  query: URLSearchParams;
  headers: IncomingMessage['headers'];
  /** The raw body (multipart bodies included). */
  body: Buffer;
  /** Parsed JSON body, when the request was JSON. */
  json?: unknown;
  /** Parsed multipart fields and files, when the request was multipart (filled by the fake). */
  form?: { fields: Record<string, string[]>; files: { field: string; filename: string; mimeType: string; data: Buffer }[] };
  receivedAt: number;
}

/** A canned answer that replaces the fake's normal behaviour for one matching request. */
export interface Fault {
  status?: number;
  /** JSON, or a Buffer sent as it is (a proxy's HTML page): give its content-type in `headers`. */
  body?: unknown;
  headers?: Record<string, string>;
  /** Wait this long before answering (timeouts, slow upstreams). A fault with only a delay answers
   * normally after it (a slow but successful request). */
  delayMs?: number;
  /** Drop the connection without answering (connection reset). */
  destroy?: boolean;
  /**
   * Answer as usual (or with `status` and `body`), but drop the connection once this many bytes of
   * the body were sent: the upstream's headers (a 2xx) arrive, then the answer breaks off.
   */
  cutAfterBytes?: number;
}

/** Faults keyed by a route name of the fake (e.g. `create`, `poll`, `content`). */
export class FaultQueue {
  private readonly queues = new Map<string, Fault[]>();

  /** The next `times` requests of `route` get `fault`. */
  push(route: string, fault: Fault, times = 1): void {
    const q = this.queues.get(route) ?? [];
    for (let i = 0; i < times; i++) q.push(fault);
    this.queues.set(route, q);
  }

  take(route: string): Fault | undefined {
    return this.queues.get(route)?.shift();
  }

  clear(): void {
    this.queues.clear();
  }
}

export interface FakeServer {
  url: string;
  server: Server;
  requests: RecordedRequest[];
  faults: FaultQueue;
  close(): Promise<void>;
}

export async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), ...headers });
  res.end(text);
}

/**
 * Answers with an injected fault; resolves true when it answered (false: no fault, or only a delay
 * or a cut, and the fake answers itself).
 */
export async function applyFault(res: ServerResponse, fault: Fault | undefined): Promise<boolean> {
  if (!fault) return false;
  if (fault.delayMs) await new Promise((r) => setTimeout(r, fault.delayMs));
  if (fault.cutAfterBytes !== undefined) cutAfter(res, fault.cutAfterBytes);
  if (fault.status === undefined && fault.body === undefined && !fault.destroy) return false;
  if (fault.destroy) {
    res.socket?.destroy();
    return true;
  }
  if (Buffer.isBuffer(fault.body)) {
    res.writeHead(fault.status ?? 500, { 'content-type': 'application/octet-stream', 'content-length': String(fault.body.length), ...fault.headers });
    res.end(fault.body);
    return true;
  }
  sendJson(res, fault.status ?? 500, fault.body ?? {}, fault.headers ?? {});
  return true;
}

type WriteCallback = (err?: Error | null) => void;

/**
 * Makes `res` send only the first `limit` bytes of its body, then drop the connection (headers
 * first: they are sent even when the cut is at 0). Whatever the fake writes after the cut is
 * dropped, its callbacks still called, so a fake that waits for its writes carries on to its end.
 */
function cutAfter(res: ServerResponse, limit: number): void {
  const write = res.write.bind(res) as (chunk: Buffer, callback: WriteCallback) => boolean;
  const end = res.end.bind(res) as (callback?: () => void) => ServerResponse;
  let sent = 0;
  let cut = false;
  const send = (chunk: unknown, encoding: unknown, callback: WriteCallback | undefined): void => {
    const bytes = chunk === undefined || chunk === null ? Buffer.alloc(0) : typeof chunk === 'string' ? Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8') : Buffer.from(chunk as Uint8Array);
    if (cut) {
      if (callback) setImmediate(callback);
      return;
    }
    if (sent + bytes.length < limit) {
      sent += bytes.length;
      write(bytes, callback ?? (() => undefined));
      return;
    }
    cut = true;
    if (!res.headersSent) res.flushHeaders();
    write(bytes.subarray(0, limit - sent), () => {
      res.socket?.destroy();
      callback?.();
    });
  };
  /** write(chunk, [encoding], [callback]) and end([chunk], [encoding], [callback]), as Node takes them. */
  const split = (args: unknown[]): [unknown, unknown, WriteCallback | undefined] => {
    const callback = typeof args.at(-1) === 'function' ? (args.pop() as WriteCallback) : undefined;
    return [args[0], args[1], callback];
  };
  res.write = ((...args: unknown[]) => {
    send(...split(args));
    return !cut;
  }) as typeof res.write;
  res.end = ((...args: unknown[]) => {
    const [chunk, encoding, callback] = split(args);
    send(chunk, encoding, undefined);
    // An answer shorter than the cut ends as usual; a cut one never ends (its connection is dropped).
    if (!cut) return end(callback);
    if (callback) setImmediate(callback);
    return res;
  }) as typeof res.end;
}

/**
 * Starts a fake on 127.0.0.1 with a random port. `handle` gets each request with its body already
 * read and recorded; errors thrown by it become a 500 so a broken fake fails loudly.
 * `options.record` (default true): false keeps `requests` empty (benchmarks with thousands of
 * requests); `handle` still gets the `RecordedRequest` of the request at hand.
 */
export async function startFakeServer(
  handle: (req: IncomingMessage, res: ServerResponse, recorded: RecordedRequest, fake: FakeServer) => Promise<void> | void,
  options: { record?: boolean } = {},
): Promise<FakeServer> {
  const record = options.record ?? true;
  const requests: RecordedRequest[] = [];
  const faults = new FaultQueue();
  const fake = { requests, faults } as FakeServer;
  const server = createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url ?? '/', 'http://fake');
      const body = await readBody(req);
      const recorded: RecordedRequest = { method: req.method ?? 'GET', path: url.pathname, query: url.searchParams, headers: req.headers, body, receivedAt: Date.now() };
      if (/json/.test(String(req.headers['content-type'] ?? '')) && body.length > 0) {
        try {
          recorded.json = JSON.parse(body.toString('utf8'));
        } catch {
          // invalid JSON stays unparsed; the fake answers it as the upstream would
        }
      }
      if (record) requests.push(recorded);
      await handle(req, res, recorded, fake);
    })().catch((err: unknown) => {
      if (!res.headersSent) sendJson(res, 500, { fakeError: String(err) });
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 1000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  fake.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  fake.server = server;
  fake.close = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return fake;
}
