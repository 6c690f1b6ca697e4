import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import {
  editImage,
  escapeXml,
  imageInfo,
  InvalidImageError,
  MaskSizeMismatchError,
  renderImage,
  wrapText,
} from '../../server/providers/local/image/render-image.ts';

const PROMPT = 'A lighthouse on a cliff at dusk, oil painting & <waves> "spray"';

async function rgba(buf: Buffer) {
  const { data, info } = await sharp(buf).ensureAlpha().raw().toBuffer({ resolveWithObject: true });
  return {
    width: info.width,
    height: info.height,
    at(x: number, y: number): [number, number, number, number] {
      const i = (y * info.width + x) * 4;
      return [data[i] ?? -1, data[i + 1] ?? -1, data[i + 2] ?? -1, data[i + 3] ?? -1];
    },
    data,
  };
}

/** Pixels with all of R, G and B ≥ 245 (only the prompt text is drawn that bright). */
async function whitePixels(buf: Buffer): Promise<number> {
  const { data, info } = await sharp(buf).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  let n = 0;
  for (let i = 0; i < data.length; i += info.channels) if (data[i]! >= 245 && data[i + 1]! >= 245 && data[i + 2]! >= 245) n++;
  return n;
}

async function meanAbsDiff(a: Buffer, b: Buffer): Promise<number> {
  const [ra, rb] = await Promise.all([sharp(a).removeAlpha().raw().toBuffer(), sharp(b).removeAlpha().raw().toBuffer()]);
  expect(ra.length).toBe(rb.length);
  let sum = 0;
  for (let i = 0; i < ra.length; i++) sum += Math.abs(ra[i]! - rb[i]!);
  return sum / ra.length;
}

describe('renderImage', () => {
  for (const format of ['png', 'jpeg', 'webp'] as const) {
    it(`renders ${format} at exactly the requested size`, async () => {
      for (const [width, height] of [
        [1248, 832],
        [3840, 1648],
        [1024, 640],
      ] as const) {
        const { image, partials } = await renderImage({ prompt: PROMPT, width, height, format, transparent: false });
        expect(partials).toEqual([]);
        const meta = await sharp(image).metadata();
        expect(meta.format).toBe(format);
        expect([meta.width, meta.height]).toEqual([width, height]);
        expect(meta.hasAlpha).toBe(false);
      }
    });
  }

  it('renders a transparent png and webp with a transparent corner', async () => {
    for (const format of ['png', 'webp'] as const) {
      const { image } = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format, transparent: true });
      const meta = await sharp(image).metadata();
      expect(meta.hasAlpha).toBe(true);
      const px = await rgba(image);
      expect(px.at(0, 0)[3]).toBe(0);
      expect(px.at(1247, 831)[3]).toBe(0);
      // Something is opaque (the text panel sits in the lower middle).
      expect(px.at(624, 640)[3]).toBe(255);
    }
  });

  it('refuses a transparent jpeg', async () => {
    await expect(renderImage({ prompt: PROMPT, width: 256, height: 256, format: 'jpeg', transparent: true })).rejects.toThrow(/png or webp/);
  });

  it('compresses jpeg and webp by quality and png losslessly', async () => {
    const jpeg0 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'jpeg', transparent: false, compression: 0 });
    const jpeg90 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'jpeg', transparent: false, compression: 90 });
    expect(jpeg90.image.length).toBeLessThan(jpeg0.image.length);
    const webp0 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'webp', transparent: false, compression: 0 });
    const webp90 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'webp', transparent: false, compression: 90 });
    expect(webp90.image.length).toBeLessThan(webp0.image.length);
    const png0 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'png', transparent: false, compression: 0 });
    const png100 = await renderImage({ prompt: PROMPT, width: 1248, height: 832, format: 'png', transparent: false, compression: 100 });
    expect(png100.image.length).toBeLessThan(png0.image.length);
    expect(await meanAbsDiff(png0.image, png100.image)).toBe(0);
  });

  it('returns the requested partial images at the output size and format, coarse to fine', async () => {
    for (const format of ['png', 'jpeg', 'webp'] as const) {
      const { image, partials } = await renderImage({ prompt: PROMPT, width: 1248, height: 704, format, transparent: false, partials: 3 });
      expect(partials).toHaveLength(3);
      const diffs: number[] = [];
      for (const p of partials) {
        const meta = await sharp(p).metadata();
        expect([meta.format, meta.width, meta.height]).toEqual([format, 1248, 704]);
        diffs.push(await meanAbsDiff(p, image));
      }
      // Each preview is closer to the final image than the one before.
      expect(diffs[0]!).toBeGreaterThan(diffs[1]!);
      expect(diffs[1]!).toBeGreaterThan(diffs[2]!);
    }
    const one = await renderImage({ prompt: PROMPT, width: 512, height: 1536, format: 'png', transparent: true, partials: 1 });
    expect(one.partials).toHaveLength(1);
    expect((await sharp(one.partials[0]!).metadata()).hasAlpha).toBe(true);
    const clamped = await renderImage({ prompt: PROMPT, width: 512, height: 512, format: 'png', transparent: false, partials: 9 });
    expect(clamped.partials).toHaveLength(3);
  });

  it('is deterministic per prompt and seed, and differs across prompts and seeds', async () => {
    const base = { width: 640, height: 1024, format: 'png' as const, transparent: false };
    const a = await renderImage({ ...base, prompt: PROMPT, seed: 1 });
    const again = await renderImage({ ...base, prompt: PROMPT, seed: 1 });
    const seed2 = await renderImage({ ...base, prompt: PROMPT, seed: 2 });
    const other = await renderImage({ ...base, prompt: 'A red fox in the snow', seed: 1 });
    expect(a.image.equals(again.image)).toBe(true);
    expect(await meanAbsDiff(a.image, seed2.image)).toBeGreaterThan(5);
    expect(await meanAbsDiff(a.image, other.image)).toBeGreaterThan(5);
  });

  it('visibly contains the prompt text', async () => {
    const base = { width: 1248, height: 832, format: 'png' as const, transparent: false, seed: 3 };
    const withText = await renderImage({ ...base, prompt: PROMPT });
    const empty = await renderImage({ ...base, prompt: '' });
    expect(await meanAbsDiff(withText.image, empty.image)).toBeGreaterThan(1);
    // The background never reaches near-white; the text does.
    expect(await whitePixels(empty.image)).toBe(0);
    expect(await whitePixels(withText.image)).toBeGreaterThan(2000);
    // A longer prompt draws more text.
    const longer = await renderImage({ ...base, prompt: `${PROMPT} ${PROMPT} ${PROMPT}` });
    expect(await whitePixels(longer.image)).toBeGreaterThan(await whitePixels(withText.image));
  });

  it('survives hostile and huge prompts', async () => {
    const hostile = '</text></svg><script>x</script> \u0000\u0007 \uD800 ]]> &amp; ' + 'x'.repeat(500) + ' end';
    const r = await renderImage({ prompt: hostile, width: 512, height: 512, format: 'png', transparent: false });
    expect(await whitePixels(r.image)).toBeGreaterThan(100);
    const huge = await renderImage({ prompt: 'word '.repeat(6400), width: 512, height: 512, format: 'jpeg', transparent: false });
    expect((await sharp(huge.image).metadata()).width).toBe(512);
  });

  it('renders 4K at its full size', async () => {
    const { image } = await renderImage({ prompt: PROMPT, width: 3840, height: 2160, format: 'png', transparent: false });
    expect(await sharp(image).metadata()).toMatchObject({ width: 3840, height: 2160, format: 'png' });
  });
});

describe('text helpers', () => {
  it('escapes XML and drops characters XML cannot carry', () => {
    expect(escapeXml(`<a href="x">&'</a>`)).toBe('&lt;a href=&quot;x&quot;&gt;&amp;&apos;&lt;/a&gt;');
    expect(escapeXml('a\u0000b\uD800c\u{1F600}')).toBe('ab c\u{1F600}'.replace(' ', ''));
  });

  it('wraps words and ellipsises overflow', () => {
    expect(wrapText('one two three four', 9, 5)).toEqual(['one two', 'three', 'four']);
    expect(wrapText('abcdefghij', 4, 5)).toEqual(['abcd', 'efgh', 'ij']);
    const lines = wrapText('one two three four five six', 9, 2);
    expect(lines).toHaveLength(2);
    expect(lines[1]!.endsWith('…')).toBe(true);
    expect(wrapText('   ', 10, 3)).toEqual([]);
  });
});

describe('editImage', () => {
  const W = 640;
  const H = 480;
  /** The region the mask marks for editing (transparent). */
  const HOLE = { x0: 200, y0: 120, x1: 520, y1: 360 };

  async function inputImage(): Promise<Buffer> {
    return (await renderImage({ prompt: 'input', width: W, height: H, format: 'png', transparent: false, seed: 7 })).image;
  }

  async function holeMask(width = W, height = H): Promise<Buffer> {
    const raw = Buffer.alloc(width * height * 4);
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        const inside = x >= HOLE.x0 && x < HOLE.x1 && y >= HOLE.y0 && y < HOLE.y1;
        raw[(y * width + x) * 4 + 3] = inside ? 0 : 255;
      }
    }
    return sharp(raw, { raw: { width, height, channels: 4 } }).png().toBuffer();
  }

  it('changes pixels only where the mask is transparent', async () => {
    const input = await inputImage();
    const { image } = await editImage({ prompt: 'Add a red balloon', input, mask: await holeMask(), format: 'png', transparent: false });
    const [before, after] = await Promise.all([rgba(input), rgba(image)]);
    expect([after.width, after.height]).toEqual([W, H]);
    const close = (a: number[], b: number[]) => a.slice(0, 3).every((v, i) => Math.abs(v - b[i]!) <= 2);
    // Outside the hole: unchanged everywhere (sampled on a grid).
    let outside = 0;
    let inside = 0;
    let changedInside = 0;
    for (let y = 2; y < H; y += 7) {
      for (let x = 3; x < W; x += 7) {
        const isInside = x >= HOLE.x0 && x < HOLE.x1 && y >= HOLE.y0 && y < HOLE.y1;
        if (isInside) {
          inside++;
          if (!close(before.at(x, y), after.at(x, y))) changedInside++;
        } else {
          outside++;
          expect(close(before.at(x, y), after.at(x, y)), `pixel ${x},${y}`).toBe(true);
        }
      }
    }
    expect(outside).toBeGreaterThan(1000);
    expect(changedInside / inside).toBeGreaterThan(0.95);
    // The prompt text is inside the hole.
    expect(await whitePixels(image)).toBeGreaterThan(300);
  });

  it('edits everywhere without a mask and keeps the input size', async () => {
    const input = await inputImage();
    const { image, partials } = await editImage({ prompt: 'Make it winter', input, format: 'jpeg', transparent: false, partials: 2 });
    const meta = await sharp(image).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['jpeg', W, H]);
    expect(partials).toHaveLength(2);
    for (const p of partials) expect(await imageInfo(p)).toEqual({ format: 'jpeg', width: W, height: H, hasAlpha: false });
    const [before, after] = await Promise.all([rgba(input), rgba(image)]);
    for (const [x, y] of [
      [5, 5],
      [W - 5, H - 5],
      [W / 2, H / 2],
    ] as const) {
      const d = before.at(x, y).slice(0, 3).reduce((s, v, i) => s + Math.abs(v - after.at(x, y)[i]!), 0);
      expect(d).toBeGreaterThan(10);
    }
    expect(await whitePixels(image)).toBeGreaterThan(300);
  });

  it('renders at a requested size and format', async () => {
    const input = await inputImage();
    const { image } = await editImage({ prompt: 'Wider', input, mask: await holeMask(), width: 1248, height: 704, format: 'webp', transparent: false });
    expect(await imageInfo(image)).toEqual({ format: 'webp', width: 1248, height: 704, hasAlpha: false });
  });

  it('keeps transparency when asked', async () => {
    const input = (await renderImage({ prompt: 'sticker', width: W, height: H, format: 'png', transparent: true })).image;
    const mask = await holeMask();
    const { image } = await editImage({ prompt: 'Add a hat', input, mask, format: 'png', transparent: true });
    const px = await rgba(image);
    expect((await sharp(image).metadata()).hasAlpha).toBe(true);
    expect(px.at(0, 0)[3]).toBe(0); // outside the hole, transparent as in the input
    const flat = await editImage({ prompt: 'Add a hat', input, mask, format: 'png', transparent: false });
    expect((await sharp(flat.image).metadata()).hasAlpha).toBe(false);
    await expect(editImage({ prompt: 'x', input, format: 'jpeg', transparent: true })).rejects.toThrow(/png or webp/);
  });

  it('rejects undecodable inputs and masks', async () => {
    const input = await inputImage();
    await expect(editImage({ prompt: 'x', input: Buffer.from('not an image'), format: 'png', transparent: false })).rejects.toBeInstanceOf(InvalidImageError);
    await expect(editImage({ prompt: 'x', input: input.subarray(0, 200), format: 'png', transparent: false })).rejects.toBeInstanceOf(InvalidImageError);
    const badMask = editImage({ prompt: 'x', input, mask: Buffer.from('nope'), format: 'png', transparent: false });
    await expect(badMask).rejects.toBeInstanceOf(InvalidImageError);
    await expect(badMask).rejects.toMatchObject({ which: 'mask' });
    const opaqueMask = await sharp({ create: { width: W, height: H, channels: 3, background: '#000' } }).png().toBuffer();
    await expect(editImage({ prompt: 'x', input, mask: opaqueMask, format: 'png', transparent: false })).rejects.toThrow(/alpha/);
    await expect(editImage({ prompt: 'x', input, mask: await holeMask(W / 2, H / 2), format: 'png', transparent: false })).rejects.toBeInstanceOf(
      MaskSizeMismatchError,
    );
  });
});

describe('imageInfo', () => {
  it('describes decodable images and returns undefined otherwise', async () => {
    const png = (await renderImage({ prompt: 'x', width: 320, height: 256, format: 'png', transparent: true })).image;
    expect(await imageInfo(png)).toEqual({ format: 'png', width: 320, height: 256, hasAlpha: true });
    const jpeg = (await renderImage({ prompt: 'x', width: 320, height: 256, format: 'jpeg', transparent: false })).image;
    expect(await imageInfo(jpeg)).toEqual({ format: 'jpeg', width: 320, height: 256, hasAlpha: false });
    expect(await imageInfo(Buffer.from('garbage'))).toBeUndefined();
    expect(await imageInfo(Buffer.alloc(0))).toBeUndefined();
  });
});
