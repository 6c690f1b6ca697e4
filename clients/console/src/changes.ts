/**
 * What an edit form sends: only the members the operator changed. A form is filled from a copy of the
 * object loaded when it opened, maybe hours ago, and the admin API's updates are PATCHes: a member sent
 * unchanged would write that old value back over whatever another operator, the CLI or the server
 * changed since (an account suspended, a member disabled during an incident, a price raised).
 */

/** Thrown by a form whose fields all hold the values loaded: nothing is sent, and ErrorAlert says so as a notice. */
export class NothingChanged extends Error {
  constructor() {
    super('No field differs from the values this form was filled with: nothing was sent.');
  }
}

/**
 * The members of `edited` whose value differs from the same member of `loaded` (compared as JSON
 * values: arrays and objects by content); throws NothingChanged when there is none. Both objects are
 * in the API's terms (an absent value as null, as the API returns it), so a field the operator did
 * not touch compares equal.
 */
export function changedFields<T extends object>(loaded: T, edited: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(edited) as (keyof T)[]) if (!sameValue(loaded[k], edited[k])) out[k] = edited[k];
  if (Object.keys(out).length === 0) throw new NothingChanged();
  return out;
}

function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null || Array.isArray(a) !== Array.isArray(b)) return false;
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  const keys = Object.keys(x);
  return keys.length === Object.keys(y).length && keys.every((k) => Object.hasOwn(y, k) && sameValue(x[k], y[k]));
}
