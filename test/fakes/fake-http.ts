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
  body?: unknown;
  headers?: Record<string, string>;
  /** Wait this long before answering (timeouts, slow upstreams). A fault with only a delay answers
   * normally after it (a slow but successful request). */
  delayMs?: number;
  /** Drop the connection without answering (connection reset). */
  destroy?: boolean;
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

/** Answers with an injected fault; resolves true when it answered (false: no fault, or only a delay). */
export async function applyFault(res: ServerResponse, fault: Fault | undefined): Promise<boolean> {
  if (!fault) return false;
  if (fault.delayMs) await new Promise((r) => setTimeout(r, fault.delayMs));
  if (fault.status === undefined && fault.body === undefined && !fault.destroy) return false;
  if (fault.destroy) {
    res.socket?.destroy();
    return true;
  }
  sendJson(res, fault.status ?? 500, fault.body ?? {}, fault.headers ?? {});
  return true;
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
