/**
 * The one error an upstream adapter throws. Adapters classify what the upstream said; the rest of
 * the gateway decides from `kind` alone (retry, fail the task, cool the member down, which API error
 * to answer: see `apiErrorOf` in errors.ts). `message` is the upstream's reason, sanitized: never
 * a URL with credentials, a header or a key.
 */
export type ProviderErrorKind =
  /** Connection error, timeout, 5xx: try again later (or on another member). */
  | 'retryable'
  /** 429 with a short wait; `retryAfterMs` when the upstream said how long. */
  | 'rate_limited'
  /** The account's quota or credit is used up (e.g. OpenAI `insufficient_quota`): not worth retrying soon. */
  | 'quota_exhausted'
  /** 401/403: the member's credentials are wrong or lack permission. */
  | 'auth'
  /** Refused by the upstream's content policy (prompt or output). */
  | 'policy'
  /** The upstream rejected the request as invalid (a parameter it does not accept). */
  | 'invalid_request'
  /**
   * The upstream does not know what it was asked for (HTTP 404/405, Google NOT_FOUND): a wrong base
   * URL, API path or model id of the member, not a fault of the request. Another member may serve it.
   */
  | 'misconfigured'
  /**
   * The member's account has not activated (or may not use) the model it was asked for (Ark's
   * `ModelNotOpen`): only its owner can change that. Another member may serve the model.
   */
  | 'model_not_open'
  /**
   * The member's account cannot take any work until its owner acts on it: in arrears, its resource
   * pack or balance used up (Kling 1101/1102, Ark `AccountOverdueError`). Not worth retrying soon.
   */
  | 'account_disabled'
  /** The upstream accepted the job and then reported it failed. */
  | 'failed';

export class ProviderError extends Error {
  readonly kind: ProviderErrorKind;
  readonly retryAfterMs: number | undefined;
  /**
   * How long the gateway put the member aside after this error (a 429: the upstream's Retry-After,
   * else its backoff; never shorter than a cooldown already running; set by the pool's member
   * health once recorded).
   */
  cooldownMs: number | undefined;

  /** What a client refused because of this error is told to wait: the member's recorded cooldown, else the upstream's Retry-After. */
  get waitMs(): number | undefined {
    return this.cooldownMs ?? this.retryAfterMs;
  }
  /** HTTP status and error code the upstream answered, for logs and member health. */
  readonly upstreamStatus: number | undefined;
  readonly upstreamCode: string | undefined;
  /**
   * No usable answer came, but the request may have reached the upstream and been acted on (a
   * timeout, a connection lost after it was sent, a 2xx answer without the job's id or with a body
   * that cannot be read): work that must not run twice (a video job) does not move to another
   * member on it, and retries on the same one with the same idempotency key.
   */
  readonly maybeAccepted: boolean;
  /**
   * The upstream job the call ran is still there to collect: neither cancelled nor reported gone
   * (it runs, or it finished and is billed, its output not fetched yet). A later call on the same
   * member collects it (`ImageJob.resume`) rather than paying for another one.
   */
  readonly jobKept: boolean;

  constructor(kind: ProviderErrorKind, message: string, opts: { retryAfterMs?: number; upstreamStatus?: number; upstreamCode?: string; cause?: unknown; maybeAccepted?: boolean; jobKept?: boolean } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'ProviderError';
    this.kind = kind;
    this.retryAfterMs = opts.retryAfterMs;
    this.upstreamStatus = opts.upstreamStatus;
    this.upstreamCode = opts.upstreamCode;
    this.maybeAccepted = opts.maybeAccepted ?? false;
    this.jobKept = opts.jobKept ?? false;
  }

  /** The same failure (its message, status, code and Retry-After; this as its cause) with `changes` made. */
  with(changes: { kind?: ProviderErrorKind; maybeAccepted?: boolean; jobKept?: boolean }): ProviderError {
    return new ProviderError(changes.kind ?? this.kind, this.message, {
      retryAfterMs: this.retryAfterMs,
      upstreamStatus: this.upstreamStatus,
      upstreamCode: this.upstreamCode,
      cause: this,
      maybeAccepted: changes.maybeAccepted ?? this.maybeAccepted,
      jobKept: changes.jobKept ?? this.jobKept,
    });
  }

  /** Worth trying again (later, or on another member). */
  get transient(): boolean {
    return this.kind === 'retryable' || this.kind === 'rate_limited';
  }
}

/**
 * Any error as a ProviderError: an unknown error (a bug, an unclassified network error) counts as
 * retryable, with `message` instead of its own text, which may hold internal details.
 */
export function asProviderError(err: unknown, message: string): ProviderError {
  if (err instanceof ProviderError) return err;
  return new ProviderError('retryable', message, { cause: err });
}
