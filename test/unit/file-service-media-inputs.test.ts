// The media inputs a task's adapter gets: a stored PNG, JPEG or WebP as stored, streamed; a GIF (an
// upload may be one) as a PNG of its first frame, since upstreams take PNG, JPEG and WebP only. The
// PNG is made once (streamed through files, never the whole GIF in memory) and kept as a stored
// input, which adapters open and its URL serves; the client's GIF stays as it was uploaded. An image
// stored turned (an EXIF orientation other than 1: a phone's photo) is handed over as an upright copy
// in the same way, known from the orientation its row records (read once for a row without one).
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { FileService } from '../../server/services/file.service.ts';
import { FilesystemMediaStore, type MediaStore } from '../../server/storage/media-store.ts';
import { startTestS3, type TestS3 } from '../support/s3-server.ts';
import { noisePng } from '../support/noise-png.ts';

const read = async (stream: NodeJS.ReadableStream) => {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
};

/** A FileService over `store` whose repository keeps its rows in memory (what save, open and mediaInputs use). */
function fileService(store: MediaStore, urls: 'gateway' | 'presigned', rows = new Map<string, FileRow>()) {
  const repo = {
    insert: async (row: FileRow) => {
      if (rows.has(row.id)) throw new Error('duplicate key value violates unique constraint "files_pkey"');
      rows.set(row.id, { ...row });
      return row.expiresAt;
    },
    find: async (id: string) => rows.get(id),
    findMany: async (ids: readonly string[]) => ids.map((id) => rows.get(id)).filter((r): r is FileRow => r !== undefined),
    recordOrientation: async (id: string, orientation: number) => void Object.assign(rows.get(id)!, { orientation }),
  };
  const files = new FileService(repo as never, store, {} as never, Buffer.alloc(32, 1), 'http://gateway.invalid', 3600, { urls, outputRetentionDays: 30 });
  return { files, rows };
}

/** A two-frame GIF whose first frame is red and second blue. */
async function twoFrameGif(width: number, height: number): Promise<Buffer> {
  const frame = (r: number, b: number) => Buffer.alloc(width * height * 3).fill(Buffer.from([r, 0, b]));
  const raw = Buffer.concat([frame(220, 0), frame(0, 220)]);
  return sharp(raw, { raw: { width, height: height * 2, channels: 3, pageHeight: height } as never }).gif().toBuffer();
}

describe('FileService.mediaInputs', () => {
  let dir: string;
  let s3: TestS3;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'mg-media-inputs-'));
    s3 = await startTestS3();
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true, maxRetries: 5 });
    await s3?.close();
  });

  it('hands a PNG, JPEG or WebP over as stored, and a GIF as a PNG of its first frame with its exact length', async () => {
    const { files } = fileService(new FilesystemMediaStore(dir), 'gateway');
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

  describe.each([
    ['filesystem', 'gateway'],
    ['S3', 'presigned'],
  ] as const)('a GIF on the %s store', (name, urls) => {
    it('is converted once, never read whole into memory; its URL serves the PNG; the upload stays a GIF', async () => {
      const store = name === 'S3' ? s3.store(`gif-${randomBytes(3).toString('hex')}/`) : new FilesystemMediaStore(dir);
      const { files, rows } = fileService(store, urls);
      const gif = await twoFrameGif(48, 32);
      const expiresAt = new Date(Date.now() + 7 * 86_400_000);
      const upload = await files.save({ accountId: 'acct_gif', purpose: 'upload', contentType: 'image/gif', width: 48, height: 32, expiresAt, filename: 'anim.gif' }, gif);
      const readAll = vi.spyOn(files, 'readAll');

      // Every attempt of a task (and every task naming the upload) gets the same stored PNG.
      const attempts = [];
      for (let i = 0; i < 3; i++) attempts.push((await files.mediaInputs([upload.id]))[0]!);
      expect(readAll).not.toHaveBeenCalled();
      expect(rows.size).toBe(2);
      const urlsOf = await Promise.all(attempts.map((input) => input.url(600)));
      const fileIds = urlsOf.map((url) => (urls === 'gateway' ? /\/v1\/files\/(file_\w+)\?/.exec(url)![1] : undefined));
      if (urls === 'gateway') expect(new Set(fileIds).size).toBe(1);

      const [input] = attempts;
      const sent = await read(input!.open());
      expect([input!.contentType, sent.length, input!.width, input!.height]).toEqual(['image/png', input!.bytes, 48, 32]);
      // The first frame: red, not the blue second one.
      const { data } = await sharp(sent).raw().toBuffer({ resolveWithObject: true });
      expect([data[0], data[2]]).toEqual([220, 0]);

      // What an upstream fetching the input by URL gets is the PNG too.
      if (urls === 'presigned') {
        const res = await fetch(urlsOf[0]!);
        expect([res.status, res.headers.get('content-type')]).toEqual([200, 'image/png']);
        expect(Buffer.from(await res.arrayBuffer()).equals(sent)).toBe(true);
      } else {
        const url = new URL(urlsOf[0]!);
        const opened = await files.open(fileIds[0]!, Number(url.searchParams.get('expires')), url.searchParams.get('signature')!);
        expect(opened.file.contentType).toBe('image/png');
        expect((await read(opened.read())).equals(sent)).toBe(true);
      }

      // The client's upload is unchanged: its row and its bytes.
      expect(rows.get(upload.id)).toMatchObject({ contentType: 'image/gif', bytes: gif.length, filename: 'anim.gif' });
      expect((await read(store.read(upload.storageKey))).equals(gif)).toBe(true);
    });
  });

  it.each([
    ['image/jpeg', 6, 'jpeg'],
    ['image/png', 8, 'png'],
    ['image/webp', 6, 'jpeg'],
  ] as const)('hands a %s tagged with orientation %d over as an upright %s copy without the tag, made once', async (contentType, orientation, copyFormat) => {
    const store = new FilesystemMediaStore(dir);
    const { files, rows } = fileService(store, 'gateway');
    // Stored 60x30, its left half red: shown 30x60, red on top (6) or at the bottom (8).
    const image = sharp({ create: { width: 60, height: 30, channels: 3, background: '#dd1010' } }).composite([{ input: { create: { width: 30, height: 30, channels: 3, background: '#1010dd' } }, left: 30, top: 0 }]);
    const format = contentType.slice('image/'.length) as 'jpeg' | 'png' | 'webp';
    const bytes = await image[format]({ quality: 95 }).withMetadata({ orientation }).toBuffer();
    const upload = await files.save({ accountId: 'acct_turned', purpose: 'upload', contentType, width: 30, height: 60, orientation, expiresAt: new Date(Date.now() + 86_400_000) }, bytes);
    const reads = vi.spyOn(store, 'localPath');

    const attempts = [];
    for (let i = 0; i < 3; i++) attempts.push((await files.mediaInputs([upload.id]))[0]!);
    // Decoded once, for the copy; later calls find it.
    expect(reads).toHaveBeenCalledTimes(1);
    expect(rows.size).toBe(2);
    const [input] = attempts;
    const sent = await read(input!.open());
    const meta = await sharp(sent).metadata();
    expect([input!.contentType, input!.bytes, input!.width, input!.height]).toEqual([`image/${copyFormat}`, sent.length, 30, 60]);
    expect([meta.format, meta.width, meta.height, meta.orientation]).toEqual([copyFormat, 30, 60, undefined]);
    const { data } = await sharp(sent).raw().toBuffer({ resolveWithObject: true });
    const redAt = (y: number) => data[(y * 30 + 15) * 3]! > 150;
    expect([redAt(10), redAt(50)]).toEqual(orientation === 6 ? [true, false] : [false, true]);
    // The client's file is unchanged.
    expect((await read(store.read(upload.storageKey))).equals(bytes)).toBe(true);
  });

  it('makes an upright copy no larger than the client\'s file (upstreams limit an input\'s bytes), and keeps a WebP\'s transparency as PNG', async () => {
    const store = new FilesystemMediaStore(dir);
    const { files } = fileService(store, 'gateway');
    // A photo-like image (noise) saved at quality 80: re-encoded at 95 it would grow by half.
    const noise = await noisePng(800, 600, 7);
    const photo = await sharp(noise).jpeg({ quality: 80 }).withMetadata({ orientation: 6 }).toBuffer();
    const upload = await files.save({ accountId: 'acct_big', purpose: 'upload', contentType: 'image/jpeg', width: 600, height: 800, orientation: 6, expiresAt: new Date(Date.now() + 86_400_000) }, photo);
    const [input] = await files.mediaInputs([upload.id]);
    expect([input!.contentType, input!.width, input!.height]).toEqual(['image/jpeg', 600, 800]);
    expect(input!.bytes).toBeLessThanOrEqual(photo.length);
    expect(await sharp(await noisePng(800, 600, 7)).jpeg({ quality: 95 }).toBuffer().then((b) => b.length)).toBeGreaterThan(photo.length);

    const clear = await sharp({ create: { width: 40, height: 20, channels: 4, background: { r: 200, g: 10, b: 10, alpha: 0.5 } } }).webp().withMetadata({ orientation: 8 }).toBuffer();
    const webp = await files.save({ accountId: 'acct_big', purpose: 'upload', contentType: 'image/webp', width: 20, height: 40, orientation: 8, expiresAt: new Date(Date.now() + 86_400_000) }, clear);
    const [copy] = await files.mediaInputs([webp.id]);
    expect([copy!.contentType, copy!.width, copy!.height]).toEqual(['image/png', 20, 40]);
    expect((await sharp(await read(copy!.open())).metadata()).hasAlpha).toBe(true);
  });

  it('decides from the row: a recorded upright input is handed over unread; one without an orientation is read once and recorded', async () => {
    const store = new FilesystemMediaStore(dir);
    const { files, rows } = fileService(store, 'gateway');
    const jpeg = await sharp({ create: { width: 40, height: 20, channels: 3, background: '#208040' } }).jpeg().withMetadata({ orientation: 6 }).toBuffer();
    const reads = vi.spyOn(store, 'localPath');
    // Recorded upright (whatever the bytes say): sent as stored, nothing decoded.
    const upright = await files.save({ accountId: 'acct_rows', purpose: 'upload', contentType: 'image/jpeg', width: 40, height: 20, orientation: 1 }, jpeg);
    for (let i = 0; i < 2; i++) expect((await read((await files.mediaInputs([upright.id]))[0]!.open())).equals(jpeg)).toBe(true);
    expect(reads).not.toHaveBeenCalled();
    // Not recorded (a row from before): its header is read once, the orientation kept on the row.
    const unknown = await files.save({ accountId: 'acct_rows', purpose: 'upload', contentType: 'image/jpeg', width: 20, height: 40 }, jpeg);
    expect(rows.get(unknown.id)!.orientation).toBeNull();
    for (let i = 0; i < 2; i++) expect((await files.mediaInputs([unknown.id]))[0]).toMatchObject({ width: 20, height: 40 });
    expect(rows.get(unknown.id)!.orientation).toBe(6);
    expect(reads).toHaveBeenCalledTimes(2); // the header, then the copy
  });

  it('two instances converting the same GIF at once keep one copy: the one whose row lost removes its bytes', async () => {
    const root = await mkdtemp(join(dir, 'race-'));
    const store = new FilesystemMediaStore(root);
    const rows = new Map<string, FileRow>();
    const a = fileService(store, 'gateway', rows).files;
    const b = fileService(store, 'gateway', rows).files;
    const upload = await a.save({ accountId: 'acct_gif', purpose: 'upload', contentType: 'image/gif', expiresAt: new Date(Date.now() + 86_400_000) }, await twoFrameGif(32, 32));
    const [[fromA], [fromB]] = await Promise.all([a.mediaInputs([upload.id]), b.mediaInputs([upload.id])]);
    const idOf = async (url: Promise<string>) => new URL(await url).pathname;
    expect(await idOf(fromA!.url())).toBe(await idOf(fromB!.url()));
    expect((await read(fromA!.open())).equals(await read(fromB!.open()))).toBe(true);
    expect(rows.size).toBe(2);
    const inputs = await readdir(join(root, 'input'), { recursive: true, withFileTypes: true });
    expect(inputs.filter((e) => e.isFile())).toHaveLength(1);
  });
});
