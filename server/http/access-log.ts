/**
 * One `close` listener per request for the access log line and the Prometheus metrics. A 503 (the
 * database or the upstreams are away, a switch is off) is a warning, not an error: it says what it
 * is, and the lines of the cause are logged once where it is met. Measured
 * on the poll path: pino-http (a child logger and serializers per request) cost ~40% of throughput,
 * and prom-client's per-call label hashing ~30%; this logs one flat line and reuses metric children.
 *
 * A handler adds what the request did to its line (`logWith`): a synchronous image request's line
 * carries its task, model and charge, and is the only line such a request writes at `info`
 * (docs/BENCHMARKS.md, seventh look: three lines a request added 2–3 ms at concurrency 1 there),
 * unless its client left before it settled: the line went out when the connection closed, so the
 * charge is logged on a line of its own (`logWith` says so).
 *
 * The `operation` label is the operationId the validator (or a fast path) matched; a request refused
 * before it (401, 429, 413, 408, 415, 503 server_busy) is labelled by its method and path in the
 * contract (`operationMatcher`), and only a request the contract has no operation for is `unmatched`.
 */
import type { NextFunction, Request, Response } from 'express';
import type { Counter, Histogram } from 'prom-client';
import type { Logger } from '../logger.ts';
import type { Metrics } from '../metrics.ts';
import type { OpenApiDocument } from '../openapi.ts';

type CounterChild = ReturnType<Counter<'operation' | 'method' | 'status'>['labels']>;
type HistogramChild = ReturnType<Histogram<'operation' | 'method'>['labels']>;

/**
 * Adds `fields` to the access log line of `res`'s request (later fields win), kept in `res.locals`
 * until it closes. False when the line was already written (the client left first: the response
 * closed with it), so a caller whose fields matter logs them on a line of their own.
 */
export function logWith(res: Response, fields: Record<string, unknown>): boolean {
  res.locals.logFields = Object.assign((res.locals.logFields as Record<string, unknown> | undefined) ?? {}, fields);
  return res.locals.logWritten !== true;
}

/**
 * The operationId of a method and path in `spec`, as the validator would match them (a path without
 * parameters before one with them), or undefined: the label stays one of the contract's operations.
 */
export function operationMatcher(spec: OpenApiDocument): (method: string, path: string) => string | undefined {
  const routes = Object.entries(spec.paths)
    .map(([path, item]) => ({
      item,
      params: path.split('{').length - 1,
      regexp: new RegExp(`^${path.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\{[^}/]+\}/g, '[^/]+')}$`),
    }))
    .sort((a, b) => a.params - b.params);
  return (method, path) => {
    const verb = method.toLowerCase() as keyof OpenApiDocument['paths'][string];
    for (const route of routes) {
      // HEAD is served as GET where the contract declares no HEAD of its own (Express's default).
      const operationId = route.regexp.test(path) ? (route.item[verb] ?? (verb === 'head' ? route.item.get : undefined))?.operationId : undefined;
      if (operationId) return operationId;
    }
    return undefined;
  };
}

export function accessLog(log: Logger, metrics: Metrics, operationOf: (req: Request) => string | undefined) {
  const counters = new Map<string, CounterChild>();
  const histograms = new Map<string, HistogramChild>();
  const counter = (operation: string, method: string, status: string) => {
    const key = `${operation} ${method} ${status}`;
    let child = counters.get(key);
    if (!child) counters.set(key, (child = metrics.httpRequests.labels(operation, method, status)));
    return child;
  };
  const histogram = (operation: string, method: string) => {
    const key = `${operation} ${method}`;
    let child = histograms.get(key);
    if (!child) histograms.set(key, (child = metrics.httpDuration.labels(operation, method)));
    return child;
  };

  return (req: Request, res: Response, next: NextFunction): void => {
    const started = process.hrtime.bigint();
    const socket = req.socket;
    const bytesBefore = socket.bytesWritten;
    // 'close' comes for every response, finished or not (after 'finish' when it finished), so every
    // request gets exactly one line.
    res.once('close', () => {
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      res.locals.logWritten = true;
      const operation = operationOf(req) ?? 'unmatched';
      // A response abandoned before its head went out has no status of its own (statusCode is still
      // the default 200): nginx's 499, client closed request.
      const status = res.headersSent ? res.statusCode : 499;
      counter(operation, req.method, String(status)).inc();
      histogram(operation, req.method).observe(seconds);
      const line = {
        reqId: (req as Request & { id?: string }).id,
        method: req.method,
        // The path only: query strings may carry file signatures.
        path: req.path,
        status,
        operation,
        ms: Math.round(seconds * 1e4) / 10,
        ...(res.locals.logFields as Record<string, unknown> | undefined),
      };
      const bytesSent = socket.bytesWritten - bytesBefore;
      if (res.writableEnded || sentWhole(res, bytesSent)) {
        if (status >= 500 && status !== 503) log.error(line, 'request');
        else if (status >= 400) log.warn(line, 'request');
        else log.info(line, 'request');
      } else {
        // The client closed its connection first: what it is, not a failure of the server.
        log.info({ ...line, bytesSent }, 'client went away before the response ended');
      }
    });
    next();
  };
}

/**
 * Whether every byte of a response with a Content-Length went to the socket: a client that closes
 * the connection at the last byte (as it may, having all it asked for) can do so before the file
 * stream behind the response has even ended, and is no different from one that waited. The header
 * block's size is Node's own record of what it wrote first (`_header`, which on-headers and morgan
 * read too).
 */
function sentWhole(res: Response, bytesSent: number): boolean {
  const length = Number(res.getHeader('content-length'));
  const header = (res as Response & { _header?: string | null })._header;
  return Number.isFinite(length) && typeof header === 'string' && bytesSent >= Buffer.byteLength(header) + length;
}
