/**
 * Purpose-bound HMAC keys derived from the service secret (HKDF), so that a quote-token key can
 * never verify a file URL and vice versa, and no extra secret needs configuring.
 */
import { createHmac, hkdfSync, timingSafeEqual } from 'node:crypto';

export type SigningPurpose = 'quote-token' | 'file-url' | 'webhook';

export function deriveKey(secretKey: Buffer, purpose: SigningPurpose): Buffer {
  return Buffer.from(hkdfSync('sha256', secretKey, Buffer.alloc(0), `mediagate/${purpose}/v1`, 32));
}

export function hmac(key: Buffer, data: string): Buffer {
  return createHmac('sha256', key).update(data).digest();
}

/** Constant-time comparison of a base64url signature against the expected bytes. */
export function signatureMatches(expected: Buffer, given: string): boolean {
  const buf = Buffer.from(given, 'base64url');
  return buf.length === expected.length && timingSafeEqual(buf, expected);
}
