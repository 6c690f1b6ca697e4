/**
 * The adapter toolkit: everything an upstream adapter is built from, in one import, so that each
 * adapter is mostly its wire mapping (design §8; docs/ARCHITECTURE.md, "How to add a provider").
 *
 *   HTTP          upstreamFetch (one keep-alive pool, timeouts, abort), readJson,
 *                 readJsonWithMedia (an answer carrying data URLs, decoded as
 *                 it arrives), retryAfterMs, sanitizeMessage, kindOfStatus       upstream-http.ts
 *   errors        ProviderError and its kinds; an upstream's own codes → kinds   provider-error.ts, kit/error-codes.ts
 *   job status    an upstream's status words → running | succeeded | failed      kit/job-status.ts
 *   outputs       a finished job's output URL streamed, credentials only to
 *                 the upstream's origin, an expired link a permanent failure      kit/output-download.ts
 *   inputs        MediaInputs as inline base64, data URLs or signed URLs, inside
 *                 a JSON body streamed with exact length                          kit/media-encoding.ts, lib/base64-json.ts
 *   mappings      aggregators: an operator's JSONata mapping from the normalized
 *                 request to the upstream's input, and to the output URLs        kit/mapping.ts
 *
 * Every adapter also runs the conformance kit against its fake upstream
 * (test/support/video-adapter-conformance.ts).
 */
export { ProviderError, asProviderError, type ProviderErrorKind } from './provider-error.ts';
export { contentOf, isTimeout, kindOfStatus, readJson, readJsonWithMedia, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, type UpstreamRequest, type UpstreamResponse } from './upstream-http.ts';
export { kindOfCode, type CodeTable } from './kit/error-codes.ts';
export { jobStatus, type JobState, type StatusVocabulary } from './kit/job-status.ts';
export { downloadOutput, type DownloadOptions } from './kit/output-download.ts';
export { dataUrl, inlineBase64, signedUrl } from './kit/media-encoding.ts';
export { Base64Source, jsonStream } from '../lib/base64-json.ts';
export { downloadWithRetries, fetchOutputImage, generateQueuedImages, keptJob, type ImageQueue } from './kit/queued-images.ts';
export { MappingError, imageContext, mappedInput, mappedOutputs, videoContext, type UpstreamMapping } from './kit/mapping.ts';
export { shapeOf } from './types.ts';
export type { ImageEvents, ImageJob, ImageProvider, MediaInput, UpstreamAccount, VideoContent, VideoJob, VideoOutputRef, VideoProvider, VideoShape, VideoStatus } from './types.ts';
