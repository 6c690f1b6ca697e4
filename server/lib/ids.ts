import { randomBytes } from 'node:crypto';

export const BASE62_ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';

/** Prefixes of the ids the app generates; the database checks rows carry the right one. */
export type IdPrefix =
  | 'acct'
  | 'key'
  | 'grp'
  | 'mem'
  | 'hold'
  | 'vid'
  | 'img'
  | 'file'
  | 'task'
  | 'quote'
  | 'req'
  | 'wh'
  | 'msg'
  | 'evt';

const ID_RANDOM_CHARS = 20; // 20 base62 chars ≈ 119 bits: collisions are not a concern.

/**
 * Uniform random base62 string. Bytes >= 248 (= 4 * 62) are skipped so that `byte % 62` has no
 * modulo bias; on average 3% of bytes are discarded.
 */
export function randomBase62(length: number): string {
  let out = '';
  while (out.length < length) {
    const bytes = randomBytes(Math.ceil((length - out.length) * 1.1) + 4);
    for (const byte of bytes) {
      if (byte >= 248) continue;
      out += BASE62_ALPHABET[byte % 62];
      if (out.length === length) break;
    }
  }
  return out;
}

/** A new prefixed id such as `acct_3kTz…` (prefix, underscore, 20 random base62 chars). */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${randomBase62(ID_RANDOM_CHARS)}`;
}
