/**
 * How adapters talk HTTP to an upstream: one `fetch` with a timeout tied to the step's signal, no
 * proxy environment variables (Node's fetch ignores them), and the helpers every adapter needs to
 * turn an answer into a classified ProviderError: Retry-After parsing and message sanitizing.
 */
import { Readable } from 'node:stream';
import { ProviderError, type ProviderErrorKind } from './provider-error.ts';
import { PROVIDERS, type ProviderKind } from './registry.ts';
import type { UpstreamAccount } from './types.ts';

/** Default time an upstream call may take (submit, poll, start of a download). */
export const UPSTREAM_TIMEOUT_MS = 60_000;

/** The member's base URL (or the provider's public default) joined with `path`. */
export function upstreamUrl(account: UpstreamAccount, path: string): string {
  const base = (account.baseUrl ?? PROVIDERS[account.provider as ProviderKind]?.defaultBaseUrl ?? '').replace(/\/+$/, '');
  return `${base}${path.startsWith('/') ? path : `/${path}`}`;
}

export interface UpstreamRequest extends Omit<RequestInit, 'signal'> {
  timeoutMs?: number;
}

/**
 * fetch with a timeout and the caller's signal; a connection error or timeout becomes a
 * `retryable` ProviderError (never an unclassified error), an abort by the caller stays an abort.
 */
export async function upstreamFetch(url: string, init: UpstreamRequest, signal: AbortSignal, what: string): Promise<Response> {
  const timeout = AbortSignal.timeout(init.timeoutMs ?? UPSTREAM_TIMEOUT_MS);
  try {
    return await fetch(url, { ...init, signal: AbortSignal.any([signal, timeout]) });
  } catch (err) {
    if (signal.aborted) throw signal.reason ?? err;
    const reason = timeout.aborted ? 'timed out' : 'could not be reached';
    throw new ProviderError('retryable', `the upstream ${what} ${reason}`, { cause: err });
  }
}

/** The response body as a Node stream (for streaming into the media store). */
export function bodyStream(res: Response): Readable {
  if (!res.body) return Readable.from([]);
  return Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>);
}

/**
 * Milliseconds an upstream asked to wait: `retry-after-ms`, or `retry-after` in seconds or as an
 * HTTP date (as the OpenAI SDK reads them). Undefined when absent or unreadable; capped at an hour.
 */
export function retryAfterMs(headers: Headers, now = Date.now()): number | undefined {
  const ms = Number(headers.get('retry-after-ms'));
  if (headers.get('retry-after-ms') !== null && Number.isFinite(ms) && ms >= 0) return Math.min(ms, 3_600_000);
  const value = headers.get('retry-after');
  if (value === null || value.trim() === '') return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds) && seconds >= 0) return Math.min(seconds * 1000, 3_600_000);
  const date = Date.parse(value);
  return Number.isFinite(date) ? Math.min(Math.max(0, date - now), 3_600_000) : undefined;
}

/**
 * An upstream's reason as it may reach a client: one line, no URLs (they can carry signed
 * parameters), nothing that looks like a key or token, at most 300 characters.
 */
export function sanitizeMessage(message: unknown, fallback: string): string {
  if (typeof message !== 'string' || message.trim() === '') return fallback;
  const clean = message
    .replace(/\s+/g, ' ')
    .replace(/https?:\/\/\S+/gi, '[url]')
    .replace(/\b(sk|pk|rk|whsec|key|AIza)[-_A-Za-z0-9*]{8,}/g, '[redacted]')
    .replace(/\b(Bearer)\s+\S+/gi, '$1 [redacted]')
    .trim();
  return clean.length > 300 ? `${clean.slice(0, 297)}...` : clean;
}

/** The kind of error an HTTP status means when the body does not say more. */
export function kindOfStatus(status: number): ProviderErrorKind {
  if (status === 401 || status === 403) return 'auth';
  if (status === 429) return 'rate_limited';
  if (status === 408 || status === 409 || status >= 500) return 'retryable';
  return 'invalid_request';
}

/** Reads a JSON body, or undefined when it is not JSON (an HTML error page from a proxy, say). */
export async function readJson(res: Response): Promise<unknown> {
  const text = await res.text();
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}
