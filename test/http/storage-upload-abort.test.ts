/**
 * An upload (`POST /v1/files`) that ends before its body does — the client went away, or the body
 * stalled and was answered 408 — ends the store's write too: nothing is left on disk or open, no
 * multipart upload is left on S3, and no file row is written.
 */
import { existsSync, readdirSync, readlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { FileRow } from '../../server/services/file.service.ts';
import { createCustomer } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { startTestS3, type TestS3 } from '../support/s3-server.ts';

const BOUNDARY = 'mg-cut-upload';

/**
 * Sends the head of a multipart upload announcing 50 MiB and `bytes` of its file part, then goes
 * away (`disconnect`) or waits for the answer (`stall`: its first line).
 */
function partialUpload(server: TestServer, key: string, bytes: number, how: 'disconnect' | 'stall'): Promise<string> {
  const url = new URL(server.directUrl);
  return new Promise((resolve) => {
    const socket = connect(Number(url.port), url.hostname, () => {
      const head = `--${BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`;
      socket.write(`POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${50 * 1024 * 1024}\r\n\r\n${head}`);
      let answer = '';
      socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
      socket.on('error', () => undefined);
      socket.on('close', () => resolve(answer.split('\r\n')[0]!));
      socket.write(Buffer.alloc(bytes, 7), () => {
        if (how === 'disconnect') setTimeout(() => socket.destroy(), 200);
      });
    });
  });
}

/** Counts the writes of `files.save` that have not settled yet. */
function watchSaves(server: TestServer): { pending(): number; settled: PromiseSettledResult<FileRow>[] } {
  const files = server.ctx.services.files;
  const save = files.save.bind(files);
  let pending = 0;
  const settled: PromiseSettledResult<FileRow>[] = [];
  files.save = (...args) => {
    pending++;
    const saving = save(...args);
    saving.then(
      (value) => settled.push({ status: 'fulfilled', value }),
      (reason: unknown) => settled.push({ status: 'rejected', reason }),
    ).finally(() => pending--);
    return saving;
  };
  return { pending: () => pending, settled };
}

function walk(dir: string): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(join(dir, e.name)) : [join(dir, e.name)]));
  } catch {
    return [];
  }
}

/** Files under `dir` this process holds open (Linux: none known elsewhere). */
function openFilesUnder(dir: string): string[] {
  if (!existsSync('/proc/self/fd')) return [];
  return readdirSync('/proc/self/fd')
    .map((fd) => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`);
      } catch {
        return '';
      }
    })
    .filter((path) => path.startsWith(dir));
}

describe('filesystem store', () => {
  let server: TestServer;
  let key: string;
  let saves: ReturnType<typeof watchSaves>;
  beforeAll(async () => {
    server = await startTestServer({ env: { BODY_IDLE_TIMEOUT_MS: '500' } });
    key = (await createCustomer(server.db)).key;
    saves = watchSaves(server);
  });
  afterAll(async () => server?.close());

  it('an upload whose client goes away, and one that stalls (408), leave no temporary file, no open file and no row', async () => {
    await partialUpload(server, key, 1024 * 1024, 'disconnect');
    expect(await partialUpload(server, key, 1024 * 1024, 'stall')).toBe('HTTP/1.1 408 Request Timeout');
    // Both writes end (failed), and take what they wrote with them.
    await vi.waitFor(() => expect(saves.settled).toHaveLength(2), { timeout: 10_000 });
    expect(saves.pending()).toBe(0);
    expect(saves.settled.map((s) => s.status)).toEqual(['rejected', 'rejected']);
    expect(walk(server.config.mediaDir)).toEqual([]);
    expect(openFilesUnder(server.config.mediaDir)).toEqual([]);
    expect(await server.db.selectFrom('files').select('id').execute()).toEqual([]);
  });
});

describe('S3 store', () => {
  let s3: TestS3;
  let server: TestServer;
  let key: string;
  let saves: ReturnType<typeof watchSaves>;
  const sent: string[] = [];
  beforeAll(async () => {
    s3 = await startTestS3();
    const store = s3.store('cut/');
    store.client.middlewareStack.add((next, context) => async (args) => (sent.push(context.commandName!), next(args)), { step: 'initialize', name: 'recordCommands' });
    server = await startTestServer({ overrides: { mediaStore: store }, env: { ...s3.env('cut/'), BODY_IDLE_TIMEOUT_MS: '500' } });
    key = (await createCustomer(server.db)).key;
    saves = watchSaves(server);
  });
  afterAll(async () => {
    await server?.close();
    await s3?.close();
  });

  it('an upload cut after its first part was sent aborts the multipart upload and writes no row', async () => {
    // More than one part (8 MiB): the multipart upload has begun when the client goes away.
    await partialUpload(server, key, 9 * 1024 * 1024, 'disconnect');
    await vi.waitFor(() => expect(saves.settled).toHaveLength(1), { timeout: 10_000 });
    expect(saves.settled[0]!.status).toBe('rejected');
    expect(sent).toContain('CreateMultipartUploadCommand');
    expect(sent).toContain('AbortMultipartUploadCommand');
    expect(sent).not.toContain('CompleteMultipartUploadCommand');
    expect(await server.db.selectFrom('files').select('id').execute()).toEqual([]);
  });
});
