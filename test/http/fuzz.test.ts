/**
 * A seeded fuzz run over every public endpoint: a few thousand requests built by mutating valid
 * ones (wrong types, missing and unknown members, huge, empty, NUL and odd Unicode strings, bad
 * JSON, odd content types and encodings, odd path ids and query strings). No response may be a
 * 5xx, and every 4xx must carry the contract's error body. The account has no credits, so no
 * request that passes validation renders anything: it stops at the credit gate (402).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { contractLane, startTestServer, type TestServer } from '../support/http-harness.ts';

const SEED = 0x6d67_f022;
const REQUESTS = 2500;
const PARALLEL = 8;

/** mulberry32: a small seeded PRNG, so a failure reproduces exactly. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Json = Record<string, unknown>;
interface FuzzRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string | Buffer;
}

/** 16x16, the smallest accepted input image. */
const PNG_16 = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAACXBIWXMAAAPoAAAD6AG1e1JrAAAAGUlEQVQokWMwTltFEmIY1ZA2GkrGwzVpAABBAkMQJISU3QAAAABJRU5ErkJggg==';

const VALID: Record<string, () => Json> = {
  '/v1/images/generations': () => ({ model: 'local-image-1', prompt: 'a lighthouse', aspectRatio: '16:9', resolution: '1K', output_format: 'png', n: 1 }),
  '/v1/images/edits': () => ({ model: 'local-image-1', prompt: 'paint it', images: [PNG_16], response_format: 'url' }),
  '/v1/videos/generations': () => ({ client_request_id: 'fuzz', prompt: 'a fox', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p', firstFrame: PNG_16 }),
  '/api/v1/videos/generations': () => ({ client_request_id: 'fuzz', prompt: 'a fox', model: 'local-video-1', duration: 4, aspect_ratio: '16:9', resolution: '720p', referenceImages: [PNG_16] }),
  '/v1/videos': () => ({ prompt: 'x' }),
  '/v1/webhooks/secret/rotate': () => ({}),
  '/v1/files': () => ({ purpose: 'input', 'expires_after[seconds]': '3600' }),
};
const GETS = ['/v1/models', '/v1/credits', '/v1/videos/capabilities', '/healthz', '/readyz', '/metrics', '/docs', '/openapi.json', '/v1/webhooks/secret', '/v1/images/{id}', '/v1/videos/{id}', '/v1/files/{id}'];

export function generate(random: () => number): FuzzRequest {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
  const chance = (p: number) => random() < p;
  const weird = (): unknown =>
    pick<() => unknown>([
      () => '',
      () => 'x'.repeat(Math.floor(random() * 40_000)),
      () => 'a\u0000b',
      () => '\ud800',
      () => '💥'.repeat(50),
      () => '../../etc/passwd',
      () => -1,
      () => 0,
      () => 1e308,
      () => 2 ** 63,
      () => 3.5,
      () => Number.MAX_SAFE_INTEGER,
      () => true,
      () => null,
      () => [],
      () => [1, 'a', null],
      () => ({}),
      () => ({ nested: { deeper: [{}] } }),
      () => 'data:image/png;base64,!!!!',
      () => 'data:image/png;base64,',
      () => 'https://localhost./',
      () => `q1.${'A'.repeat(30)}.${'B'.repeat(10)}`,
    ])();
  const id = () => pick(['vid_x', 'img_x', 'file_x', '%00', '%zz', '..', 'a'.repeat(300), encodeURIComponent('💥'), 'vid_%2e%2e', '']);

  if (chance(0.35)) {
    const template = pick(GETS);
    let path = template.replace('{id}', id());
    if (chance(0.3)) path += pick(['?limit=-1', '?expires=abc&signature=x', '?expires=1&signature=%00', '?a[b]=1', '?%zz=1', '?expires=99999999999&signature=']);
    return { method: 'GET', path, headers: {} };
  }
  const path = pick(Object.keys(VALID));
  let headers: Record<string, string> = { 'Content-Type': 'application/json' };
  if (chance(0.1)) headers = { 'Content-Type': pick(['text/plain', 'application/xml', 'multipart/form-data; boundary=x', 'multipart/form-data', 'application/json; charset=latin1', '']) };
  if (chance(0.05)) headers['Content-Encoding'] = pick(['gzip', 'br', 'deflate', 'zstd', 'identity']);
  if (chance(0.05)) headers.Accept = 'text/event-stream';
  if (chance(0.05)) headers.Prefer = 'respond-async';
  if (chance(0.08)) return { method: 'POST', path, headers, body: pick(['{', '[]', 'null', '"x"', '{"a":', '\u0000', '{"prompt":"\\u0000"}', Buffer.from([0xff, 0xfe, 0x00]).toString('latin1')]) };
  const body = VALID[path]!();
  const keys = Object.keys(body);
  const mutations = 1 + Math.floor(random() * 3);
  for (let i = 0; i < mutations; i++) {
    const roll = random();
    if (roll < 0.3) body[pick(keys)] = weird();
    else if (roll < 0.45) delete body[pick(keys)];
    else if (roll < 0.55) body[pick(['size', 'quality', 'background', 'stream', 'n', 'partial_images', 'output_compression', 'mask', 'seconds', 'duration_seconds', 'generate_audio', 'lastFrame', 'reference_videos', 'reference_audios', 'callback_url', 'quote_token', 'negative_prompt', 'unknown_member'])] = weird();
    else if (roll < 0.65) body[pick(['aspect_ratio', 'aspectRatio', 'duration', 'seconds', 'clientRequestIdRequired'])] = pick(['9:16', 8, '4', 'other']);
    else if (roll < 0.75) body.client_request_id = `fuzz-${Math.floor(random() * 20)}`;
    else body[pick(keys)] = pick(['local-video-1-8s-720p', 'local-image-pro', 'local-video-lite', 'nope', '4K', '1080p', '21:9']);
  }
  return { method: pick(['POST', 'POST', 'POST', 'PUT', 'DELETE']), path, headers, body: JSON.stringify(body) };
}

describe.skipIf(contractLane)('fuzz: malformed requests over every public endpoint', () => {
  let server: TestServer;
  let key: string;
  beforeAll(async () => {
    server = await startTestServer({ env: { KEY_CACHE_TTL_MS: '5000' } });
    await seedCatalog(server.db);
    key = (await createCustomer(server.db, { balance: 0 })).key;
  });
  afterAll(async () => server?.close());

  it(`${REQUESTS} requests (seed ${SEED}): no 5xx, and an error body on every 4xx`, async () => {
    const random = prng(SEED);
    const requests = Array.from({ length: REQUESTS }, () => generate(random));
    const failures: string[] = [];
    const statuses = new Map<number, number>();
    let next = 0;
    const worker = async () => {
      while (next < requests.length) {
        const r = requests[next++]!;
        const res = await fetch(`${server.directUrl}${r.path}`, { method: r.method, headers: { Authorization: `Bearer ${key}`, ...r.headers }, body: r.body });
        const text = await res.text();
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        const describe = `${r.method} ${r.path} ${JSON.stringify(r.headers)} ${String(r.body).slice(0, 200)} -> ${res.status} ${text.slice(0, 300)}`;
        if (res.status >= 500) failures.push(describe);
        else if (res.status >= 400) {
          let body: { error?: { message?: unknown; type?: unknown; code?: unknown } } = {};
          try {
            body = JSON.parse(text) as typeof body;
          } catch {
            // reported below
          }
          if (typeof body.error?.message !== 'string' || typeof body.error.type !== 'string' || typeof body.error.code !== 'string') failures.push(`no error body: ${describe}`);
        }
      }
    };
    await Promise.all(Array.from({ length: PARALLEL }, worker));
    expect(failures.slice(0, 10)).toEqual([]);
    // The run reached deep: validation errors, credit gates and successful reads all occurred.
    expect(statuses.get(400)).toBeGreaterThan(100);
    expect(statuses.get(402)).toBeGreaterThan(10);
    expect(statuses.get(200)).toBeGreaterThan(10);
  }, 180_000);
});
