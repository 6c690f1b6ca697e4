import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { decryptSecret, encryptSecret, loadSecretKey } from '../../server/lib/secret-box.ts';

const key = randomBytes(32);
const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-secret-'));
  dirs.push(dir);
  return dir;
}

describe('encryptSecret / decryptSecret', () => {
  it('round-trips text, including unicode and empty strings', () => {
    for (const plaintext of ['sk-live-123', '{"apiKey":"ключ 🔑"}', '']) {
      expect(decryptSecret(key, encryptSecret(key, plaintext))).toBe(plaintext);
    }
  });

  it('uses the version | iv | tag | ciphertext layout with a fresh iv each time', () => {
    const a = encryptSecret(key, 'same');
    const b = encryptSecret(key, 'same');
    expect(a[0]).toBe(1);
    expect(a.length).toBe(1 + 12 + 16 + 4);
    expect(a.subarray(1, 13).equals(b.subarray(1, 13))).toBe(false);
  });

  it('detects tampering anywhere in the blob', () => {
    const blob = encryptSecret(key, 'top secret');
    for (const index of [5, 20, blob.length - 1]) {
      const tampered = Buffer.from(blob);
      tampered[index] = (tampered[index] ?? 0) ^ 0x01;
      expect(() => decryptSecret(key, tampered)).toThrow(/failed authentication/);
    }
  });

  it('rejects a wrong key, a truncated blob and an unknown version', () => {
    const blob = encryptSecret(key, 'top secret');
    expect(() => decryptSecret(randomBytes(32), blob)).toThrow(/failed authentication/);
    expect(() => decryptSecret(key, blob.subarray(0, 20))).toThrow(/truncated/);
    const v2 = Buffer.from(blob);
    v2[0] = 2;
    expect(() => decryptSecret(key, v2)).toThrow(/version 2/);
  });
});

describe('loadSecretKey', () => {
  it('accepts 64 hex characters or base64 of 32 bytes', () => {
    expect(loadSecretKey({ envValue: key.toString('hex') }).equals(key)).toBe(true);
    expect(loadSecretKey({ envValue: key.toString('base64') }).equals(key)).toBe(true);
  });

  it('rejects a key of the wrong size with a clear message', () => {
    expect(() => loadSecretKey({ envValue: randomBytes(16).toString('hex') })).toThrow(/MEDIAGATE_SECRET_KEY must be/);
    expect(() => loadSecretKey({ envValue: 'not a key' })).toThrow(/MEDIAGATE_SECRET_KEY must be/);
  });

  it('creates <dataDir>/secret.key with mode 0600 once and reuses it', () => {
    const dataDir = tempDir();
    const first = loadSecretKey({ dataDir });
    const file = join(dataDir, 'secret.key');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(readFileSync(file, 'utf8').trim()).toBe(first.toString('hex'));
    expect(loadSecretKey({ dataDir }).equals(first)).toBe(true);
  });

  it('throws when neither the variable nor a data dir is given', () => {
    expect(() => loadSecretKey({ envValue: undefined })).toThrow(/MEDIAGATE_SECRET_KEY is not set/);
  });
});
