/**
 * Reads of the S3 store that their reader abandons (a client that closed its download, often
 * before S3 even answered) must give the S3 client's socket back: one answer whose body nobody
 * reads holds a socket, and once all of the read client's sockets are held, every read of the
 * process waits forever.
 */
import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import type { S3MediaStore } from '../../server/storage/s3-media-store.ts';
import { startTestS3, type TestS3 } from '../support/s3-server.ts';

let s3: TestS3;
let store: S3MediaStore;
/** The body of every GetObject answer the client received. */
const bodies: Readable[] = [];

beforeAll(async () => {
  s3 = await startTestS3();
  store = s3.store('reads/');
  // Reads go through the store's client of their own (S3MediaStore.reader).
  store.reader.middlewareStack.add(
    (next, context) => async (args) => {
      const result = await next(args);
      const body = (result.output as { Body?: Readable }).Body;
      if (context.commandName === 'GetObjectCommand' && body) bodies.push(body);
      return result;
    },
    { step: 'initialize', name: 'recordBodies' },
  );
});
afterAll(async () => s3?.close());

it('reads abandoned before or after S3 answers free their connection, and the store keeps answering', async () => {
  const video = randomBytes(2 * 1024 * 1024);
  await store.put('big', video);
  await store.put('small', Buffer.from('ok'));
  // Abandoned once the bytes flow.
  for (let i = 0; i < 5; i++) {
    const out = store.read('big');
    out.on('error', () => undefined);
    await new Promise((resolve) => out.once('readable', resolve));
    out.destroy();
  }
  // Many reads abandoned at once (before the answer), as a download whose
  // client left while the store was asked.
  for (let i = 0; i < 60; i++) {
    const out = store.read('big');
    out.on('error', () => undefined);
    out.destroy();
  }
  // Every answer that arrived is dropped, none left paused on its socket.
  await vi.waitFor(() => expect(bodies.filter((b) => !b.destroyed)).toHaveLength(0), { timeout: 10_000 });
  expect(bodies.length).toBeGreaterThanOrEqual(5);
  // The store still answers, whole reads included.
  expect(await store.stat('small')).toMatchObject({ bytes: 2 });
  expect((await buffer(store.read('big'))).equals(video)).toBe(true);
});
