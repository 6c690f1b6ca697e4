/**
 * Media tokens of aggregator mappings (kit/mapping.ts): the client's prompt sits in the same
 * context as the tokens that stand for its media inputs, so no text a client can write may be taken
 * for one — a prompt that spells a token used to be swapped for the client's file, or (with no
 * media) to fail the mapping as misconfigured, which faults the model on the member for everyone.
 */
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { checkMapping, imageContext, mappedInput, videoContext, type UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ImageJob, MediaInput } from '../../server/providers/types.ts';
import { imageParams } from '../support/image-params.ts';
import { videoJob } from '../support/video-job.ts';

function media(name: string): MediaInput {
  const bytes = Buffer.from(`png bytes of ${name}`);
  return { contentType: 'image/png', bytes: bytes.length, width: 64, height: 64, open: () => Readable.from([bytes]), url: async (ttl = 0) => `https://gw.example/v1/files/${name}?ttl=${ttl}` };
}


const imageJob = (over: Partial<ImageJob> = {}): ImageJob => ({ operation: 'generation', model: 'x', prompt: 'a fox', n: 1, params: imageParams(), inputs: [], ...over });

const I2V: UpstreamMapping = { endpoint: 'fal-ai/kling-video/v2.1/pro/image-to-video', input: '{"prompt": prompt, "negative_prompt": negative_prompt, "image_url": first_frame}', output: 'video.url' };
const EDIT: UpstreamMapping = { endpoint: 'fal-ai/flux/dev', input: '{"prompt": prompt, "image_url": images[0]}', output: 'images.url' };

/** The old fixed token, and guesses at the new form (a nonce of zeros, of the same length as a real one). */
const SPELLED = ['mediagate-media-input:0', 'mediagate-media-input:1', `mediagate-media-input:${'0'.repeat(24)}:0`, 'mediagate-media-input:x:0'];

describe('a client prompt that spells a media token', () => {
  it('reaches the upstream verbatim when the request has no media', async () => {
    for (const prompt of SPELLED) {
      expect(await mappedInput(I2V, videoContext(videoJob({ prompt, negativePrompt: prompt })))).toEqual({ prompt, negative_prompt: prompt });
    }
  });

  it('reaches the upstream verbatim beside the real media input, which is still encoded', async () => {
    for (const prompt of SPELLED) {
      expect(await mappedInput(I2V, videoContext(videoJob({ prompt, firstFrame: media('frame') })))).toEqual({ prompt, image_url: 'https://gw.example/v1/files/frame?ttl=3600' });
      expect(await mappedInput(EDIT, imageContext(imageJob({ operation: 'edit', prompt, inputFiles: [media('photo')] })))).toEqual({ prompt, image_url: 'https://gw.example/v1/files/photo?ttl=3600' });
    }
  });

  it("cannot spell another request's token: each request draws its own", async () => {
    const first = videoContext(videoJob({ firstFrame: media('frame') }));
    const second = videoContext(videoJob({ prompt: first.context.first_frame!, firstFrame: media('other') }));
    expect(second.context.first_frame).not.toBe(first.context.first_frame);
    expect(await mappedInput(I2V, second)).toEqual({ prompt: first.context.first_frame, image_url: 'https://gw.example/v1/files/other?ttl=3600' });
  });

  it("is not taken for a media input by the save-time check, which flags only the sample request's own tokens", async () => {
    await checkMapping('fal', 'video', { ...I2V, input: '{"prompt": "mediagate-media-input:0 " & prompt, "image_url": first_frame}' });
  });
});
