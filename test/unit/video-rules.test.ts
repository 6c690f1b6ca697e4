/** The video creation rules a schema cannot express (product spec §4.6), as pure functions. */
import { describe, expect, it } from 'vitest';
import type { VideoCapabilities } from '../../server/catalog/capabilities.ts';
import { ApiError } from '../../server/errors.ts';
import { checkAgainstModel, isCompositeModelId, mediaInputsOf, normalizeVideoRequest, withMediaIdentities } from '../../server/services/video/video-request.ts';

const caps: VideoCapabilities = {
  durations: [4, 8],
  aspectRatios: ['16:9', '9:16'],
  resolutions: ['480p', '720p'],
  frames: 'first-only',
  referenceImages: { maxCount: 2, configurable: true },
  audio: { supported: true, defaultEnabled: true },
};
const PNG_1X1 = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const base = { client_request_id: 'c1', prompt: 'p', model: 'm', seconds: 4, aspectRatio: '16:9', resolution: '720p' };

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return err.code;
    throw err;
  }
  return undefined;
}

describe('normalizeVideoRequest', () => {
  it('resolves alias pairs and a decimal-string duration', () => {
    const req = normalizeVideoRequest({ ...base, seconds: '8', duration: 8, aspect_ratio: '16:9', generateAudio: false } as never);
    expect(req).toMatchObject({ durationSeconds: 8, aspectRatio: '16:9', generateAudio: false, referenceImages: [] });
  });

  it('rejects aliases that disagree', () => {
    expect(codeOf(() => normalizeVideoRequest({ ...base, seconds: 4, duration_seconds: 8 } as never))).toBe('alias_conflict');
    expect(codeOf(() => normalizeVideoRequest({ ...base, aspect_ratio: '9:16' } as never))).toBe('alias_conflict');
  });
});

describe('checkAgainstModel', () => {
  const check = (extra: Record<string, unknown>) => () => checkAgainstModel(normalizeVideoRequest({ ...base, ...extra } as never), caps);

  it('checks duration, ratio and resolution independently, in that order', () => {
    expect(codeOf(check({ seconds: 5 }))).toBe('unsupported_duration');
    expect(codeOf(check({ aspectRatio: '1:1' }))).toBe('unsupported_aspect_ratio');
    expect(codeOf(check({ resolution: '1080p' }))).toBe('unsupported_resolution');
    expect(codeOf(check({ seconds: 5, resolution: '1080p' }))).toBe('unsupported_duration');
  });

  it('applies the frame and reference-image rules', () => {
    expect(codeOf(check({ lastFrame: PNG_1X1 }))).toBe('last_frame_requires_first_frame');
    expect(codeOf(check({ firstFrame: PNG_1X1, referenceImages: [PNG_1X1] }))).toBe('frames_with_reference_images');
    expect(codeOf(check({ firstFrame: PNG_1X1, lastFrame: PNG_1X1 }))).toBe('last_frame_not_supported');
    expect(codeOf(check({ referenceImages: [PNG_1X1, PNG_1X1, PNG_1X1] }))).toBe('too_many_reference_images');
    expect(checkAgainstModel(normalizeVideoRequest({ ...base, firstFrame: PNG_1X1 } as never), caps)).toEqual({ generateAudio: true, inputMode: 'first_frame', inputCount: 1 });
    expect(checkAgainstModel(normalizeVideoRequest({ ...base, referenceImages: [PNG_1X1, PNG_1X1] } as never), caps).inputMode).toBe('reference_images');
  });

  it('defaults audio to the model and refuses audio a model cannot make', () => {
    expect(checkAgainstModel(normalizeVideoRequest(base as never), caps).generateAudio).toBe(true);
    expect(codeOf(() => checkAgainstModel(normalizeVideoRequest({ ...base, generate_audio: true } as never), { ...caps, audio: { supported: false, defaultEnabled: false } }))).toBe('audio_not_supported');
  });
});

describe('isCompositeModelId', () => {
  it('recognises a known id with duration, ratio or resolution segments, and nothing else', () => {
    const known = ['local-video-1', 'veo-3.1'];
    expect(isCompositeModelId('local-video-1-8s-720p', known)).toBe(true);
    expect(isCompositeModelId('local-video-1_16:9', known)).toBe(true);
    expect(isCompositeModelId('veo-3.1-4k', known)).toBe(true);
    expect(isCompositeModelId('local-video-1:720p', known)).toBe(true);
    expect(isCompositeModelId('local-video-1 720p', known)).toBe(true);
    expect(isCompositeModelId('local-video-1-4', known)).toBe(false);
    expect(isCompositeModelId('local-video-1', known)).toBe(false);
    expect(isCompositeModelId('local-video-1-pro', known)).toBe(false);
    expect(isCompositeModelId('other-8s', known)).toBe(false);
  });
});

describe('mediaInputsOf', () => {
  it('lists the image inputs in task order and counts every media input, reference videos and audios too', () => {
    const req = normalizeVideoRequest({ ...base, referenceImages: ['file_a', 'sha256:b'], reference_videos: ['https://example.com/v.mp4'] } as never);
    expect(mediaInputsOf(req, { maxCount: 3 })).toEqual([
      { value: 'file_a', param: 'referenceImages[0]', role: 'reference_image' },
      { value: 'sha256:b', param: 'referenceImages[1]', role: 'reference_image' },
    ]);
    expect(codeOf(() => mediaInputsOf(req, { maxCount: 2 }))).toBe('too_many_media_inputs');
    const framed = normalizeVideoRequest({ ...base, first_frame: 'x', lastFrame: 'y' } as never);
    expect(mediaInputsOf(framed, { maxCount: 2 }).map((i) => [i.param, i.role])).toEqual([
      ['firstFrame', 'first_frame'],
      ['lastFrame', 'last_frame'],
    ]);
    expect(codeOf(() => mediaInputsOf(normalizeVideoRequest({ ...base, reference_audios: ['http://example.com/a.mp3'] } as never), { maxCount: 5 }))).toBe('invalid_media_url');
  });

  it('makes aliases carrying the same staged image agree, by identity', () => {
    const identity = (v: string) => (v.startsWith('tok') ? 'sha256:same' : v);
    const req = normalizeVideoRequest(withMediaIdentities({ ...base, firstFrame: 'tok1', first_frame: 'tok2' } as never, identity));
    expect(req.firstFrame).toBe('sha256:same');
    expect(codeOf(() => normalizeVideoRequest(withMediaIdentities({ ...base, firstFrame: 'tok1', first_frame: 'file_x' } as never, identity)))).toBe('alias_conflict');
  });
});
