import createClient from 'openapi-fetch';
import type { paths } from './generated/api.ts';
import type { MediagateApi } from './api.ts';
import { createVideo, type CreateVideoOptions } from './create-video.ts';
import { streamImage, streamImageEdit, type ImageStreamOptions } from './image-stream.ts';
import { uploadFile, type UploadFileOptions } from './upload-file.ts';
import type {
  FinishedVideoTask,
  ImageEditStreamEvent,
  ImageEditStreamRequest,
  ImageGenerationStreamEvent,
  ImageStreamRequest,
  MediagateFile,
  MediagateResult,
  VideoCreateRequest,
  VideoTaskCreated,
} from './types.ts';
import { waitForVideo, type WaitForVideoOptions } from './wait-for-video.ts';

export type { MediagateApi } from './api.ts';
export type { CreateVideoOptions } from './create-video.ts';
export type { ImageStreamOptions } from './image-stream.ts';
export type { UploadFileOptions } from './upload-file.ts';
export { MediagateError, MediagateNetworkError, isMediagateError, type MediagateErrorInit } from './mediagate-error.ts';
export type * from './types.ts';
export { VideoWaitTimeoutError, type WaitForVideoOptions } from './wait-for-video.ts';
export { verifyWebhook, WebhookVerificationError, type WebhookHeaders } from './verify-webhook.ts';

/** Options of `createMediagateClient`. */
export interface MediagateClientOptions {
  /** Server origin, such as `http://localhost:8080` (paths start with `/v1`). */
  baseUrl: string;
  /** An API key (`mg_…`), sent as `Authorization: Bearer`. */
  apiKey: string;
  /** A fetch implementation (tests, proxies); defaults to `globalThis.fetch`. */
  fetch?: (input: Request) => Promise<Response>;
}

/**
 * A Mediagate client. `api` is the raw typed openapi-fetch client (`{ data, error, response }`
 * per call). Helper error style: `createVideo` and `uploadFile` return `{ data } | { error }` like `api`;
 * `waitForVideo` and the streams, which run over time, reject/throw. Every HTTP error of the
 * helpers, returned or thrown, is a `MediagateError`; `api` returns the contract's error body
 * (`MediagateError.fromResponse(response, error)` makes it one).
 */
export interface MediagateClient {
  /** The raw typed client over every path of the contract. */
  readonly api: MediagateApi;
  /** See `createVideo` in `create-video.ts`: creates a video task, retrying once on an accepted quote change. */
  createVideo(body: VideoCreateRequest, options?: CreateVideoOptions): Promise<MediagateResult<VideoTaskCreated>>;
  /** Polls a video task until it is `completed` or `failed`. */
  waitForVideo(id: string, options?: WaitForVideoOptions): Promise<FinishedVideoTask>;
  /** Streams an image generation as typed events. */
  streamImage(
    body: ImageStreamRequest,
    options?: ImageStreamOptions,
  ): AsyncGenerator<ImageGenerationStreamEvent, void, undefined>;
  /** See `uploadFile` in `upload-file.ts`: uploads an image (a `Blob`, streamed) for later requests to name by id. */
  uploadFile(file: Blob, options?: UploadFileOptions): Promise<MediagateResult<MediagateFile>>;
  /** Streams an image edit (JSON body) as typed events. */
  streamImageEdit(
    body: ImageEditStreamRequest,
    options?: ImageStreamOptions,
  ): AsyncGenerator<ImageEditStreamEvent, void, undefined>;
}

/** Builds a Mediagate client that authenticates every request with `apiKey`. */
export function createMediagateClient(options: MediagateClientOptions): MediagateClient {
  const api = createClient<paths>({
    baseUrl: options.baseUrl,
    headers: { Authorization: `Bearer ${options.apiKey}` },
    ...(options.fetch ? { fetch: options.fetch } : {}),
  });
  return {
    api,
    createVideo: (body, opts) => createVideo(api, body, opts),
    waitForVideo: (id, opts) => waitForVideo(api, id, opts),
    streamImage: (body, opts) => streamImage(api, body, opts),
    streamImageEdit: (body, opts) => streamImageEdit(api, body, opts),
    uploadFile: (file, opts) => uploadFile(api, file, opts),
  };
}
