/**
 * List filters kept in the URL. A list page builds its filter from its query (the shell mounts a page
 * afresh for each location), and Apply navigates to the URL of the filters typed: Back, a reload or a
 * link copied from the address bar shows the same list. The query uses the admin API's own names and
 * values (`status=queued,in_progress`, `created_after=<RFC 3339>`), so a listing request's query
 * works as a console link too.
 */
import { BASE, navigate } from './router.tsx';

export type FilterParams = Record<string, string | readonly string[] | undefined>;

/** `path` with the non-empty filters as its query: arrays in the API's comma form. */
export function filterUrl(path: string, params: FilterParams): string {
  const parts: string[] = [];
  for (const [name, value] of Object.entries(params)) {
    const values = typeof value === 'string' ? [value] : (value ?? []);
    const kept = values.map((v) => v.trim()).filter(Boolean);
    // Colons stay readable (`created_after=2026-01-02T03:04:00.000Z`); they need no escape in a query.
    if (kept.length > 0) parts.push(`${name}=${kept.map((v) => encodeURIComponent(v).replace(/%3A/gi, ':')).join(',')}`);
  }
  return parts.length ? `${path}?${parts.join('&')}` : path;
}

/**
 * Shows the list of `to`. The same URL again (Apply with nothing changed) would mount nothing anew:
 * `again` lists it again instead, and no second history entry is written.
 */
export function applyFilters(to: string, again: () => void): void {
  if (`${window.location.pathname}${window.location.search}` === `${BASE}${to}`) again();
  else navigate(to);
}

/** Every value of a list parameter: `?status=a&status=b` and the API's `?status=a,b` alike. */
export function listParam(search: URLSearchParams, name: string): string[] {
  return search
    .getAll(name)
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean);
}

/** The values of a list parameter that are among `allowed` (in that order). */
export function allowedList<T extends string>(search: URLSearchParams, name: string, allowed: readonly T[]): T[] {
  const asked = new Set(listParam(search, name));
  return allowed.filter((v) => asked.has(v));
}

/** A parameter's value when it is one of `allowed`, else ''. */
export function allowedValue<T extends string>(search: URLSearchParams, name: string, allowed: readonly T[]): T | '' {
  const v = search.get(name) ?? '';
  return (allowed as readonly string[]).includes(v) ? (v as T) : '';
}

/** An RFC 3339 time -> a `datetime-local` input value in the browser's time zone ('' when it is none). */
export function toLocalInput(iso: string | null): string {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  const pad = (n: number, w = 2) => String(n).padStart(w, '0');
  const base = `${pad(d.getFullYear(), 4)}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return d.getSeconds() || d.getMilliseconds() ? `${base}:${pad(d.getSeconds())}${d.getMilliseconds() ? `.${pad(d.getMilliseconds(), 3)}` : ''}` : base;
}
