import { createHash, randomBytes } from 'node:crypto';
import { BASE62_ALPHABET } from './ids.ts';

export const API_KEY_PREFIX = 'mg_';
const KEY_RANDOM_BYTES = 24; // 192 bits, above the 128-bit floor in design §4.
// ceil(192 / log2(62)) = 33: every 24-byte value fits in 33 base62 digits, so keys have one length.
const KEY_BODY_LENGTH = 33;
const API_KEY_PATTERN = new RegExp(`^${API_KEY_PREFIX}[0-9A-Za-z]{${KEY_BODY_LENGTH}}$`);

export interface ApiKeyMaterial {
  /** The full secret; shown once to the caller and never stored or logged. */
  key: string;
  /** SHA-256 of the key: the only form the database keeps. */
  hash: Buffer;
  /** First 8 characters (`mg_` + 5), kept for display. */
  prefix: string;
  lastFour: string;
}

/**
 * Encodes bytes as one big base62 number, left-padded to a fixed width. Converting the whole
 * number (instead of mapping bytes to characters) keeps all input entropy with no modulo bias.
 */
function encodeBase62(bytes: Buffer, width: number): string {
  let n = BigInt(`0x${bytes.toString('hex') || '0'}`);
  let out = '';
  while (n > 0n) {
    out = BASE62_ALPHABET[Number(n % 62n)] + out;
    n /= 62n;
  }
  return out.padStart(width, BASE62_ALPHABET[0]);
}

/** Creates a new API key and the values the database stores for it. */
export function generateApiKey(): ApiKeyMaterial {
  const key = API_KEY_PREFIX + encodeBase62(randomBytes(KEY_RANDOM_BYTES), KEY_BODY_LENGTH);
  return { key, hash: hashApiKey(key), prefix: key.slice(0, 8), lastFour: key.slice(-4) };
}

/** SHA-256 of the key. A plain hash suffices: keys carry 192 random bits, so no salt/KDF is needed. */
export function hashApiKey(key: string): Buffer {
  return createHash('sha256').update(key, 'utf8').digest();
}

/** Cheap format check so that garbage bearer tokens never reach the database. */
export function looksLikeApiKey(s: string): boolean {
  return API_KEY_PATTERN.test(s);
}
