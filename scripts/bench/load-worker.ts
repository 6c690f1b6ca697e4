/**
 * The load generator, run in a worker thread (its own event loop, so it never competes with the
 * server's): `connections` keep-alive connections to 127.0.0.1, each with one request in flight,
 * for a warm-up and then a measured window; stops by itself at the end of the window or after
 * `maxRequests` measured requests. Between the two phases no request is in flight: it posts
 * `{ type: 'warmed' }` and waits for 'go' (the parent resets its counters meanwhile); at the end it
 * waits for every request and posts `{ type: 'done', result }`.
 */
import { Agent, request } from 'node:http';
import { performance } from 'node:perf_hooks';
import { once } from 'node:events';
import { parentPort, workerData } from 'node:worker_threads';
import { summarize, type Summary } from './stats.ts';

export interface LoadSpec {
  port: number;
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  /** Request body; every `{{n}}` is replaced by a number unique within the run. */
  body?: string;
  connections: number;
  warmupMs: number;
  durationMs: number;
  maxRequests: number;
}

export interface LoadResult {
  summary: Summary;
  statuses: Record<string, number>;
  /** The first failure seen (status and body, or the network error). */
  firstError?: string;
}

const spec = workerData as LoadSpec;
const agent = new Agent({ keepAlive: true, maxSockets: spec.connections });
const latencies: number[] = [];
const statuses: Record<string, number> = {};
let errors = 0;
let firstError: string | undefined;
let seq = 0;

function send(): Promise<{ status: number; errorBody?: string }> {
  const body = spec.body?.replaceAll('{{n}}', String(++seq));
  const headers = body === undefined ? spec.headers : { ...spec.headers, 'Content-Length': String(Buffer.byteLength(body)) };
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: spec.port, method: spec.method, path: spec.path, headers, agent }, (res) => {
      const status = res.statusCode ?? 0;
      if (status < 400) {
        res.resume();
        res.on('end', () => resolve({ status }));
        return;
      }
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => resolve({ status, errorBody: text.slice(0, 500) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

let measuring = false;
let stopAt = performance.now() + spec.warmupMs;
let measureFrom = 0;
let lastDone = 0;

async function connectionLoop(): Promise<void> {
  while (performance.now() < stopAt && latencies.length + errors < spec.maxRequests) {
    const t0 = performance.now();
    let failure: string | undefined;
    let status = 'network error';
    try {
      const res = await send();
      status = String(res.status);
      if (res.status >= 400) failure = `HTTP ${res.status}: ${res.errorBody}`;
    } catch (err) {
      failure = (err as Error).message;
    }
    if (!measuring) continue;
    const t1 = performance.now();
    statuses[status] = (statuses[status] ?? 0) + 1;
    lastDone = t1;
    if (failure !== undefined) {
      errors++;
      firstError ??= failure;
    } else {
      latencies.push(t1 - t0);
    }
  }
}

const connections = () => Promise.all(Array.from({ length: spec.connections }, connectionLoop));
await connections(); // warm-up
parentPort!.postMessage({ type: 'warmed' });
await once(parentPort!, 'message'); // 'go'
measuring = true;
measureFrom = performance.now();
lastDone = measureFrom;
stopAt = measureFrom + spec.durationMs;
await connections();
agent.destroy();
const result: LoadResult = { summary: summarize(latencies, (lastDone - measureFrom) / 1000, errors), statuses, firstError };
parentPort!.postMessage({ type: 'done', result });
