/** Prometheus metrics: one registry per app instance (no global singleton). */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { BatchStats } from './db/statement-batcher.ts';

export interface Metrics {
  registry: Registry;
  httpRequests: Counter<'operation' | 'method' | 'status'>;
  httpDuration: Histogram<'operation' | 'method'>;
  /** Task steps run by this process's engines, by task kind and outcome. */
  taskSteps: Counter<'kind' | 'outcome'>;
  /** SQL statements this process sent (all pools that were given `countQuery`). */
  dbQueries: Counter;
  /** Upstream calls by provider, member (id) and outcome (`ok`, the ProviderError kind, `aborted` or `error`). */
  upstreamRequests: Counter<'provider' | 'member' | 'outcome'>;
  upstreamDuration: Histogram<'provider' | 'member'>;
  /** Upstream calls this process has open right now. */
  upstreamInFlight: Gauge<'provider' | 'member'>;
  /** Webhook delivery attempts by outcome: delivered, gone (410), http_error, or the network error class. */
  webhookAttempts: Counter<'outcome'>;
  webhookDuration: Histogram;
}

export function createMetrics(opts: { defaultMetrics?: boolean } = {}): Metrics {
  const registry = new Registry();
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: 'mediagate_' });
  const httpRequests = new Counter({
    name: 'mediagate_http_requests_total',
    help: 'HTTP requests by operationId, method and status code.',
    labelNames: ['operation', 'method', 'status'] as const,
    registers: [registry],
  });
  const httpDuration = new Histogram({
    name: 'mediagate_http_request_duration_seconds',
    help: 'HTTP request latency by operationId (time to the last byte of the response).',
    labelNames: ['operation', 'method'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [registry],
  });
  const taskSteps = new Counter({
    name: 'mediagate_task_steps_total',
    help: 'Task steps run by this process: outcome done (settled), next (rescheduled), retry (transient failure), gave_up (failed after the last retry), lost (lease lost).',
    labelNames: ['kind', 'outcome'] as const,
    registers: [registry],
  });
  const dbQueries = new Counter({ name: 'mediagate_db_queries_total', help: 'SQL statements sent to PostgreSQL by this process.', registers: [registry] });
  const upstreamRequests = new Counter({
    name: 'mediagate_upstream_requests_total',
    help: 'Upstream calls by provider, member id and outcome: ok, the error class the upstream answered (retryable, rate_limited, quota_exhausted, auth, policy, invalid_request, misconfigured, model_not_open, account_disabled, failed), aborted (cut short by its caller), or error (the gateway failed during the call).',
    labelNames: ['provider', 'member', 'outcome'] as const,
    registers: [registry],
  });
  const upstreamDuration = new Histogram({
    name: 'mediagate_upstream_request_duration_seconds',
    help: 'Upstream call latency by provider and member id (a streamed call: until its last event).',
    labelNames: ['provider', 'member'] as const,
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
    registers: [registry],
  });
  const upstreamInFlight = new Gauge({
    name: 'mediagate_upstream_in_flight',
    help: 'Upstream calls this process has open, by provider and member id (the pool counts jobs in flight across instances in PostgreSQL).',
    labelNames: ['provider', 'member'] as const,
    registers: [registry],
  });
  const webhookAttempts = new Counter({
    name: 'mediagate_webhook_attempts_total',
    help: 'Webhook delivery attempts by outcome: delivered (2xx), gone (410), http_error (another status), or the network error class (timeout, connect_failed, tls_error, dns_failure, blocked_address, invalid_url, protocol_error).',
    labelNames: ['outcome'] as const,
    registers: [registry],
  });
  const webhookDuration = new Histogram({
    name: 'mediagate_webhook_attempt_duration_seconds',
    help: 'Webhook delivery attempt latency (resolve, connect, send, response).',
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
  return { registry, httpRequests, httpDuration, taskSteps, dbQueries, upstreamRequests, upstreamDuration, upstreamInFlight, webhookAttempts, webhookDuration };
}

/** What the operator gauges show (repositories/usage.repository.ts reads it in one statement). */
export interface OperatorGaugeSource {
  (): Promise<{
    creditsHeld: number;
    holdsHeld: number;
    unfinished: { kind: 'image' | 'video'; status: string; count: number }[];
    needsAttention: number;
    oldestNeedsAttentionSeconds: number;
  }>;
}

/** A scrape waits this long at most for the operator gauges' read (a frozen database never answers). */
export const OPERATOR_GAUGES_TIMEOUT_MS = 1_500;

/**
 * Gauges of the whole gateway (every instance shows the same values, read from PostgreSQL when
 * /metrics is scraped: one statement per scrape, shared by the gauges): credits held, unfinished
 * tasks by kind and status, and the needs_attention tasks with the age of the oldest. A scrape
 * while the database is away, or that gets no answer within `timeoutMs` (a frozen database, a
 * saturated pool), keeps the last values: prom-client waits for every gauge, and a scrape that
 * hangs loses the process's other metrics too.
 */
export function registerOperatorGauges(registry: Registry, source: OperatorGaugeSource, timeoutMs = OPERATOR_GAUGES_TIMEOUT_MS): void {
  type Stats = Awaited<ReturnType<OperatorGaugeSource>>;
  // A scrape collects every gauge at once: the ones collected while a read is in flight share it.
  let pending: Promise<Stats> | undefined;
  // What the gauges of one scrape wait for: the read, or `timeoutMs` from the first of them. A
  // later scrape, while a stuck read is still pending, shares that read with a timeout of its own.
  let waiting: Promise<Stats | undefined> | undefined;
  const read = () => {
    if (!pending) {
      const stats = source();
      pending = stats;
      const done = () => {
        if (pending === stats) pending = undefined;
      };
      stats.then(done, done);
    }
    if (!waiting) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<undefined>((resolve) => {
        timer = setTimeout(resolve, timeoutMs, undefined);
      });
      // The read itself is left to finish (or fail) on its own: its connection returns to the pool then.
      const answer: Promise<Stats | undefined> = Promise.race([pending.catch(() => undefined), timeout]).finally(() => {
        clearTimeout(timer);
        if (waiting === answer) waiting = undefined;
      });
      waiting = answer;
    }
    return waiting;
  };
  new Gauge({
    name: 'mediagate_credits_held',
    help: 'Credits held right now by unsettled credit holds (tasks accepted and not yet ended), across every instance.',
    registers: [registry],
    async collect() {
      const s = await read();
      if (s) this.set(s.creditsHeld / 1_000_000);
    },
  });
  new Gauge({
    name: 'mediagate_credit_holds_held',
    help: 'Credit holds not yet settled, across every instance.',
    registers: [registry],
    async collect() {
      const s = await read();
      if (s) this.set(s.holdsHeld);
    },
  });
  const states: readonly { kind: 'image' | 'video'; status: string }[] = [
    { kind: 'video', status: 'queued' },
    { kind: 'video', status: 'in_progress' },
    { kind: 'image', status: 'processing' },
    { kind: 'image', status: 'needs_attention' },
  ];
  new Gauge({
    name: 'mediagate_tasks',
    help: 'Unfinished tasks by kind and status (video: queued, in_progress; image: processing, needs_attention), across every instance. Ended tasks are counted by GET /admin/v1/usage.',
    labelNames: ['kind', 'status'] as const,
    registers: [registry],
    async collect() {
      const s = await read();
      if (!s) return;
      for (const state of states) this.set(state, s.unfinished.find((u) => u.kind === state.kind && u.status === state.status)?.count ?? 0);
    },
  });
  new Gauge({
    name: 'mediagate_tasks_needs_attention',
    help: 'Image tasks whose outcome is unknown, waiting for an operator to settle them (POST /admin/v1/tasks/{task_id}/settle).',
    registers: [registry],
    async collect() {
      const s = await read();
      if (s) this.set(s.needsAttention);
    },
  });
  new Gauge({
    name: 'mediagate_tasks_needs_attention_oldest_age_seconds',
    help: 'Age of the oldest needs_attention task (since its creation), in seconds; 0 without one.',
    registers: [registry],
    async collect() {
      const s = await read();
      if (s) this.set(Math.round(s.oldestNeedsAttentionSeconds));
    },
  });
}

/**
 * Counters of this process's group commit (db/statement-batcher.ts), read when /metrics is scraped:
 * per statement (`hold`, `completion`), the requests that went in a shared statement or alone, and
 * the shared statements and the ones that fell back to a statement per request.
 */
export function registerBatchCounters(registry: Registry, sources: Record<'hold' | 'completion', () => BatchStats>): void {
  const each = (read: (s: BatchStats) => number) =>
    function (this: Counter<'statement'>) {
      this.reset();
      for (const [statement, source] of Object.entries(sources)) this.inc({ statement }, read(source()));
    };
  new Counter({
    name: 'mediagate_db_batch_statements_total',
    help: 'Statements that carried the holds or completions of several requests (group commit).',
    labelNames: ['statement'],
    registers: [registry],
    collect: each((s) => s.batches),
  });
  new Counter({
    name: 'mediagate_db_batched_requests_total',
    help: 'Holds or completions that went out in a shared statement.',
    labelNames: ['statement'],
    registers: [registry],
    collect: each((s) => s.batched),
  });
  new Counter({
    name: 'mediagate_db_unbatched_requests_total',
    help: 'Holds or completions that the batcher ran in a statement of their own (alone, or after their batch fell back).',
    labelNames: ['statement'],
    registers: [registry],
    collect: each((s) => s.singles),
  });
  new Counter({
    name: 'mediagate_db_batch_fallbacks_total',
    help: 'Shared statements that wrote nothing (a request refused, a conflict, an error), whose requests then ran alone.',
    labelNames: ['statement'],
    registers: [registry],
    collect: each((s) => s.fallbacks),
  });
}
