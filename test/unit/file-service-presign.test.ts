// With S3 and MEDIA_URLS=presigned, the URL an upstream gets for a media input named by file id is a
// presigned GET of the object where that file's bytes are: an upload, an earlier output or an input.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { FileService } from '../../server/services/file.service.ts';
import { startTestS3 } from '../support/s3-server.ts';

describe('FileService.mediaInputs on S3 with presigned URLs', () => {
  let s3: Awaited<ReturnType<typeof startTestS3>>;
  beforeAll(async () => {
    s3 = await startTestS3();
  });
  afterAll(async () => s3?.close());

  it('presigns the key each file was stored under, whatever its purpose', async () => {
    // Only what save and mediaInputs use of the repository: the rows, kept in memory.
    const rows = new Map<string, FileRow>();
    const repo = {
      insert: async (row: FileRow) => {
        rows.set(row.id, row);
        return row.expiresAt;
      },
      findMany: async (ids: readonly string[]) => ids.map((id) => rows.get(id)).filter((r): r is FileRow => r !== undefined),
    };
    const files = new FileService(repo as never, s3.store(), {} as never, Buffer.alloc(32, 1), 'http://gateway.invalid', 3600, { urls: 'presigned', outputRetentionDays: 30 });
    const bytes = Buffer.from('the bytes of an input image');
    for (const purpose of ['upload', 'image_output', 'video_output', 'input'] as const) {
      // Recorded upright, as inspection records an image: these bytes are none, only the upstream reads them.
      const row = await files.save({ accountId: 'acct_presign', purpose, contentType: 'image/png', orientation: 1 }, bytes);
      const [input] = await files.mediaInputs([row.id]);
      const url = new URL(await input!.url(3600));
      expect([purpose, url.pathname.endsWith(`/${row.storageKey}`)]).toEqual([purpose, true]);
      const res = await fetch(url);
      expect([purpose, res.status]).toEqual([purpose, 200]);
      expect(Buffer.from(await res.arrayBuffer()).equals(bytes)).toBe(true);
    }
  });

  it("presigns no URL that outlives the file: capped at its remaining life, and an expired file's is the gateway's own (which refuses it)", async () => {
    const rows = new Map<string, FileRow>();
    const repo = {
      insert: async (row: FileRow) => {
        rows.set(row.id, row);
        return row.expiresAt;
      },
      findMany: async (ids: readonly string[]) => ids.map((id) => rows.get(id)).filter((r): r is FileRow => r !== undefined),
    };
    const now = Date.parse('2026-11-28T12:00:00Z');
    const files = new FileService(repo as never, s3.store(), {} as never, Buffer.alloc(32, 1), 'http://gateway.invalid', 3600, { urls: 'presigned', outputRetentionDays: 30 }, () => now);
    const urlOf = async (expiresAt: Date | undefined, minTtlSeconds: number) => {
      const row = await files.save({ accountId: 'acct_presign', purpose: 'upload', contentType: 'image/png', orientation: 1, ...(expiresAt && { expiresAt }) }, Buffer.from('x'));
      const [input] = await files.mediaInputs([row.id]);
      return new URL(await input!.url(minTtlSeconds));
    };
    // No expiry: the longer of FILE_URL_TTL_SECONDS and what the caller needs.
    expect((await urlOf(undefined, 7200)).searchParams.get('X-Amz-Expires')).toBe('7200');
    // Ten minutes left: ten minutes, whatever the caller asked for.
    expect((await urlOf(new Date(now + 600_000), 7200)).searchParams.get('X-Amz-Expires')).toBe('600');
    expect((await urlOf(new Date(now + 600_000), 0)).searchParams.get('X-Amz-Expires')).toBe('600');
    // A day left: the asked-for life as usual.
    expect((await urlOf(new Date(now + 86_400_000), 7200)).searchParams.get('X-Amz-Expires')).toBe('7200');
    // An output's link (a task's answer: `downloadUrl`) is capped at the output's expiry the same way.
    expect(new URL(await files.downloadUrl('file_out', 'video_output', 0, new Date(now + 600_000))).searchParams.get('X-Amz-Expires')).toBe('600');
    expect(new URL(await files.downloadUrl('file_out', 'video_output')).searchParams.get('X-Amz-Expires')).toBe('3600');
    // Expired (or under a second left): no presigned URL, the gateway's signed one.
    for (const expiresAt of [new Date(now - 1000), new Date(now + 500)]) {
      const url = await urlOf(expiresAt, 3600);
      expect(url.origin).toBe('http://gateway.invalid');
      expect(url.pathname).toMatch(/^\/v1\/files\/file_/);
    }
  });
});
