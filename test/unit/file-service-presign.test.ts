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
});
