/**
 * What adapters and the services above them share. This is the bottom of the house: nothing here
 * imports from services, repositories or HTTP.
 */
import type { Readable } from 'node:stream';
import type { ProviderError } from './provider-error.ts';
import type { ProviderKind } from './provider-kinds.ts';
import type { UpstreamMapping } from './kit/mapping.ts';

/**
 * The upstream account a call runs on: a group member, with its decrypted credentials. Adapters
 * receive it on every call and keep no per-account state of their own.
 */
export interface UpstreamAccount {
  memberId: string;
  provider: ProviderKind;
  /** The member's base URL; null means the provider's public default. */
  baseUrl: string | null;
  /** Decrypted credentials by name (`api_key`, `access_key`, …); empty for `local`. */
  credentials: Readonly<Record<string, string>>;
  /** Catalog model id -> the upstream's model id, where they differ (jobs already carry the upstream's id). */
  modelMap: Readonly<Record<string, string>>;
  /**
   * The version of the member's configuration this account was read from (opaque; set by the pool).
   * What a call's failure says about the configuration (rejected credentials, a disabled account, a
   * model it cannot serve) is recorded only while the member still has this version: an answer to
   * the old credentials must not take out a member an admin has just fixed. Absent: not fenced.
   */
  configVersion?: string;
}

export type ImageFormat = 'png' | 'jpeg' | 'webp';

/** The normalized image request (stored in image_tasks.params): drives rendering and responses. */
export interface ImageParams {
  width: number;
  height: number;
  resolution: string;
  aspectRatio: string;
  /** The requested quality (may be `auto`) and the resolved one. */
  quality: 'auto' | 'low' | 'medium' | 'high';
  resolvedQuality: 'auto' | 'low' | 'medium' | 'high';
  /** Requested background (may be `auto`); resolved is transparent or opaque. */
  background: 'transparent' | 'opaque' | 'auto';
  transparent: boolean;
  outputFormat: ImageFormat;
  outputCompression: number | undefined;
  responseFormat: 'url' | 'b64_json';
  partialImages: number;
  /** The `size` as requested (`auto` when absent), for the streaming events. */
  requestedSize: string;
  /** `moderation: low` asked for (a generation): passed on by upstreams that have the setting (OpenAI GPT image models). */
  moderation?: 'low';
  /**
   * A synchronous request answered as an event stream: each image reaches the client as it is
   * made, before the settlement. A stream whose process stops is not released blindly
   * (ImageRunner.step): its hold waits for an operator.
   */
  stream?: true;
  /**
   * The model's `resize` setting when it is `native`: the upstream's image keeps its own pixel size
   * (`fitImage` only re-encodes a format that differs) and `width`/`height` are only what was asked
   * for and billed. Absent: resized to exactly `width` x `height`.
   */
  resize?: 'native';
}

export interface ImageJob {
  /**
   * The gateway's image task: the same on every call made for it (a failover, a later attempt), so
   * that an upstream that keys its jobs by the caller's id (Kling's `external_task_id`) knows a
   * resubmit for one it already took. Absent where only the job's shape is asked about
   * (`parallelCalls`, before the task exists) or an adapter is called on its own.
   */
  taskId?: string;
  operation: 'generation' | 'edit';
  /** The upstream's model id. */
  model: string;
  prompt: string;
  /** Number of images. */
  n: number;
  params: ImageParams;
  /** Edit inputs (decoded image files) and the optional mask. */
  inputs: Buffer[];
  mask?: Buffer;
  /** The same stored files as MediaInputs (inputs, then the mask), for upstreams that fetch them by URL. */
  inputFiles?: MediaInput[];
  /** The catalog model's mapping for this member's provider (aggregators: fal, Replicate). */
  mapping?: UpstreamMapping;
  /**
   * The member slots the pool took for this job: the adapter runs at most this many upstream calls
   * at once (absent: 1). Between 1 and the adapter's `parallelCalls`, as many as the member had free.
   */
  slots?: number;
  /**
   * An upstream job an earlier attempt of this task submitted and reported (`ImageEvents.submitted`),
   * still to be collected: the adapter waits for it (on this same member) instead of submitting a
   * new one, and submits further jobs only for images it does not make.
   */
  resume?: unknown;
}

export interface GeneratedImage {
  image: Buffer;
  revisedPrompt?: string;
  /**
   * This image's token usage as the upstream reported it (OpenAI-compatible upstreams), for the
   * streamed `*.completed` event; absent when the upstream reported none (the event says zero).
   */
  usage?: { inputTokens: number; outputTokens: number; totalTokens: number; textTokens: number; imageTokens: number };
}

/**
 * Where an adapter hands its results, in order, as they arrive. `image` resolves once the image is
 * stored and delivered; it rejects when the client went away, and the adapter then stops.
 */
export interface ImageEvents {
  partial(imageIndex: number, partialIndex: number, image: Buffer): Promise<void>;
  image(imageIndex: number, image: GeneratedImage): Promise<void>;
  /**
   * Set for a task that can be resumed (a background task): an adapter whose upstream runs jobs
   * (a queue) calls it once the upstream accepted one, with a JSON reference to the job that a later
   * attempt gets back as `ImageJob.resume`. Once it resolved, the job is recorded: an abort of the
   * call (the engine stopping, the lease lost) leaves it running for whoever resumes the task, where
   * an unrecorded job given up on is cancelled. Should it reject, the job is cancelled and the
   * call fails with its error.
   */
  submitted?(ref: unknown): Promise<void>;
}

/** A pixel size, upright (EXIF orientation applied) as the gateway measures an input (inspectImage). */
export interface ImageInputSize {
  width: number;
  height: number;
}

/** What decides, before anything is held, whether an upstream can take an edit's input images. */
export interface ImageInputShape {
  /** The input images in order (none for a generation). */
  images: readonly ImageInputSize[];
  mask?: ImageInputSize;
}

/** Which input an upstream cannot take (an index into `ImageInputShape.images`, or the mask), and why. */
export interface ImageInputRefusal {
  input: number | 'mask';
  /** What the upstream takes, e.g. "input images with an aspect ratio from 1:16 to 16:1". */
  reason: string;
}

export interface ImageProvider {
  /**
   * Why the upstream cannot take an edit's inputs on `upstreamModel` (absent: on any model it
   * serves), or undefined. Checked when the request is validated, before the hold, with each
   * serving member's own upstream id: refused (400) only when every member's upstream refuses; and
   * again when the task is routed: a member whose upstream refuses is skipped. The adapter still
   * checks the bytes it sends, as the last guard.
   */
  checkInputs?(shape: ImageInputShape, upstreamModel?: string): ImageInputRefusal | undefined;
  /**
   * How many upstream calls the adapter would like to run at once for `job` (absent: 1, one call at
   * a time). Each takes one of the member's concurrency slots; `job.slots` says how many it got.
   */
  parallelCalls?(job: ImageJob): number;
  /** Produces the job's `n` images, reporting partials and finished images through `events`. */
  generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void>;
  /** Stops an upstream job it reported (`ImageEvents.submitted`) that nobody will collect, where the upstream can. */
  cancel?(account: UpstreamAccount, ref: unknown, signal: AbortSignal): Promise<void>;
}

/**
 * A media input of a task (an image the client sent), stored by the gateway and read only by the
 * step that sends it, as a stream: never held whole in memory by the gateway. An adapter streams
 * it into its request body (as bytes, as base64 inside JSON: `Base64Source`, or as a multipart
 * part), or hands the upstream a short-lived signed URL to fetch it from.
 */
export interface MediaInput {
  /** `image/png`, `image/jpeg` or `image/webp` (a stored GIF is handed over as a PNG of its first frame: `FileService.mediaInputs`; `open()` and `url()` both serve that stored PNG copy). */
  readonly contentType: string;
  /** Exact size in bytes. */
  readonly bytes: number;
  readonly width: number | null;
  readonly height: number | null;
  /** A new stream of the stored bytes (each call starts from the beginning). */
  open(): Readable;
  /**
   * A URL of the stored bytes that stays valid at least `minTtlSeconds`, for upstreams that fetch
   * inputs (presigned by the store where it serves files itself).
   */
  url(minTtlSeconds?: number): Promise<string>;
}

export interface VideoJob {
  /** Stable across every attempt of the task: adapters send it as the upstream's idempotency key where it takes one. */
  taskId: string;
  /** The upstream's model id. */
  model: string;
  prompt: string;
  negativePrompt: string | null;
  durationSeconds: number;
  aspectRatio: string;
  resolution: string;
  generateAudio: boolean;
  firstFrame?: MediaInput;
  lastFrame?: MediaInput;
  referenceImages: MediaInput[];
  /** https URLs, for providers that accept reference media. */
  referenceVideos: string[];
  referenceAudios: string[];
  /** The catalog model's mapping for this member's provider (aggregators: fal, Replicate). */
  mapping?: UpstreamMapping;
  /**
   * When the gateway gives the task up (fails and refunds it). Adapters whose upstream takes a
   * lifetime for the job send what is left of it, so that a job whose cancel at the deadline got
   * no answer does not run later, billed, for a client already refunded.
   */
  deadline?: Date;
  /**
   * An earlier submit of this task may have reached this member without its answer reaching the
   * gateway: an adapter that can find the job that submit made (`findsEarlierSubmit`) looks for
   * it before it creates another.
   */
  resubmit?: boolean;
}

/** What decides whether an upstream's wire format can express a video request at all. */
export interface VideoShape {
  durationSeconds: number;
  aspectRatio: string;
  resolution: string;
  hasFirstFrame: boolean;
  hasLastFrame: boolean;
  referenceImages: number;
  referenceVideos: number;
  referenceAudios: number;
  hasNegativePrompt: boolean;
  /** Lengths of the prompt and the negative prompt (0: none), in UTF-16 units as JavaScript counts them. */
  promptLength: number;
  negativePromptLength: number;
  generateAudio: boolean;
}

/** The fields a shape is read from: a job, or a creation request before any input is stored. */
export type VideoShapeSource = Pick<VideoJob, 'prompt' | 'durationSeconds' | 'aspectRatio' | 'resolution' | 'generateAudio'> & {
  firstFrame?: unknown;
  lastFrame?: unknown;
  referenceImages: readonly unknown[];
  referenceVideos: readonly unknown[];
  referenceAudios: readonly unknown[];
  negativePrompt?: string | null;
};

export function shapeOf(job: VideoShapeSource): VideoShape {
  return {
    durationSeconds: job.durationSeconds,
    aspectRatio: job.aspectRatio,
    resolution: job.resolution,
    hasFirstFrame: job.firstFrame !== undefined,
    hasLastFrame: job.lastFrame !== undefined,
    referenceImages: job.referenceImages.length,
    referenceVideos: job.referenceVideos.length,
    referenceAudios: job.referenceAudios.length,
    hasNegativePrompt: !!job.negativePrompt,
    promptLength: job.prompt.length,
    negativePromptLength: job.negativePrompt?.length ?? 0,
    generateAudio: job.generateAudio,
  };
}

/** A finished video, as a stream of its bytes (never a local path). */
export interface VideoContent {
  stream: Readable;
  contentType: string;
  /** When the upstream said. */
  bytes?: number;
}

/** Where a succeeded job's output is, in the adapter's own terms (e.g. `{ uri }`); opaque to the rest. */
export type VideoOutputRef = Readonly<Record<string, string>>;

export type VideoStatus =
  /** Still running: poll again after `retryAfterMs` when the upstream said, else the adapter's interval. */
  | { state: 'running'; progress?: number; retryAfterMs?: number }
  | { state: 'succeeded'; output: VideoOutputRef }
  /** Failed upstream; `error` says why (kind `policy`, `failed`, …). */
  | { state: 'failed'; error: ProviderError };

/**
 * A video upstream as a sequence of short calls (design §6): submit once, poll, download. Each call
 * receives the upstream account; none sleeps, holds leases or knows about ledgers and storage.
 */
export interface VideoProvider {
  /** Default delay between polls of a running job. */
  readonly pollIntervalMs: number;
  /**
   * Why the upstream cannot run a request of this shape on `upstreamModel` (absent: on any model it
   * serves), e.g. "durations of 4, 8, 12 seconds only", or undefined. Checked when a task is created,
   * so nothing is charged for it, with each serving member's own upstream id (its model map's, else
   * the catalog id): refused only when every member's upstream refuses; and again when the task is
   * routed, the same way: a member whose upstream refuses is skipped.
   */
  check?(shape: VideoShape, upstreamModel?: string): string | undefined;
  /**
   * True when sending a job again cannot start a second one: the upstream knows the job by the
   * task's id and the adapter answers the job an earlier submit started (Kling's
   * `external_task_id`). Otherwise a submit whose answer never came may be running there, billed,
   * and the runner sends a task at most twice without an answer (`MAX_UNANSWERED_SUBMITS`).
   */
  readonly findsEarlierSubmit?: boolean;
  /** Sends the job; returns the upstream's job id (saved before any poll). */
  submit(account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string>;
  /** One status call. */
  poll(account: UpstreamAccount, jobId: string, job: VideoJob, signal: AbortSignal): Promise<VideoStatus>;
  /** The output of a succeeded job (as its poll described it), streamed. */
  download(account: UpstreamAccount, jobId: string, output: VideoOutputRef, job: VideoJob, signal: AbortSignal): Promise<VideoContent>;
  /**
   * Cancels a job the gateway gave up on (its task failed by its deadline), where the upstream can:
   * it stops spending the account's quota on a result nobody will collect. Best effort.
   */
  cancel?(account: UpstreamAccount, jobId: string, signal: AbortSignal): Promise<void>;
}
