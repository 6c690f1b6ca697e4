import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { existsSync, linkSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

// Layout: version (1) | iv (12) | tag (16) | ciphertext. The version byte lets us change the
// algorithm or key later while still reading old rows.
const VERSION = 1;
const IV_LENGTH = 12;
const TAG_LENGTH = 16;
const HEADER_LENGTH = 1 + IV_LENGTH + TAG_LENGTH;
const KEY_LENGTH = 32;

function assertKey(key: Buffer): void {
  if (key.length !== KEY_LENGTH) throw new Error(`secret key must be ${KEY_LENGTH} bytes, got ${key.length}`);
}

/** AES-256-GCM encryption of a secret (e.g. upstream credentials) for storage at rest. */
export function encryptSecret(key: Buffer, plaintext: string): Buffer {
  assertKey(key);
  const iv = randomBytes(IV_LENGTH);
  const cipher = createCipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_LENGTH });
  const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
  return Buffer.concat([Buffer.from([VERSION]), iv, cipher.getAuthTag(), ciphertext]);
}

/** Decrypts a blob from `encryptSecret`; throws when it was tampered with or the key is wrong. */
export function decryptSecret(key: Buffer, blob: Buffer): string {
  assertKey(key);
  if (blob.length < HEADER_LENGTH) throw new Error('encrypted secret is truncated');
  if (blob[0] !== VERSION) throw new Error(`unsupported encrypted secret version ${String(blob[0])}`);
  const iv = blob.subarray(1, 1 + IV_LENGTH);
  const tag = blob.subarray(1 + IV_LENGTH, HEADER_LENGTH);
  const decipher = createDecipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_LENGTH });
  decipher.setAuthTag(tag);
  try {
    return Buffer.concat([decipher.update(blob.subarray(HEADER_LENGTH)), decipher.final()]).toString('utf8');
  } catch {
    throw new Error('encrypted secret failed authentication (wrong MEDIAGATE_SECRET_KEY or tampered data)');
  }
}

/** Parses MEDIAGATE_SECRET_KEY: 64 hex characters or base64 of exactly 32 bytes. */
export function parseSecretKey(value: string): Buffer {
  const trimmed = value.trim();
  if (/^[0-9a-fA-F]{64}$/.test(trimmed)) return Buffer.from(trimmed, 'hex');
  if (/^[A-Za-z0-9+/_-]+={0,2}$/.test(trimmed)) {
    const decoded = Buffer.from(trimmed, trimmed.includes('-') || trimmed.includes('_') ? 'base64url' : 'base64');
    if (decoded.length === KEY_LENGTH) return decoded;
  }
  throw new Error('MEDIAGATE_SECRET_KEY must be 64 hex characters or base64 of 32 bytes (generate one with `openssl rand -hex 32`)');
}

/**
 * The key that encrypts upstream credentials. Order: MEDIAGATE_SECRET_KEY; else `<dataDir>/secret.key`
 * (created on first use, mode 0600) so a single-machine install works with no setup; else an error,
 * because a multi-instance deployment must share one explicit key.
 */
export function loadSecretKey(opts: { envValue?: string | undefined; dataDir?: string | undefined }): Buffer {
  if (opts.envValue !== undefined && opts.envValue.trim() !== '') return parseSecretKey(opts.envValue);
  if (opts.dataDir === undefined) {
    throw new Error('MEDIAGATE_SECRET_KEY is not set: set it to 64 hex characters (`openssl rand -hex 32`), the same on every instance');
  }
  const file = join(opts.dataDir, 'secret.key');
  if (!existsSync(file)) {
    mkdirSync(opts.dataDir, { recursive: true });
    createFileOnce(file, `${randomBytes(KEY_LENGTH).toString('hex')}\n`);
  }
  const content = readFileSync(file, 'utf8').trim();
  if (!/^[0-9a-fA-F]{64}$/.test(content)) throw new Error(`${file} does not hold 64 hex characters`);
  return Buffer.from(content, 'hex');
}

/**
 * Writes `content` to `file` with mode 0600 unless it exists. Writes a temp file and hard-links it
 * into place so that two processes starting together never see a half-written file: the loser
 * gets EEXIST and reads the winner's file.
 */
export function createFileOnce(file: string, content: string): void {
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(tmp, content, { mode: 0o600, flag: 'wx' });
  try {
    linkSync(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    unlinkSync(tmp);
  }
}
