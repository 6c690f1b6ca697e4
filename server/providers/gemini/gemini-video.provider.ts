/**
 * Provider kind `gemini`, videos: Veo on the Gemini API (upstream-apis.md §4), a long-running
 * operation.
 *
 *   submit    POST {base}/models/{model}:predictLongRunning, header x-goog-api-key, with the SDK's
 *             wire shapes: images as {bytesBase64Encoded, mimeType} (the REST doc's inlineData is
 *             refused live, §4 DISAGREE 1), first frame `image`, `lastFrame`, up to 3
 *             `referenceImages` of type ASSET; parameters aspectRatio, resolution, a NUMERIC
 *             durationSeconds, negativePrompt. Never `generateAudio` (Veo 3 always has audio; the
 *             Gemini API rejects the field) nor any Vertex-only parameter. Returns the operation
 *             `name`.
 *   poll      GET {base}/{name}: done false → running; `error` (a google.rpc.Status with a gRPC
 *             code) → failed; `raiMediaFilteredCount` without samples → failed under the content
 *             policy (refunded); a sample's `video.uri` → succeeded. `generatedVideos` (what some
 *             relays return) is read as well as the wire's `generatedSamples`.
 *   download  GET {uri} with the key (downloadOutput: redirects followed by hand, the key only to
 *             the upstream's own origin, never to the storage host it redirects to); streamed.
 *
 * The Veo constraints (8 s with 1080p/4k, a last frame or reference images; audio always on) live in
 * the catalog entry (`durationConstraints`, `audio.alwaysOn`), so creation refuses what Veo cannot
 * run; `check` refuses what no Veo model can express (reference videos/audios, other ratios).
 */
import {
  ProviderError,
  downloadOutput,
  inlineBase64,
  jsonStream,
  readJson,
  sanitizeMessage,
  shapeOf,
  upstreamFetch,
  upstreamUrl,
  type Base64Source,
  type MediaInput,
  type UpstreamAccount,
  type VideoContent,
  type VideoJob,
  type VideoOutputRef,
  type VideoProvider,
  type VideoShape,
  type VideoStatus,
} from '../kit.ts';
import { googleError, googleErrorOf } from './gemini-errors.ts';

/** Veo jobs take 11 s to 6 min (§4.2); the docs poll every 10 s. */
export const VEO_POLL_MS = 10_000;
const RATIOS = ['16:9', '9:16'];
const RESOLUTIONS = ['720p', '1080p', '4k'];
const MAX_REFERENCE_IMAGES = 3;

/** gRPC codes (google.rpc.Code) of an operation error that mean the request itself was refused. */
// INVALID_ARGUMENT, OUT_OF_RANGE: the request. FAILED_PRECONDITION (9) is the project's state, not
// the client's: such a job counts as the upstream's failure.
const GRPC_INVALID = new Set([3, 11]);

interface Operation {
  name?: unknown;
  done?: unknown;
  error?: { code?: unknown; message?: unknown };
  response?: {
    generateVideoResponse?: VideoResponse;
    generatedVideos?: Sample[];
    generatedSamples?: Sample[];
  } & VideoResponse;
}
interface VideoResponse {
  generatedSamples?: Sample[];
  generatedVideos?: Sample[];
  raiMediaFilteredCount?: unknown;
  raiMediaFilteredReasons?: unknown;
}
interface Sample {
  video?: { uri?: unknown };
}

export class GeminiVideoProvider implements VideoProvider {
  constructor(readonly pollIntervalMs = VEO_POLL_MS) {}

  check(shape: VideoShape): string | undefined {
    if (!RATIOS.includes(shape.aspectRatio)) return `aspect ratios ${RATIOS.join(' and ')} only`;
    if (!RESOLUTIONS.includes(shape.resolution)) return `resolutions ${RESOLUTIONS.join(', ')} only`;
    if (shape.referenceVideos > 0 || shape.referenceAudios > 0) return 'no reference videos or audios';
    if (shape.referenceImages > MAX_REFERENCE_IMAGES) return `at most ${MAX_REFERENCE_IMAGES} reference images`;
    if (shape.hasLastFrame && !shape.hasFirstFrame) return 'a last frame only together with a first frame';
    return undefined;
  }

  async submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
    const unsupported = this.check(shapeOf(job));
    if (unsupported) throw new ProviderError('invalid_request', `Veo accepts ${unsupported}`);
    const instance: Record<string, unknown> = { prompt: job.prompt };
    if (job.firstFrame) instance.image = image(job.firstFrame);
    if (job.lastFrame) instance.lastFrame = image(job.lastFrame);
    if (job.referenceImages.length > 0) instance.referenceImages = job.referenceImages.map((data) => ({ image: image(data), referenceType: 'ASSET' }));
    const parameters: Record<string, unknown> = { aspectRatio: job.aspectRatio, resolution: job.resolution, durationSeconds: job.durationSeconds };
    if (job.negativePrompt) parameters.negativePrompt = job.negativePrompt;
    // Inputs are base64 inside the JSON: made while each stored input is read, never whole in memory.
    const { body, length } = jsonStream({ instances: [instance], parameters });
    const res = await upstreamFetch(
      upstreamUrl(account, `/models/${encodeURIComponent(job.model)}:predictLongRunning`),
      { method: 'POST', headers: { ...auth(account), 'content-type': 'application/json', 'content-length': String(length) }, body },
      signal,
      'video submit',
    );
    if (!res.ok) throw await googleError(res, 'video submit');
    const operation = (await readJson(res)) as Operation | undefined;
    // An error envelope answered with status 200 (a relay's way): no operation was made, its status
    // decides (a refusal is not an answer that may have started a job, to submit again for an hour).
    const hasName = typeof operation?.name === 'string' && operation.name !== '';
    if (!hasName && typeof operation?.error === 'object' && operation.error !== null) throw googleErrorOf(operation.error, 'video submit');
    if (typeof operation?.name !== 'string' || operation.name === '') throw new ProviderError('retryable', 'the upstream accepted the video job without returning its operation name', { maybeAccepted: true });
    return operation.name;
  }

  async poll(account: UpstreamAccount, operationName: string, _job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    // The name is opaque (`models/veo…/operations/abc`): appended to the base as it is.
    const res = await upstreamFetch(upstreamUrl(account, `/${operationName.replace(/^\/+/, '')}`), { headers: auth(account) }, signal, 'video status');
    if (res.status === 404) {
      res.discard();
      return { state: 'failed', error: new ProviderError('failed', 'the upstream no longer knows this video operation', { upstreamStatus: 404 }) };
    }
    if (!res.ok) throw await googleError(res, 'video status');
    const op = (await readJson(res)) as Operation | undefined;
    if (op === undefined) throw new ProviderError('retryable', 'the upstream answered a video status that is not JSON');
    if (op.done !== true) return { state: 'running' };
    if (op.error) {
      const code = typeof op.error.code === 'number' ? op.error.code : undefined;
      const message = sanitizeMessage(op.error.message, 'the upstream reported the video job as failed');
      return { state: 'failed', error: new ProviderError(code !== undefined && GRPC_INVALID.has(code) ? 'invalid_request' : 'failed', message, { upstreamCode: code === undefined ? undefined : `grpc:${code}` }) };
    }
    const response = op.response?.generateVideoResponse ?? op.response ?? {};
    const uri = [...(response.generatedSamples ?? []), ...(response.generatedVideos ?? [])].map((s) => s.video?.uri).find((u): u is string => typeof u === 'string' && u !== '');
    if (uri) return { state: 'succeeded', output: { uri } };
    const filtered = Number(response.raiMediaFilteredCount ?? 0);
    if (filtered > 0) {
      const reasons = Array.isArray(response.raiMediaFilteredReasons) ? response.raiMediaFilteredReasons.filter((r): r is string => typeof r === 'string') : [];
      return { state: 'failed', error: new ProviderError('policy', sanitizeMessage(reasons[0], 'the video was filtered under the upstream content policy'), { upstreamCode: 'raiMediaFiltered' }) };
    }
    return { state: 'failed', error: new ProviderError('failed', 'the upstream finished the video job without a video') };
  }

  async download(account: UpstreamAccount, _operationName: string, output: VideoOutputRef, _job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    if (!output.uri) throw new ProviderError('failed', 'the upstream gave no video address');
    return downloadOutput(output.uri, signal, {
      authHeaders: auth(account),
      authOrigin: new URL(upstreamUrl(account, '/')).origin,
      upstreamError: googleError,
      expiredMessage: 'the upstream no longer has this video (files are kept about two days)',
    });
  }
}

function image(input: MediaInput): { bytesBase64Encoded: Base64Source; mimeType: string } {
  return { bytesBase64Encoded: inlineBase64(input), mimeType: input.contentType };
}

function auth(account: UpstreamAccount): Record<string, string> {
  return { 'x-goog-api-key': account.credentials.api_key ?? '' };
}

