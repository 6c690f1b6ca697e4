/**
 * An upstream's own error codes as ProviderError kinds. Upstreams that answer errors with a code
 * of their own (Ark's `ModelNotOpen`, Kling's `1102`) — often with an HTTP status that says less, or
 * an HTTP 200 — declare one table each; the kind decides everything after (retry, cool down, take
 * the member out, fail the task, which API error the client gets).
 *
 * Keys are exact codes, or prefixes ending in `.` or `*` (`RateLimitExceeded.` matches
 * `RateLimitExceeded.EndpointRPMExceeded`); the longest match wins.
 */
import type { ProviderErrorKind } from '../provider-error.ts';

export type CodeTable = Readonly<Record<string, ProviderErrorKind>>;

/** The kind `table` gives `code`, or undefined when it does not know it. */
export function kindOfCode(table: CodeTable, code: string | number | undefined | null): ProviderErrorKind | undefined {
  if (code === undefined || code === null) return undefined;
  const text = String(code);
  const exact = table[text];
  if (exact) return exact;
  let best: { length: number; kind: ProviderErrorKind } | undefined;
  for (const [key, kind] of Object.entries(table)) {
    if (!key.endsWith('.') && !key.endsWith('*')) continue;
    const prefix = key.endsWith('*') ? key.slice(0, -1) : key;
    if (text.startsWith(prefix) && (!best || prefix.length > best.length)) best = { length: prefix.length, kind };
  }
  return best?.kind;
}
