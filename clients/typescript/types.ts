import type { components } from './generated/api.ts';
import type { MediagateError } from './mediagate-error.ts';

type Schemas = components['schemas'];

/** Every stable error `code` the service returns (generated `ErrorCode`). */
export type ErrorCode = Schemas['ErrorCode'];
/** Error class of an error body (`invalid_request_error`, `conflict_error`, …). */
export type ErrorType = Schemas['ErrorResponse']['error']['type'];
/** The body of every error response. */
export type ErrorResponse = Schemas['ErrorResponse'];
/** One priced row with a quote token (`currentQuote` of a `409 quote_stale` / `quote_expired`). */
export type VideoBillingRow = Schemas['VideoBillingRow'];
/** Body of `POST /v1/videos/generations`. */
export type VideoCreateRequest = Schemas['VideoCreateRequest'];
/** The `202` create shape of a video task. */
export type VideoTaskCreated = Schemas['VideoTaskCreated'];
/** The lookup shape of a video task (`GET /v1/videos/{id}`). */
export type VideoTask = Schemas['VideoTask'];
/** Final states of a video task; `waitForVideo` resolves on either. */
export type FinishedVideoTask = VideoTask & { status: 'completed' | 'failed' };

/** A stored media input (`POST /v1/files`, `GET /v1/files/{file_id}`); `uploadFile` returns one. */
export type MediagateFile = Schemas['File'];

/** Any payload of an image event stream, `error` frames included. */
export type ImageStreamEvent = Schemas['ImageStreamEvent'];
/** The payload of an `event: error` frame (the helpers throw it as a `MediagateError`). */
export type ImageStreamErrorEvent = Schemas['ImageStreamErrorEvent'];
/** Events yielded by `streamImage`: partial images, then one completed event per image. */
export type ImageGenerationStreamEvent =
  | Schemas['ImageGenerationPartialImageEvent']
  | Schemas['ImageGenerationCompletedEvent'];
/** Events yielded by `streamImageEdit`. */
export type ImageEditStreamEvent = Schemas['ImageEditPartialImageEvent'] | Schemas['ImageEditCompletedEvent'];

// Fields with a schema `default` stay optional here even if the types are generated with
// openapi-typescript's `defaultNonNullable` (which marks them required); the server applies them.
type ServerDefaulted = 'quality' | 'response_format' | 'n' | 'partial_images';
type StreamBody<T extends { stream?: boolean }> = Omit<T, ServerDefaulted | 'stream'> &
  Partial<Pick<T, ServerDefaulted & keyof T>>;

/** Body of `streamImage`: `POST /v1/images/generations` without `stream` (always `true`). */
export type ImageStreamRequest = StreamBody<Schemas['ImageGenerationRequest']>;
/** Body of `streamImageEdit`: the JSON variant of `POST /v1/images/edits` without `stream`. */
export type ImageEditStreamRequest = StreamBody<Schemas['ImageEditRequest']>;

/**
 * Result of a helper that makes one request whose failure is an expected outcome (a stale quote,
 * a quota). Same shape as openapi-fetch's `{ data } | { error }`; check `error` first.
 */
export type MediagateResult<T> =
  | { data: T; error?: never }
  | { data?: never; error: MediagateError };
