/** Prometheus metrics: one registry per app instance (no global singleton). */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface Metrics {
  registry: Registry;
  httpRequests: Counter<'operation' | 'method' | 'status'>;
  httpDuration: Histogram<'operation' | 'method'>;
  /** Task steps run by this process's engines, by task kind and outcome. */
  taskSteps: Counter<'kind' | 'outcome'>;
  /** SQL statements this process sent (all pools that were given `countQuery`). */
  dbQueries: Counter;
  /** Upstream calls by provider, member (id) and outcome (`ok` or the ProviderError kind). */
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
    help: 'Task steps run by this process: outcome done (settled), next (rescheduled), retry (transient failure), lost (lease lost).',
    labelNames: ['kind', 'outcome'] as const,
    registers: [registry],
  });
  const dbQueries = new Counter({ name: 'mediagate_db_queries_total', help: 'SQL statements sent to PostgreSQL by this process.', registers: [registry] });
  const upstreamRequests = new Counter({
    name: 'mediagate_upstream_requests_total',
    help: 'Upstream calls by provider, member id and outcome: ok, or the error class (retryable, rate_limited, quota_exhausted, auth, policy, invalid_request, failed).',
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
