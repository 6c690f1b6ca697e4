// The media inputs a task's adapter gets: a stored PNG, JPEG or WebP as stored, streamed; a GIF (an
// upload may be one) as a PNG of its first frame, since upstreams take PNG, JPEG and WebP only.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { FileService } from '../../server/services/file.service.ts';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';

describe('FileService.mediaInputs', () => {
  let dir: string;
  let files: FileService;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mg-media-inputs-'));
    // Only what save and mediaInputs use of the repository: the rows, kept in memory.
    const rows = new Map<string, FileRow>();
    const repo = {
      insert: async (row: FileRow) => {
        rows.set(row.id, row);
        return row.expiresAt;
      },
      find: async (id: string) => rows.get(id),
      findMany: async (ids: readonly string[]) => ids.map((id) => rows.get(id)).filter((r): r is FileRow => r !== undefined),
    };
    files = new FileService(repo as never, new FilesystemMediaStore(dir), {} as never, Buffer.alloc(32, 1), 'http://gateway.invalid', 3600, { urls: 'gateway', outputRetentionDays: 30 });
  });
  afterAll(async () => rm(dir, { recursive: true, force: true }));

  const read = async (stream: NodeJS.ReadableStream) => {
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  };

  it('hands a PNG, JPEG or WebP over as stored, and a GIF as a PNG of its first frame with its exact length', async () => {
    const image = sharp({ create: { width: 40, height: 30, channels: 3, background: '#c04020' } });
    const stored = {
      'image/jpeg': await image.clone().jpeg().toBuffer(),
      'image/webp': await image.clone().webp().toBuffer(),
      'image/gif': await image.clone().gif().toBuffer(),
    };
    for (const [contentType, bytes] of Object.entries(stored)) {
      const row = await files.save({ accountId: 'acct_inputs', purpose: 'upload', contentType, width: 40, height: 30 }, bytes);
      const [input] = await files.mediaInputs([row.id]);
      const sent = await read(input!.open());
      expect(sent.length).toBe(input!.bytes);
      const meta = await sharp(sent).metadata();
      if (contentType === 'image/gif') {
        expect([input!.contentType, meta.format, meta.width, meta.height]).toEqual(['image/png', 'png', 40, 30]);
      } else {
        expect([input!.contentType, sent.equals(bytes)]).toEqual([contentType, true]);
      }
    }
  });
});
