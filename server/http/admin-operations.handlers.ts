/** Admin: the ledger and webhook deliveries of every account, and usage reports (JSON or CSV). */
import type { Request, Response } from 'express';
import { Readable } from 'node:stream';
import type { AppContext } from '../context.ts';
import { ApiError } from '../errors.ts';
import { pipeBounded, type StalledClient } from '../lib/base64-json.ts';
import { Semaphore } from '../lib/semaphore.ts';
import { USAGE_CSV_HEADER, usageCsvLines, type UsageReport } from '../services/admin/usage.service.ts';
import { noStore } from './auth.ts';
import { clientGone } from './request-guards.ts';
import { sendJson, type HandlerMap, type Schemas } from './types.ts';

export function adminOperationsHandlers(ctx: AppContext): Pick<HandlerMap, 'listLedgerEntries' | 'listWebhookDeliveries' | 'getUsage'> {
  const admin = ctx.services.admin;
  /**
   * A report's rows are read while its client takes them, holding a connection of the pool and a
   * transaction: a client that takes nothing for as long as a download's (ten times
   * STREAM_WRITE_IDLE_MS) is cut off, and its report ended.
   */
  const idleMs = ctx.config.streamWriteIdleMs * 10;
  /**
   * Reports read at once by this instance: each holds a connection of the pool (and a snapshot) for
   * as long as its client reads, and the pool serves every client request and the task engines
   * too. A quarter of it at most (one at least); past that `503 server_busy`, before any statement.
   */
  const maxReports = Math.max(1, Math.floor(ctx.config.dbPoolMax / 4));
  const reports = new Semaphore(maxReports);
  return {
    async listLedgerEntries(req, res) {
      sendJson(res, 'listLedgerEntries', 200, await admin.ledger.list(req.query));
    },
    async listWebhookDeliveries(req, res) {
      sendJson(res, 'listWebhookDeliveries', 200, await admin.webhooks.list(req.query));
    },
    async getUsage(req, res) {
      const report = await admin.usage.report(req.query);
      const release = reports.tryAcquire();
      if (!release) {
        throw new ApiError(503, 'server_busy', `${maxReports} usage report${maxReports === 1 ? ' is' : 's are'} being read from this instance; retry in ${REPORT_RETRY_AFTER_SECONDS} s.`, null, {}, { 'Retry-After': String(REPORT_RETRY_AFTER_SECONDS) });
      }
      const reqId = (req as Request & { id?: string }).id;
      // A client gone before its report ended (the first batch waits for the whole statement): the
      // statement is cancelled and the slot given back now, not when the statement would have ended.
      const gone = clientGone(req, res);
      try {
        // JSON unless the client prefers CSV (Accept: text/csv).
        await sendUsage(res, report, req.accepts(['application/json', 'text/csv']) === 'text/csv', idleMs, gone, (err) =>
          ctx.log.warn({ reqId, err: err.message }, 'usage report cut off: its client stopped reading'),
        );
      } catch (err) {
        // The report stopped for the client gone (not a failure of the request; nobody is left to
        // answer). Any other error, also one that closed the response itself, is the error middleware's.
        if (err !== gone.reason) throw err;
        ctx.log.info({ reqId, answerBegun: res.headersSent }, 'usage report ended: its client went away');
      } finally {
        release();
      }
    },
  };
}

/** When a report refused for the instance's cap may be asked for again. */
const REPORT_RETRY_AFTER_SECONDS = 5;

type UsageRows = ReturnType<UsageReport['rows']>;
type UsageBatch = IteratorResult<Schemas['AdminUsageRow'][], void>;

/**
 * Writes a report while it is read (a month by hour of every account is 100,000s of rows, tens of
 * MB of JSON), each batch of rows read when the client has taken the last (`pipeBounded`). The first
 * batch is read before the answer begins, so that the statement's own failure is answered as any
 * error is. Once the answer has begun its status cannot change: a failure then cuts the connection
 * (the pipe destroys the response, the error middleware logs it), so the client meets a body that
 * never ended (no last chunk), never a short report that looks whole. `gone`: the client went away;
 * a statement of the report still running is cancelled (UsageRepository.report), the first batch's too.
 */
async function sendUsage(res: Response, report: UsageReport, csv: boolean, idleMs: number, gone: AbortSignal, stalled: (err: StalledClient) => void): Promise<void> {
  const rows = report.rows(gone);
  try {
    const first = await rows.next();
    noStore(res);
    res.status(200);
    res.setHeader('Content-Type', csv ? 'text/csv; charset=utf-8' : 'application/json; charset=utf-8');
    const body = csv ? csvBody(first, rows) : jsonBody(report.head, first, rows);
    await pipeBounded(Readable.from(body, { objectMode: false }), res, idleMs, stalled);
  } finally {
    // The rows' cursor holds a database connection: released now when the answer ended early (the
    // client left, a failure), even when the body never started reading it.
    await rows.return();
  }
}

/** The batches of a report, the first already read. */
async function* batches(first: UsageBatch, rest: UsageRows): UsageRows {
  if (first.done) return;
  yield first.value;
  yield* rest;
}

/** The JSON of `sendJson` (AdminUsageReport, `rows` last), written a batch of rows at a time. */
async function* jsonBody(head: UsageReport['head'], first: UsageBatch, rest: UsageRows): AsyncGenerator<string> {
  // `{…,"rows":[]}` without its last two characters: the head, up to the array's `[`.
  yield JSON.stringify({ ...head, rows: [] }).slice(0, -2);
  let separator = '';
  for await (const batch of batches(first, rest)) {
    yield separator + batch.map((row) => JSON.stringify(row)).join(',');
    separator = ',';
  }
  yield ']}';
}

async function* csvBody(first: UsageBatch, rest: UsageRows): AsyncGenerator<string> {
  yield USAGE_CSV_HEADER;
  for await (const batch of batches(first, rest)) yield usageCsvLines(batch);
}
