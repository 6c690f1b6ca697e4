/**
 * Provider kind `ark`, images: Seedream on ModelArk (upstream-apis.md §5.1).
 *
 *   POST {base}/images/generations   Authorization: Bearer <api_key>, a JSON body streamed with
 *                                     its inputs (jsonStream): model, prompt, `size` WxH (see
 *                                     seedream-sizes.ts), `image` (an edit's inputs as lowercase
 *                                     data URLs: one string, or a list of up to 14),
 *                                     `response_format: b64_json` (the images come in the answer:
 *                                     no URL to fetch before its 24 hours run out),
 *                                     `watermark` (false unless the member's base URL says
 *                                     `?watermark=true`), `output_format: png` on 5.0 lite when the
 *                                     client wants PNG or WebP, and for `n`
 *                                     `sequential_image_generation: auto` with `max_images` (inputs
 *                                     and outputs at most 15). There is no `n`, no `quality`, no mask.
 *
 * - `auto` lets the model decide how many images it makes, up to `max_images`: a short answer is
 *   not an error while it holds an image, and the rest is asked for again until `n` are delivered.
 * - Each image is handed over as it is read (events.image), resized and re-encoded to what the
 *   client was promised (fitImage): the runner charges exactly the delivered images. `data[]` may
 *   hold per-image errors beside the images (a moderation refusal skips to the next image, an
 *   internal error stops the batch): the images are delivered, then the first error is thrown, so
 *   the task settles with what was delivered (a streaming client gets its error event), and with no
 *   image the error decides alone (a refusal is the client's 400, an internal error fails over).
 * - A request that asks for partial images (`partial_images` ≥ 1, streaming clients only) is
 *   streamed from Seedream (`stream: true`): Seedream has no previews, but its stream hands over
 *   each image as soon as it is done (`image_generation.partial_succeeded` / `partial_failed` /
 *   `completed`, then `[DONE]`), so the client's events follow the upstream's. Otherwise one JSON
 *   answer. An upstream that answers JSON to a stream request is read as JSON.
 * - Each input goes within Seedream's limits (10 MB, 36 MP): a phone's 48 MP photo is scaled down and
 *   re-encoded rather than refused by the upstream after the hold (seedreamInput); inputs stored
 *   turned (EXIF orientation) go upright, as the gateway measured them. An input no scaling fits (a
 *   side of 14 px or less, a ratio beyond 16:1) is refused before the hold (checkInputs: the
 *   client's 400 invalid_image, or the task goes to a member whose upstream takes it).
 * - A mask, which Seedream has no parameter for, goes as one more input image with an instruction
 *   to change only its transparent area (as for Gemini); the catalog counts it as an input.
 */
import { Readable } from 'node:stream';
import sharp, { type Metadata } from 'sharp';
import { MIME, fitImage, readMediaJson, sseMediaFrames, uploadableImage, type MediaAnswerLimits, type MediaJson } from '../image-output.ts';
import { Base64Source, ProviderError, jsonStream, upstreamFetch, type ImageEvents, type ImageJob, type ImageProvider, type UpstreamAccount, type UpstreamResponse } from '../kit.ts';
import type { ImageInputRefusal, ImageInputShape, ImageInputSize } from '../types.ts';
import { arkError, arkErrorOf, type ArkErrorBody } from './ark-errors.ts';
import { arkAuth, arkEndpoint, arkUrl } from './ark-endpoint.ts';
import { seedreamSize, seedreamVersion } from './seedream-sizes.ts';

/** How long one call may take, its answer included: Ark's SDK waits 600 s, a batch takes minutes. */
export const ARK_IMAGE_TIMEOUT_MS = 600_000;
/** Input images plus images asked for, per call (§5.1). */
const MAX_PER_CALL = 15;
/** Each input image (§5.1): bytes, pixels, sides over `minSide`, ratio; `quality` of one re-encoded to fit. */
const SEEDREAM_INPUT = { maxBytes: 10_000_000, maxPixels: 36_000_000, minSide: 14, maxRatio: 16, quality: 85 };
const LIMITS: MediaAnswerLimits = { maxBytes: 512 * 1024 * 1024, maxMediaBytes: 512 * 1024 * 1024, maxOtherBytes: 1024 * 1024 };
const FRAME_LIMITS: MediaAnswerLimits = { maxBytes: 512 * 1024 * 1024, maxMediaBytes: 96 * 1024 * 1024, maxOtherBytes: 1024 * 1024 };
const ANSWER_IMAGES = { base64Paths: new Set(['data[].b64_json']) };
const FRAME_IMAGE = { base64Paths: new Set(['b64_json']) };

const MASK_INSTRUCTION =
  'The last image is a mask for the first image: change only the area where the mask is transparent and keep everything else exactly as it is.';

/** One image of an answer, or the error that came instead. */
type Item = { bytes: Buffer } | { error: ArkErrorBody };

/** What one call delivered, and the first per-image error (or broken stream) it met. */
interface CallOutcome {
  delivered: number;
  error?: ProviderError;
}

export class ArkImageProvider implements ImageProvider {
  constructor(private readonly timeoutMs = ARK_IMAGE_TIMEOUT_MS) {}

  /** An input no scaling fits into Seedream's limits (its sides, its ratio; every version alike), found before the hold. */
  checkInputs(shape: ImageInputShape): ImageInputRefusal | undefined {
    for (const [input, size] of shape.images.entries()) {
      const reason = seedreamRefusal(size);
      if (reason) return { input, reason };
    }
    // The mask goes as one more input image.
    const reason = shape.mask && seedreamRefusal(shape.mask);
    return reason ? { input: 'mask', reason } : undefined;
  }

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const what = job.operation === 'edit' ? 'image edit' : 'image generation';
    const version = seedreamVersion(job.model);
    const p = job.params;
    const inputs = await inputImages(job);
    if (inputs.length >= MAX_PER_CALL) throw new ProviderError('invalid_request', `Seedream takes at most ${MAX_PER_CALL - 1} input images`);
    const stream = p.partialImages > 0;
    const fields: Record<string, unknown> = {
      model: job.model,
      prompt: job.mask ? `${job.prompt}\n\n${MASK_INSTRUCTION}` : job.prompt,
      size: seedreamSize(version, p.width, p.height, p.aspectRatio),
      response_format: 'b64_json',
      watermark: arkEndpoint(account).watermark,
      ...(inputs.length > 0 && { image: inputs.length === 1 ? inputs[0] : inputs }),
      ...(version.png && (p.outputFormat === 'png' || p.outputFormat === 'webp') && { output_format: 'png' }),
      ...(stream && { stream: true }),
    };
    const delivered = { count: 0 };
    while (delivered.count < job.n) {
      signal.throwIfAborted();
      const wanted = Math.min(job.n - delivered.count, MAX_PER_CALL - inputs.length);
      const sequential = wanted > 1 ? { sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: wanted } } : { sequential_image_generation: 'disabled' };
      const { body, length } = jsonStream({ ...fields, ...sequential });
      const res = await upstreamFetch(
        arkUrl(account, '/images/generations'),
        { method: 'POST', headers: { ...arkAuth(account), 'content-type': 'application/json', 'content-length': String(length) }, body, redirect: 'manual', timeoutMs: this.timeoutMs },
        signal,
        what,
      );
      if (!res.ok) throw await arkError(res, what);
      const deliver = (image: Buffer) => this.deliver(image, job, delivered, events);
      const outcome = /text\/event-stream/i.test(res.headers.get('content-type') ?? '') ? await readStream(res, deliver, signal, what) : await readAnswer(res, deliver, signal, what);
      // Delivered images are the client's (and charged); the first per-image error ends the task there.
      if (outcome.error) throw outcome.error;
      if (outcome.delivered === 0) throw new ProviderError('retryable', `the upstream ${what} answered no image`, { maybeAccepted: true });
    }
  }

  /** Hands one image of an answer to the client, as promised (an image past `n` is dropped). */
  private async deliver(image: Buffer, job: ImageJob, delivered: { count: number }, events: ImageEvents): Promise<void> {
    if (delivered.count >= job.n) return;
    const index = delivered.count++;
    await events.image(index, { image: await fitImage(image, job.params) });
  }
}

/**
 * The edit's inputs (and the mask, as the last one) as data URLs streamed into the body, each
 * within Seedream's limits (seedreamInput).
 */
async function inputImages(job: ImageJob): Promise<Base64Source[]> {
  const all = [...job.inputs, ...(job.mask ? [job.mask] : [])];
  return Promise.all(
    all.map(async (data, i) => {
      const mask = job.mask !== undefined && i === all.length - 1;
      const input = await seedreamInput(data, mask ? 'the mask' : `input image ${i + 1}`, mask);
      return new Base64Source(() => Readable.from([input.data]), input.data.length, `data:${input.type};base64,`);
    }),
  );
}

/**
 * One input as Seedream takes it (§5.1: at most 10 MB and 36 MP, sides over 14 px, a ratio within
 * [1/16, 16]). One within the limits goes as uploadableImage makes it (upright, in its own format);
 * one over them is turned upright, scaled down into 36 MP and encoded as JPEG (PNG for the mask and
 * for an image with alpha, whose transparency matters), smaller again until it is within 10 MB. A
 * side or ratio no scaling fixes was refused before the hold (checkInputs); should one get here, it
 * is refused (`invalid_request`) before any call.
 */
async function seedreamInput(data: Buffer, name: string, mask: boolean): Promise<{ data: Buffer; type: string }> {
  let meta: Metadata;
  try {
    meta = await sharp(data).metadata();
  } catch (err) {
    throw new ProviderError('invalid_request', `${name} is not an image the upstream can take`, { cause: err });
  }
  const width = meta.autoOrient?.width ?? meta.width;
  const height = meta.autoOrient?.height ?? meta.height;
  // The last guard: the request was checked before the hold (checkInputs), from the same measure.
  const refusal = seedreamRefusal({ width, height });
  if (refusal) throw new ProviderError('invalid_request', `Seedream takes ${refusal}; ${name} is ${width}x${height}`);
  if (width * height <= SEEDREAM_INPUT.maxPixels && data.length <= SEEDREAM_INPUT.maxBytes) {
    const upload = await uploadableImage(data, name);
    if (upload.data.length <= SEEDREAM_INPUT.maxBytes) return { data: upload.data, type: MIME[upload.format] };
  }
  const png = mask || (meta.hasAlpha ?? false);
  const scale = Math.min(1, Math.sqrt(SEEDREAM_INPUT.maxPixels / (width * height)));
  let size = { width: Math.floor(width * scale), height: Math.floor(height * scale) };
  for (let attempt = 1; ; attempt++) {
    let out: Buffer;
    try {
      const img = sharp(data, { limitInputPixels: false }).autoOrient().resize(size.width, size.height, { fit: 'fill' });
      out = await (png ? img.png() : img.jpeg({ quality: SEEDREAM_INPUT.quality })).toBuffer();
    } catch (err) {
      throw new ProviderError('invalid_request', `${name} is not an image the upstream can take`, { cause: err });
    }
    if (out.length <= SEEDREAM_INPUT.maxBytes) return { data: out, type: png ? 'image/png' : 'image/jpeg' };
    // Bytes go with pixels: scale by the ratio of the limit to the size, with a margin.
    const shrink = Math.sqrt(SEEDREAM_INPUT.maxBytes / out.length) * 0.9;
    size = { width: Math.floor(size.width * shrink), height: Math.floor(size.height * shrink) };
    if (attempt === 4 || Math.min(size.width, size.height) <= SEEDREAM_INPUT.minSide) {
      throw new ProviderError('invalid_request', `${name} cannot be made to fit Seedream's ${SEEDREAM_INPUT.maxBytes / 1_000_000} MB per input image`);
    }
  }
}

/** What Seedream takes that `size` is not, when no scaling fits it (a side too short, a ratio too far from square). */
function seedreamRefusal({ width, height }: ImageInputSize): string | undefined {
  if (Math.min(width, height) <= SEEDREAM_INPUT.minSide) return `input images over ${SEEDREAM_INPUT.minSide} pixels on each side`;
  if (Math.max(width, height) / Math.min(width, height) > SEEDREAM_INPUT.maxRatio) {
    return `input images with an aspect ratio from 1:${SEEDREAM_INPUT.maxRatio} to ${SEEDREAM_INPUT.maxRatio}:1`;
  }
  return undefined;
}

interface ImagesAnswer {
  data?: unknown;
  error?: ArkErrorBody;
}

/** A JSON answer (§5.1): `data[]` of images and per-image errors, its images decoded as they arrive. */
async function readAnswer(res: UpstreamResponse, deliver: (image: Buffer) => Promise<void>, signal: AbortSignal, what: string): Promise<CallOutcome> {
  const answer = await readMediaJson(res, ANSWER_IMAGES, LIMITS, signal, what);
  const body = parse<ImagesAnswer>(answer.text, what);
  if (!Array.isArray(body.data)) {
    if (body.error) throw arkErrorOf(body.error, what);
    throw new ProviderError('retryable', `the upstream ${what} answered without a data list`, { maybeAccepted: true });
  }
  const outcome: CallOutcome = { delivered: 0 };
  for (const raw of body.data as unknown[]) await take(itemOf(raw, answer, what), outcome, deliver, what);
  return outcome;
}

interface StreamEvent {
  type?: unknown;
  error?: ArkErrorBody;
}

/**
 * A streamed answer (§5.1): each `partial_succeeded` image is delivered as its frame arrives, each
 * `partial_failed` remembered, `completed` ends the images and `[DONE]` the stream. An `error`
 * event (a frame whose data is `{"error": …}`, as Ark's SDK reads them) is the call's failure; a
 * stream that ends before `completed` broke off.
 */
async function readStream(res: UpstreamResponse, deliver: (image: Buffer) => Promise<void>, signal: AbortSignal, what: string): Promise<CallOutcome> {
  const outcome: CallOutcome = { delivered: 0 };
  let completed = false;
  for await (const frame of sseMediaFrames(res, FRAME_IMAGE, FRAME_LIMITS, signal, what)) {
    if (frame.text.trim() === '[DONE]') break;
    const event = parse<StreamEvent>(frame.text, what);
    const type = typeof event.type === 'string' ? event.type : (frame.event ?? '');
    if (type.endsWith('.partial_succeeded') || type.endsWith('.partial_failed')) {
      await take(itemOf(event, frame, what), outcome, deliver, what);
    } else if (type.endsWith('.completed')) {
      completed = true;
    } else if (frame.event === 'error' || type === 'error' || event.error) {
      throw arkErrorOf(event.error ?? (event as ArkErrorBody), what);
    }
  }
  // Cut before `completed`: images after an earlier per-image failure may have been made (billed).
  if (!completed) outcome.error = (outcome.error ?? new ProviderError('retryable', `the upstream ${what} stream ended before it was complete`)).with({ maybeAccepted: true });
  return outcome;
}

/** Delivers an image of the answer, or keeps the first per-image error. */
async function take(item: Item, outcome: CallOutcome, deliver: (image: Buffer) => Promise<void>, what: string): Promise<void> {
  if ('error' in item) {
    outcome.error ??= arkErrorOf(item.error, what);
    return;
  }
  await deliver(item.bytes);
  outcome.delivered++;
}

/** One `data[]` item or stream event as an image or an error (b64_json was asked for: never a URL). */
function itemOf(raw: unknown, answer: MediaJson, what: string): Item {
  const item = (typeof raw === 'object' && raw !== null ? raw : {}) as { b64_json?: unknown; error?: ArkErrorBody };
  if (item.error) return { error: item.error };
  const bytes = typeof item.b64_json === 'string' ? answer.media.get(item.b64_json) : undefined;
  if (!bytes) throw new ProviderError('retryable', `the upstream ${what} answered an image without data`, { maybeAccepted: true });
  return { bytes };
}

function parse<T>(text: string, what: string): T {
  try {
    const value = JSON.parse(text) as unknown;
    return (typeof value === 'object' && value !== null ? value : {}) as T;
  } catch {
    throw new ProviderError('retryable', `the upstream ${what} answered something other than JSON`, { maybeAccepted: true });
  }
}
