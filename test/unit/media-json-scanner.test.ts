/**
 * The streaming media JSON reader on its own: every split of a body into chunks gives the same
 * decoded media and the same remaining JSON; escapes, references, nesting and limits.
 */
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ApiError, badRequest } from '../../server/errors.ts';
import { MediaJsonScanner, type MediaJsonFields, type MediaJsonLimits, type MediaSink } from '../../server/lib/media-json-scanner.ts';

const FIELDS = { dataUrlPaths: new Set(['firstFrame', 'mask', 'referenceImages[]', 'images[]']) };
const LIMITS: MediaJsonLimits = { maxMediaBytes: 1 << 20, maxItemBytes: 1 << 20, maxMediaCount: 8, maxOtherBytes: 64 * 1024, maxReferenceChars: 2048 };

interface Opened {
  param: string;
  mimeType: string;
  chunks: Buffer[];
  ended: boolean;
  aborted: boolean;
}

/** Scans `body` split into chunks of the given sizes (cycled); returns the rest JSON and the sinks. */
async function scan(body: string | Buffer, sizes: number[] = [65536], limits: Partial<MediaJsonLimits> = {}, fields: MediaJsonFields = FIELDS) {
  const opened: Opened[] = [];
  const scanner = new MediaJsonScanner(fields, { ...LIMITS, ...limits }, (param, mimeType) => {
    const o: Opened = { param, mimeType, chunks: [], ended: false, aborted: false };
    opened.push(o);
    const sink: MediaSink = {
      write: (c) => void o.chunks.push(Buffer.from(c)),
      end: async () => {
        o.ended = true;
        return `tok:${opened.indexOf(o)}`;
      },
      abort: () => {
        o.aborted = true;
      },
    };
    return sink;
  });
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  let pos = 0;
  let i = 0;
  try {
    while (pos < bytes.length) {
      const n = sizes[i++ % sizes.length]!;
      await scanner.push(bytes.subarray(pos, pos + n));
      pos += n;
    }
    return { json: JSON.parse(scanner.end().toString('utf8')) as Record<string, unknown>, opened, bytes: scanner.mediaBytesRead };
  } catch (err) {
    scanner.abort(err as Error);
    throw Object.assign(err as Error, { opened });
  }
}

const dataUrl = (data: Buffer, mime = 'image/png') => `data:${mime};base64,${data.toString('base64')}`;

async function apiError(promise: Promise<unknown>): Promise<{ status: number; code: string; param: string | null; opened: Opened[] }> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof ApiError) return { status: err.status, code: err.code, param: err.param, opened: (err as unknown as { opened: Opened[] }).opened };
    throw err;
  }
  throw new Error('expected an ApiError');
}

describe('MediaJsonScanner', () => {
  const a = randomBytes(70_000);
  const b = randomBytes(1234);
  const body = JSON.stringify({
    prompt: 'a "quoted" \\ prompt with firstFrame inside',
    firstFrame: dataUrl(a),
    nested: { firstFrame: 'data:image/png;base64,AAAA', list: ['images'] },
    referenceImages: [dataUrl(b, 'image/jpeg'), 'file_abc123', 'https://example.com/x.png'],
    seconds: 4,
  });

  it.each([[[65536]], [[1]], [[7, 3, 1, 2000]], [[3]], [[body.length]]])('decodes media and keeps the rest for chunk sizes %j', async (sizes) => {
    const { json, opened, bytes } = await scan(body, sizes);
    expect(opened.map((o) => [o.param, o.mimeType, o.ended])).toEqual([
      ['firstFrame', 'image/png', true],
      ['referenceImages[0]', 'image/jpeg', true],
    ]);
    expect(Buffer.concat(opened[0]!.chunks).equals(a)).toBe(true);
    expect(Buffer.concat(opened[1]!.chunks).equals(b)).toBe(true);
    expect(bytes).toBe(a.length + b.length);
    expect(json).toEqual({
      prompt: 'a "quoted" \\ prompt with firstFrame inside',
      firstFrame: 'tok:0',
      nested: { firstFrame: 'data:image/png;base64,AAAA', list: ['images'] },
      referenceImages: ['tok:1', 'file_abc123', 'https://example.com/x.png'],
      seconds: 4,
    });
  });

  it('honours escaped slashes and \\u escapes inside a data URL (as PHP writes them), in any split', async () => {
    const data = Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 37) % 256)); // plenty of '/' in base64
    const escaped = `{"firstFrame":"${dataUrl(data).replaceAll('/', '\\/').replace('data', '\\u0064ata')}"}`;
    for (const sizes of [[1], [5, 11], [65536]]) {
      const { json, opened } = await scan(escaped, sizes);
      expect(json.firstFrame).toBe('tok:0');
      expect(Buffer.concat(opened[0]!.chunks).equals(data)).toBe(true);
    }
  });

  it('keeps escaped and non-ASCII characters of references and of other strings', async () => {
    const { json } = await scan(JSON.stringify({ mask: 'https://exämple.com/ü?x=\u2603', images: ['file_\u00e9'], prompt: 'snow ☃ "man"' }), [2]);
    expect(json).toEqual({ mask: 'https://exämple.com/ü?x=\u2603', images: ['file_\u00e9'], prompt: 'snow ☃ "man"' });
  });

  it('treats a key escaped in the body as the same key', async () => {
    const { opened } = await scan(`{"first\\u0046rame":"${dataUrl(b)}"}`);
    expect(opened.map((o) => o.param)).toEqual(['firstFrame']);
  });

  it.each([
    ['a bad character', `data:image/png;base64,AAA!AAAA`],
    ['padding in the middle', `data:image/png;base64,AA==AAAA`],
    ['a truncated quad', `data:image/png;base64,AAAAA`],
    ['three padding characters', `data:image/png;base64,A===`],
    ['a newline escape', `data:image/png;base64,AAAA\\nAAAA`],
  ])('refuses %s with 400 invalid_data_url', async (_what, value) => {
    const err = await apiError(scan(`{"firstFrame":"${value}"}`, [3]));
    expect([err.status, err.code, err.param]).toEqual([400, 'invalid_data_url', 'firstFrame']);
  });

  it('refuses invalid base64 in the middle of a large data URL as soon as it is read, and aborts the sink', async () => {
    const good = randomBytes(600_000).toString('base64');
    const bad = `${good.slice(0, 400_000)}!${good.slice(400_001)}`;
    const err = await apiError(scan(`{"firstFrame":"data:image/png;base64,${bad}"}`, [65536]));
    expect([err.status, err.code]).toEqual([400, 'invalid_data_url']);
    expect(err.opened[0]!.aborted).toBe(true);
    expect(err.opened[0]!.ended).toBe(false);
  });

  it.each([
    ['another scheme', 'data:text/plain;base64,AAAA'],
    ['no base64 marker', 'data:image/png,AAAA'],
    ['an empty body', 'data:image/png;base64,'],
    ['a bare data: prefix', 'data:'],
  ])('refuses a data URL with %s', async (_what, value) => {
    const err = await apiError(scan(JSON.stringify({ images: [value] })));
    expect([err.status, err.code, err.param]).toEqual([400, 'invalid_data_url', 'images[0]']);
  });

  it('enforces the byte limits exactly: at the limit passes, one byte over fails while reading', async () => {
    const data = randomBytes(3000);
    await expect(scan(JSON.stringify({ firstFrame: dataUrl(data) }), [100], { maxMediaBytes: 3000 })).resolves.toBeDefined();
    const total = await apiError(scan(JSON.stringify({ firstFrame: dataUrl(data) }), [100], { maxMediaBytes: 2999 }));
    expect([total.status, total.code]).toEqual([413, 'media_total_too_large']);
    const item = await apiError(scan(JSON.stringify({ images: [dataUrl(data)] }), [100], { maxItemBytes: 2999 }));
    expect([item.status, item.code, item.param]).toEqual([413, 'media_too_large', 'images[0]']);
  });

  it('counts every media string, data URLs and references alike, against the count limit', async () => {
    const four = JSON.stringify({ firstFrame: dataUrl(b), referenceImages: ['file_a', 'https://x.example/a.png', dataUrl(b)] });
    await expect(scan(four, [9], { maxMediaCount: 4 })).resolves.toBeDefined();
    const err = await apiError(scan(four, [9], { maxMediaCount: 3 }));
    expect([err.status, err.code, err.param]).toEqual([413, 'too_many_media_inputs', 'referenceImages[2]']);
  });

  it('bounds the rest of the JSON and the length of references', async () => {
    const rest = await apiError(scan(JSON.stringify({ prompt: 'x'.repeat(70_000) }), [1000]));
    expect([rest.status, rest.code]).toEqual([413, 'body_too_large']);
    const ref = await apiError(scan(JSON.stringify({ mask: `https://example.com/${'a'.repeat(3000)}` })));
    expect([ref.status, ref.code]).toEqual([400, 'invalid_data_url']);
  });

  it('leaves media strings of other positions and a body that is not an object alone', async () => {
    const { json, opened } = await scan(JSON.stringify([{ firstFrame: dataUrl(b) }]), [5]);
    expect(opened).toHaveLength(0);
    expect(json).toEqual([{ firstFrame: dataUrl(b) }]);
  });

  it('reports a body that ends inside a string', async () => {
    const err = await apiError(scan(`{"firstFrame":"data:image/png;base64,AAAA`));
    expect([err.status, err.code]).toEqual([400, 'invalid_json']);
  });

  describe('bare base64 members of objects in a top-level array (upstream answers: data[].b64_json)', () => {
    const B64 = { base64Paths: new Set(['data[].b64_json']) };
    const answer = JSON.stringify({
      created: 1,
      data: [{ b64_json: a.toString('base64'), revised_prompt: 'a "b64_json" prompt' }, { url: 'https://x.example/1.png' }, { b64_json: b.toString('base64') }],
      b64_json: 'not in data',
      usage: { data: [{ b64_json: 'nested too deep' }] },
    });

    it.each([[[65536]], [[1]], [[5, 11, 4096]]])('decodes them and keeps the rest for chunk sizes %j', async (sizes) => {
      const { json, opened, bytes } = await scan(answer, sizes, { maxMediaBytes: 1 << 20 }, B64);
      expect(opened.map((o) => [o.param, o.mimeType, o.ended])).toEqual([
        ['data[0].b64_json', '', true],
        ['data[2].b64_json', '', true],
      ]);
      expect(Buffer.concat(opened[0]!.chunks).equals(a)).toBe(true);
      expect(Buffer.concat(opened[1]!.chunks).equals(b)).toBe(true);
      expect(bytes).toBe(a.length + b.length);
      expect(json).toEqual({
        created: 1,
        data: [{ b64_json: 'tok:0', revised_prompt: 'a "b64_json" prompt' }, { url: 'https://x.example/1.png' }, { b64_json: 'tok:1' }],
        b64_json: 'not in data',
        usage: { data: [{ b64_json: 'nested too deep' }] },
      });
    });

    it('honours escaped slashes, refuses what is not base64, and keeps an empty string', async () => {
      const slashy = Buffer.from([0xff, 0xff, 0xfe, 0xff, 0xef, 0xff]); // base64 "///+/+//"
      const escaped = JSON.stringify({ data: [{ b64_json: slashy.toString('base64') }] }).replaceAll('/', '\\/');
      const { opened } = await scan(escaped, [3], {}, B64);
      expect(Buffer.concat(opened[0]!.chunks).equals(slashy)).toBe(true);
      const bad = await apiError(scan(JSON.stringify({ data: [{ b64_json: 'not base64!' }] }), [4], {}, B64));
      expect([bad.code, bad.param]).toEqual(['invalid_data_url', 'data[0].b64_json']);
      // An empty one stays empty (the answer may carry a `url` instead); its sink is dropped.
      const empty = await scan(JSON.stringify({ data: [{ b64_json: '', url: 'https://x.example/1.png' }] }), [4], {}, B64);
      expect(empty.json).toEqual({ data: [{ b64_json: '', url: 'https://x.example/1.png' }] });
      expect(empty.opened.map((o) => [o.ended, o.aborted])).toEqual([[false, true]]);
    });
  });

  describe('a limit of its own for a path (a JSON edit: 16 images and a mask)', () => {
    const EDIT: MediaJsonFields = {
      dataUrlPaths: new Set(['mask', 'images[]']),
      maxCounts: new Map([
        ['images[]', { max: 2, tooMany: (param: string) => badRequest('too_many_images', 'too many', param) }],
        ['mask', { max: 1, tooMany: (param: string) => badRequest('invalid_request', 'one mask', param) }],
      ]),
    };

    it('counts the elements of the path, apart from other paths, and refuses one more as it starts', async () => {
      await expect(scan(JSON.stringify({ images: [dataUrl(b), 'file_a'], mask: dataUrl(b) }), [7], {}, EDIT)).resolves.toBeDefined();
      const images = await apiError(scan(JSON.stringify({ mask: dataUrl(b), images: [dataUrl(b), 'file_a', dataUrl(b)] }), [7], {}, EDIT));
      expect([images.status, images.code, images.param, images.opened.length]).toEqual([400, 'too_many_images', 'images[2]', 2]);
      // A repeated key counts too (JSON.parse would keep the last; the first one was already read).
      const masks = await apiError(scan(`{"mask":"file_a","mask":"file_b"}`, [65536], {}, EDIT));
      expect([masks.code, masks.param]).toEqual(['invalid_request', 'mask']);
    });

    it('keeps the count limit of all paths together', async () => {
      const err = await apiError(scan(JSON.stringify({ images: ['file_a', 'file_b'], mask: 'file_c' }), [65536], { maxMediaCount: 2 }, EDIT));
      expect([err.status, err.code, err.param]).toEqual([413, 'too_many_media_inputs', 'mask']);
    });
  });

  describe('both spellings of an aliased field (firstFrame and first_frame)', () => {
    const ALIASED: MediaJsonFields = {
      dataUrlPaths: new Set(['firstFrame', 'first_frame', 'referenceImages[]', 'reference_images[]']),
      aliases: new Map([
        ['firstFrame', 'first_frame'],
        ['first_frame', 'firstFrame'],
        ['referenceImages[]', 'reference_images[]'],
        ['reference_images[]', 'referenceImages[]'],
      ]),
    };

    it.each([[[65536]], [[1]], [[7, 3, 1, 2000]]])('reads, counts and stores the same data URL once, for chunk sizes %j', async (sizes) => {
      // Escaped differently and with another type: the same image all the same.
      const twin = dataUrl(a, 'image/jpeg').replaceAll('/', '\\/');
      const body = `{"firstFrame":${JSON.stringify(dataUrl(a))},"prompt":"x","first_frame":"${twin}"}`;
      const { json, opened, bytes } = await scan(body, sizes, { maxMediaBytes: a.length, maxMediaCount: 1 }, ALIASED);
      expect(opened.map((o) => [o.param, o.ended])).toEqual([['firstFrame', true]]);
      expect(bytes).toBe(a.length);
      expect(json).toEqual({ firstFrame: 'tok:0', prompt: 'x', first_frame: 'tok:0' });
    });

    it('pairs the elements of aliased arrays by index, in either order', async () => {
      const body = JSON.stringify({ reference_images: [dataUrl(b), 'file_x'], referenceImages: [dataUrl(b), 'file_x', dataUrl(a)] });
      const { json, opened } = await scan(body, [100], {}, ALIASED);
      expect(opened.map((o) => o.param)).toEqual(['reference_images[0]', 'referenceImages[2]']);
      expect(json).toEqual({ reference_images: ['tok:0', 'file_x'], referenceImages: ['tok:0', 'file_x', 'tok:1'] });
    });

    it.each([
      ['another image of the same size', randomBytes(a.length)],
      ['a longer image', Buffer.concat([a, Buffer.from([1])])],
      ['a shorter image', a.subarray(1)],
    ])('refuses %s under the other spelling with 400 alias_conflict, storing nothing of it', async (_what, other) => {
      const err = await apiError(scan(JSON.stringify({ firstFrame: dataUrl(a), first_frame: dataUrl(other) }), [4096], {}, ALIASED));
      expect([err.status, err.code, err.param]).toEqual([400, 'alias_conflict', 'first_frame']);
      expect(err.opened.map((o) => o.param)).toEqual(['firstFrame']);
    });

    it.each([[[65536]], [[1]], [[5, 2, 9]]])('counts the same reference (file id, URL) under both spellings once, for chunk sizes %j', async (sizes) => {
      const refs = ['file_a', 'https://cdn.example/b.png', 'file_c'];
      const body = JSON.stringify({ referenceImages: refs, prompt: 'x', reference_images: refs, firstFrame: 'file_f', first_frame: 'file_f' });
      const { json } = await scan(body, sizes, { maxMediaCount: 4 }, ALIASED);
      expect(json).toEqual(JSON.parse(body));
      // One more input, under either spelling, is past the limit.
      const over = await apiError(scan(JSON.stringify({ reference_images: [...refs, 'file_d'], referenceImages: [...refs, 'file_d'], first_frame: 'file_f' }), sizes, { maxMediaCount: 4 }, ALIASED));
      expect([over.code, over.param]).toEqual(['too_many_media_inputs', 'first_frame']);
    });

    it('counts a different reference, or a data URL after a reference, under the other spelling (the contract then refuses the disagreement)', async () => {
      const other = await apiError(scan(JSON.stringify({ firstFrame: 'file_a', first_frame: 'file_b' }), [65536], { maxMediaCount: 1 }, ALIASED));
      expect([other.code, other.param]).toEqual(['too_many_media_inputs', 'first_frame']);
      const data = await apiError(scan(JSON.stringify({ firstFrame: 'file_a', first_frame: dataUrl(b) }), [65536], { maxMediaCount: 1 }, ALIASED));
      expect([data.code, data.param]).toEqual(['too_many_media_inputs', 'first_frame']);
    });

    it('counts a reference under the other spelling (the contract then refuses the disagreement), and a repeated key', async () => {
      const ref = await apiError(scan(JSON.stringify({ firstFrame: dataUrl(b), first_frame: 'file_x' }), [65536], { maxMediaCount: 1 }, ALIASED));
      expect([ref.code, ref.param]).toEqual(['too_many_media_inputs', 'first_frame']);
      const { opened } = await scan(`{"firstFrame":${JSON.stringify(dataUrl(b))},"firstFrame":${JSON.stringify(dataUrl(b))}}`, [65536], {}, ALIASED);
      expect(opened).toHaveLength(2);
    });
  });
});
