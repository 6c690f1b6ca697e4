import { randomFillSync } from 'node:crypto';

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
 * Random bytes for identifiers, drawn from a pool refilled 4 KiB at a time (as crypto.randomUUID
 * does): one call into the CSPRNG per 150-odd ids instead of one per id, each of which cost more
 * than the id. Not for secrets (API keys, webhook secrets and encryption use randomBytes directly),
 * since drawn bytes stay in the pool's memory until it is refilled.
 */
const POOL_BYTES = 4096;
const pool = Buffer.allocUnsafeSlow(POOL_BYTES);
let poolOffset = POOL_BYTES;

function randomByte(): number {
  if (poolOffset === POOL_BYTES) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  return pool[poolOffset++]!;
}

/** `bytes` random bytes as lowercase hex (request ids, temporary file names). */
export function randomHex(bytes: number): string {
  let out = '';
  for (let i = 0; i < bytes; i++) out += HEX[randomByte()];
  return out;
}

const HEX = Array.from({ length: 256 }, (_, b) => b.toString(16).padStart(2, '0'));

/**
 * Uniform random base62 string. Bytes >= 248 (= 4 * 62) are skipped so that `byte % 62` has no
 * modulo bias; on average 3% of bytes are discarded.
 */
export function randomBase62(length: number): string {
  let out = '';
  while (out.length < length) {
    const byte = randomByte();
    if (byte < 248) out += BASE62_ALPHABET[byte % 62];
  }
  return out;
}

/** A new prefixed id such as `acct_3kTz…` (prefix, underscore, 20 random base62 chars). */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${randomBase62(ID_RANDOM_CHARS)}`;
}
