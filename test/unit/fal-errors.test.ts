/**
 * fal's 422 `detail[]` (falError, fal-api.ts) blames by its items' types, as fal's "Model Errors"
 * reference lists them (docs.fal.ai/errors): a refusal of the client's media is the client's
 * (`invalid_request`, fal's words passed on); one of the input's shape or values is the mapping's
 * (`misconfigured`: the operator's to read in member health); fal failing to fetch the gateway's
 * signed URL is the operator's; its content checker is `policy`; a partner service of fal failing
 * is nobody's configuration.
 */
import { describe, expect, it } from 'vitest';
import { falError } from '../../server/providers/fal/fal-api.ts';

const headers = (h: Record<string, string> = { 'x-fal-retryable': 'false' }) => ({ get: (name: string) => h[name.toLowerCase()] ?? null });
const item = (type: string, msg: string, field = 'image_url') => ({ loc: ['body', field], msg, type, url: `https://docs.fal.ai/errors/#${type}` });
const refused = (detail: unknown, status = 422, h = headers()) => falError({ status, headers: h, body: { detail } }, 'video result', 'fal-ai/kling-video/v2.1/pro/image-to-video');

describe('falError', () => {
  it('blames the client for its media, in fal\'s words without fal\'s field names', () => {
    const cases: [string, string][] = [
      ['image_too_small', 'Image dimensions are too small. Minimum dimensions are 300x300 pixels.'],
      ['image_too_large', 'Image too large'],
      ['image_load_error', 'The file is not a valid image.'],
      ['unsupported_image_format', 'Unsupported image format. Supported formats are .jpg, .jpeg, .png.'],
      ['file_too_large', 'File too large'],
      ['face_detection_error', 'Could not detect face in the image'],
      ['video_duration_too_short', 'Video duration is too short. Minimum is 3 seconds, provided is 1 seconds.'],
      ['audio_duration_too_long', 'Audio duration exceeds the maximum allowed.'],
      ['unsupported_video_format', 'Unsupported video format.'],
    ];
    for (const [type, msg] of cases) {
      const err = refused([{ ...item(type, msg), ctx: { min_height: 300 } }]);
      expect([err.kind, err.message, err.upstreamStatus, err.upstreamCode], type).toEqual(['invalid_request', msg, 422, type]);
    }
    const two = refused([item('image_too_small', 'Image too small'), item('file_too_large', 'File too large', 'tail_image_url')]);
    expect([two.kind, two.message]).toEqual(['invalid_request', 'Image too small; File too large']);
  });

  it('blames the mapping for the input\'s shape and values, fal failing to fetch the gateway\'s URL, and any type it does not know', () => {
    for (const detail of [
      [item('one_of', "Input should be '5' or '10'", 'duration')],
      [item('greater_than_equal', 'Input should be greater than or equal to 0', 'strength')],
      [item('feature_not_supported', 'Feature not supported', 'tail_image_url')],
      [{ loc: ['body', 'prompt'], msg: 'field required', type: 'value_error.missing' }],
      [item('file_download_error', 'Failed to download the file. Please check if the URL is accessible.')],
      [item('some_new_type', 'Something new')],
      // One item of the mapping's makes the whole refusal the operator's to fix.
      [item('image_too_small', 'Image too small'), item('one_of', "Input should be '5' or '10'", 'duration')],
      [{ loc: ['body', 'image_url'], msg: 'Image too small' }],
      'Unprocessable Entity',
    ]) {
      const err = refused(detail);
      expect([err.kind, err.message], JSON.stringify(detail)).toEqual(['misconfigured', expect.stringMatching(/^fal refused the input that the mapping made for fal-ai\/kling-video\/v2.1\/pro\/image-to-video \(HTTP 422: /)]);
    }
  });

  it('says a refusal of fal\'s content checker as such, whatever else the list holds', () => {
    const err = refused([item('image_too_small', 'Image too small'), item('content_policy_violation', 'The content could not be processed because it contained material flagged by a content checker.', 'prompt')]);
    expect(err.kind).toBe('policy');
  });

  it('fails a request a partner service of fal failed (400 downstream_service_error) without blaming the member; retried when fal says it may pass', () => {
    const detail = [{ loc: ['body'], msg: 'Downstream service error', type: 'downstream_service_error', url: 'https://docs.fal.ai/errors/#downstream_service_error' }];
    expect([refused(detail, 400).kind, refused(detail, 400).message]).toEqual(['failed', 'a service fal relies on failed (Downstream service error)']);
    expect(refused(detail, 400, headers({ 'x-fal-retryable': 'true' })).kind).toBe('retryable');
  });
});
