/**
 * Aggregator mappings (issue 31, requirement 2): JSONata from the normalized request to the
 * upstream's input and from its answer to the output URLs, checked when saved, media inputs encoded
 * as the mapping says without passing through JSONata.
 */
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { Base64Source, jsonStream } from '../../server/lib/base64-json.ts';
import { MappingError, checkMapping, imageContext, mappedInput, mappedOutputs, videoContext, type UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ImageJob, MediaInput, VideoJob } from '../../server/providers/types.ts';

function media(name: string): MediaInput {
  const bytes = Buffer.from(`png bytes of ${name}`);
  return { contentType: 'image/png', bytes: bytes.length, width: 64, height: 64, open: () => Readable.from([bytes]), url: async (ttl = 0) => `https://gw.example/v1/files/${name}?ttl=${ttl}` };
}

const job = (over: Partial<VideoJob> = {}): VideoJob => ({
  taskId: 'vid_1',
  model: 'x',
  prompt: 'a fox',
  negativePrompt: null,
  durationSeconds: 8,
  aspectRatio: '16:9',
  resolution: '720p',
  generateAudio: true,
  referenceImages: [],
  referenceVideos: [],
  referenceAudios: [],
  ...over,
});

const KLING: UpstreamMapping = {
  endpoint: 'fal-ai/kling-video/v2.1/standard/image-to-video',
  input: `{
    "prompt": prompt,
    "negative_prompt": negative_prompt,
    "duration": $string(duration) & "s",
    "aspect_ratio": $lookup({"16:9": "landscape_16_9", "9:16": "portrait_16_9"}, aspect_ratio),
    "start_image_url": first_frame,
    "tail_image_url": last_frame
  }`,
  output: 'video.url',
};

async function fails(p: Promise<unknown>): Promise<MappingError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(MappingError);
  return err as MappingError;
}

describe('checkMapping (when a mapping is saved)', () => {
  it('accepts a fal and a Replicate mapping of each documented endpoint form', async () => {
    await checkMapping('fal', 'video', KLING);
    await checkMapping('fal', 'image', { endpoint: 'fal-ai/flux/dev', input: '{"prompt": prompt, "num_images": n}', output: 'images.url' });
    for (const endpoint of ['black-forest-labs/flux-schnell', `stability-ai/sdxl:${'a'.repeat(64)}`, 'b'.repeat(64), 'deployments/acme/my-flux']) {
      await checkMapping('replicate', 'image', { endpoint, input: '{"prompt": prompt}', output: 'output', wait: 30 });
    }
  });

  it('names the bad part: the endpoint form per provider, a syntax error with its position, an input that makes no object, media inside a string, wait where it does not apply', async () => {
    expect((await fails(checkMapping('fal', 'video', { ...KLING, endpoint: 'kling-video' }))).path).toBe('endpoint');
    expect((await fails(checkMapping('replicate', 'image', { ...KLING, endpoint: 'owner/name:v1' }))).message).toContain("is 'owner/name:v1', which is not a Replicate model");
    const syntax = await fails(checkMapping('fal', 'video', { ...KLING, input: '{"prompt": prompt,' }));
    expect(syntax.path).toBe('input');
    expect(syntax.message).toMatch(/is not a valid JSONata expression: .*\(at character \d+/);
    expect((await fails(checkMapping('fal', 'video', { ...KLING, output: 'video.(url' }))).path).toBe('output');
    expect((await fails(checkMapping('fal', 'video', { ...KLING, input: 'prompt' }))).message).toContain('must make a JSON object of the request; for a sample video request it made "a red fox');
    expect((await fails(checkMapping('fal', 'video', { ...KLING, input: '{"image": "see " & first_frame}' }))).message).toContain("puts a media input inside a longer string (at 'image')");
    expect((await fails(checkMapping('fal', 'image', { ...KLING, wait: 10 }))).path).toBe('wait');
    expect((await fails(checkMapping('replicate', 'video', { endpoint: 'a/b', input: '{}', output: 'output', wait: 10 }))).message).toContain('image models only');
  });
});

describe('a mapping that does not end', () => {
  // JSONata never yields while it recurses: without a limit this froze the process (no timer fired).
  const LOOP = '($f := function($x){ $f($x + 1) }; $f(0))';
  const DEEP = '($f := function($x){ $x > 0 ? $x + $f($x - 1) : 0 }; $f(100000))';

  it('is refused when saved, stopped within its time or depth limit, not run until the process is killed', async () => {
    for (const [input, said] of [
      [LOOP, /was stopped: it ran longer than 250 ms/],
      [DEEP, /was stopped: it nests deeper than 500 steps/],
    ] as const) {
      const err = await fails(checkMapping('fal', 'video', { ...KLING, input }));
      expect([err.path, err.message]).toEqual(['input', expect.stringMatching(said)]);
    }
  });

  it('on a path the sample request does not take is stopped when a request takes it, and the next request runs', async () => {
    const mapping = { ...KLING, input: `prompt = "boom" ? ${LOOP} : {"prompt": prompt}` };
    await checkMapping('fal', 'video', mapping);
    const err = await fails(mappedInput(mapping, videoContext(job({ prompt: 'boom' }))));
    expect(err.message).toMatch(/was stopped: it ran longer than 250 ms/);
    expect(await mappedInput(mapping, videoContext(job()))).toEqual({ prompt: 'a fox' });
  });
});

describe('mappedInput', () => {
  it('renames, maps values, leaves out what the request lacks, and hands media as signed URLs by default', async () => {
    const first = media('first');
    const input = await mappedInput(KLING, videoContext(job({ firstFrame: first })));
    expect(input).toEqual({ prompt: 'a fox', duration: '8s', aspect_ratio: 'landscape_16_9', start_image_url: 'https://gw.example/v1/files/first?ttl=3600' });
  });

  it('streams media as data URLs or bare base64 (Base64Sources, never strings of the bytes) when the mapping says so', async () => {
    const refs = [media('a'), media('b')];
    const mapping = { endpoint: 'fal-ai/x', input: '{"images": reference_images, "first": reference_images[0]}', output: 'video.url' };
    const asData = await mappedInput({ ...mapping, media: 'data_url' }, videoContext(job({ referenceImages: refs })));
    expect((asData.images as unknown[]).every((v) => v instanceof Base64Source)).toBe(true);
    expect(asData.first).toBeInstanceOf(Base64Source);
    const asBase64 = await mappedInput({ ...mapping, media: 'base64' }, videoContext(job({ referenceImages: refs })));
    expect(asBase64.first).toBeInstanceOf(Base64Source);
    // As the adapter's body writes them: a JSON string streamed from the stored bytes.
    const text = async (s: Base64Source) => {
      const chunks: Buffer[] = [];
      for await (const c of jsonStream(s).body) chunks.push(Buffer.from(c as Buffer));
      return JSON.parse(Buffer.concat(chunks).toString()) as string;
    };
    expect(await text(asData.first as Base64Source)).toBe(`data:image/png;base64,${Buffer.from('png bytes of a').toString('base64')}`);
    expect(await text(asBase64.first as Base64Source)).toBe(Buffer.from('png bytes of a').toString('base64'));
  });

  it("an image edit's inputs and mask by URL, with the size fields of the normalized request", async () => {
    const files = [media('in0'), media('in1'), media('mask')];
    const imageJob: ImageJob = {
      operation: 'edit',
      model: 'x',
      prompt: 'make it blue',
      n: 2,
      params: { width: 1024, height: 1536, resolution: '1K', aspectRatio: '2:3', quality: 'auto', resolvedQuality: 'high', background: 'auto', transparent: false, outputFormat: 'png', outputCompression: undefined, responseFormat: 'url', partialImages: 0, requestedSize: 'auto' },
      inputs: [Buffer.from('a'), Buffer.from('b')],
      mask: Buffer.from('m'),
      inputFiles: files,
    };
    const input = await mappedInput(
      { endpoint: 'fal-ai/flux/dev/image-to-image', input: '{"prompt": prompt, "image_urls": images, "mask_url": mask, "num_images": n, "image_size": {"width": width, "height": height}, "quality": quality, "format": output_format}', output: 'images.url' },
      imageContext(imageJob),
    );
    expect(input).toEqual({
      prompt: 'make it blue',
      image_urls: ['https://gw.example/v1/files/in0?ttl=3600', 'https://gw.example/v1/files/in1?ttl=3600'],
      mask_url: 'https://gw.example/v1/files/mask?ttl=3600',
      num_images: 2,
      image_size: { width: 1024, height: 1536 },
      quality: 'high',
      format: 'png',
    });
  });
});

describe('mappedOutputs', () => {
  it('finds one URL or many, in fal results and Replicate predictions, and ignores what is not a URL', async () => {
    expect(await mappedOutputs(KLING, { video: { url: 'https://v3.fal.media/files/out.mp4', content_type: 'video/mp4' } })).toEqual(['https://v3.fal.media/files/out.mp4']);
    const images = { images: [{ url: 'https://fal.media/a.png' }, { url: 'https://fal.media/b.png' }], seed: 1 };
    expect(await mappedOutputs({ ...KLING, output: 'images.url' }, images)).toEqual(['https://fal.media/a.png', 'https://fal.media/b.png']);
    expect(await mappedOutputs({ ...KLING, output: 'output' }, { status: 'succeeded', output: ['https://replicate.delivery/x/0.webp', 'https://replicate.delivery/x/1.webp'] })).toHaveLength(2);
    expect(await mappedOutputs({ ...KLING, output: 'output' }, { status: 'succeeded', output: 'https://replicate.delivery/x/out.mp4' })).toEqual(['https://replicate.delivery/x/out.mp4']);
    expect(await mappedOutputs({ ...KLING, output: 'video.url' }, { video: null })).toEqual([]);
    expect(await mappedOutputs({ ...KLING, output: 'output' }, { output: ['not a url', 42] })).toEqual([]);
  });
});
