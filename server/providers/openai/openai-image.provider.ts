/**
 * Provider kind `openai`, images: the OpenAI Images wire format (upstream-apis.md §1), as served by
 * OpenAI and by OpenAI-compatible gateways at a member's `base_url`.
 *
 *   generation  POST {base}/images/generations, JSON
 *   edit        POST {base}/images/edits, multipart: one input → part `image`, several → parts
 *               `image[]` (§1.2: dall-e-2 refuses `image[]` for one file), optional `mask` (PNG);
 *               every other value a string
 *
 * Model families, by the upstream model id: `dall-e-2*`, `dall-e-3*`, and everything else treated
 * as a GPT image model (gateways serve them under other names). GPT image models get
 * `output_format`, `output_compression` (jpeg/webp), `background` and low|medium|high|auto
 * `quality`, never `response_format` (they refuse it and always answer `b64_json`); dall-e models
 * get `response_format: b64_json`, dall-e-3 `quality` standard|hd, dall-e-2 no quality. A `url`
 * answer is fetched anyway (gateways send one), without the member's key.
 *
 * `size` is the nearest one the model accepts (`upstreamImageSize`); the answer is then resized
 * (cover, centred) and/or re-encoded when its pixel size or format differs from what the client
 * asked for, and passed through byte for byte when it already matches.
 *
 * Streaming (§1.4): with `partial_images` > 0 on a GPT image model, `stream: true`; the SSE body is
 * parsed as it arrives and each partial is relayed at once, UNMODIFIED: partials are previews, in
 * the upstream's own size and format. Since the interleaving of per-image events with n>1 is not
 * documented, n images stream as n sequential n=1 calls. Without streaming, GPT image models and
 * dall-e-2 take up to 10 images per call, dall-e-3 one. (ImageService.start clears `partial_images`
 * of a request whose answer does not stream: it never reaches an adapter.)
 *
 * Usage (§1.3, §1.4): each image carries the token usage the upstream reported for it, for the
 * client's streamed `*.completed` event. A streamed call makes one image and its `completed` frame
 * reports that image's usage; a JSON answer reports the usage of all its images, shared out
 * between them (`shareUsage`). An answer without usage (dall-e, many gateways) leaves it unset.
 *
 * A failure after the upstream's 2xx (a body that breaks off, times out or is not JSON, an answer
 * without a usable image, an image that cannot be decoded or fetched from its link) is
 * `maybeAccepted`: the upstream made, and billed, the images, so the runner neither moves the
 * request to another member nor runs it again. An error the upstream itself reports (an error
 * envelope at 200, an `error` frame) keeps its own classification.
 */
import { MIME, fitImage, readBounded, readMediaJson, sseMediaFrames, throwAccepted, uploadableImage, type MediaFrame } from '../image-output.ts';
import { ProviderError } from '../provider-error.ts';
import type { GeneratedImage, ImageEvents, ImageFormat, ImageJob, ImageProvider, UpstreamAccount } from '../types.ts';
import { upstreamFetch, upstreamUrl, type UpstreamResponse } from '../upstream-http.ts';
import { openaiError, openaiErrorOf } from './openai-errors.ts';

/** How long one call (its whole answer, stream included) may take: high-quality images take minutes. */
export const OPENAI_IMAGE_TIMEOUT_MS = 300_000;

/** `n` is 1–10 per call (§1.1). */
const MAX_N_PER_CALL = 10;
/** Ten 4K images in base64 stay well under this; past it the answer is refused, not buffered. */
const MAX_RESPONSE_BYTES = 512 * 1024 * 1024;
/** The image of one streamed event, and one image fetched from a `url` answer. */
const MAX_EVENT_BYTES = 96 * 1024 * 1024;
const MAX_URL_IMAGE_BYTES = 64 * 1024 * 1024;

const GPT_SIZES = ['1024x1024', '1536x1024', '1024x1536'];
const DALLE3_SIZES = ['1024x1024', '1792x1024', '1024x1792'];
const DALLE2_SIDES = [256, 512, 1024];

type Family = 'gpt' | 'dall-e-2' | 'dall-e-3';

function familyOf(model: string): Family {
  if (model.startsWith('dall-e-3')) return 'dall-e-3';
  if (model.startsWith('dall-e-2')) return 'dall-e-2';
  return 'gpt';
}

/**
 * The `size` to ask `model` for, to deliver `width`x`height`: the standard size of the nearest
 * aspect ratio (dall-e-2: the smallest square at least as large), or for `gpt-image-2*` the exact
 * size when the upstream accepts it.
 */
export function upstreamImageSize(model: string, width: number, height: number): string {
  const family = familyOf(model);
  if (family === 'dall-e-2') {
    const side = DALLE2_SIDES.find((s) => s >= Math.max(width, height)) ?? DALLE2_SIDES.at(-1)!;
    return `${side}x${side}`;
  }
  if (family === 'dall-e-3') return nearestAspect(DALLE3_SIZES, width, height);
  if (model.startsWith('gpt-image-2') && flexSizeAccepted(width, height)) return `${width}x${height}`;
  return nearestAspect(GPT_SIZES, width, height);
}

/**
 * gpt-image-2 sizes (§1.1): both edges divisible by 16, ratio 1:3..3:1, at most 3840x2160 (either
 * way round). The pixel-count floor of 655,360 is not in §1.1 but reported live (Azure docs, issue
 * threads quoted by the fake); below it the nearest standard size is asked for and downscaled.
 */
function flexSizeAccepted(width: number, height: number): boolean {
  const long = Math.max(width, height);
  const short = Math.min(width, height);
  return width % 16 === 0 && height % 16 === 0 && short > 0 && long / short <= 3 && long <= 3840 && short <= 2160 && width * height >= 655_360;
}

/** The size whose aspect ratio is nearest (on a log scale, so 2:1 and 1:2 are equally far from 1:1); ties go to the first. */
function nearestAspect(sizes: string[], width: number, height: number): string {
  const target = Math.log(width / height);
  let best = sizes[0]!;
  let bestDistance = Infinity;
  for (const size of sizes) {
    const [w, h] = size.split('x').map(Number) as [number, number];
    const distance = Math.abs(Math.log(w / h) - target);
    if (distance < bestDistance - 1e-9) [best, bestDistance] = [size, distance];
  }
  return best;
}

/** One input file of an edit, ready for the multipart body. */
interface Upload {
  blob: Blob;
  filename: string;
}

/** One image of an answer, before post-processing. */
interface RawImage {
  data: Buffer;
  revisedPrompt?: string;
  usage?: ImageUsage;
}

type ImageUsage = NonNullable<GeneratedImage['usage']>;

/** The `openai` image adapter; keeps no per-account state. `timeoutMs` bounds each call, its answer included. */
export class OpenAIImageProvider implements ImageProvider {
  constructor(private readonly timeoutMs = OPENAI_IMAGE_TIMEOUT_MS) {}

  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const family = familyOf(job.model);
    const stream = family === 'gpt' && job.params.partialImages > 0;
    const perCall = stream || family === 'dall-e-3' ? 1 : MAX_N_PER_CALL;
    const what = job.operation === 'edit' ? 'image edit' : 'image generation';
    const uploads = job.operation === 'edit' ? await editUploads(job, family) : undefined;

    let index = 0;
    while (index < job.n) {
      signal.throwIfAborted();
      const n = Math.min(perCall, job.n - index);
      const fields = requestFields(job, family, n, stream);
      const init = uploads
        ? { method: 'POST', headers: auth(account), body: multipart(fields, uploads) }
        : { method: 'POST', headers: { ...auth(account), 'Content-Type': 'application/json' }, body: JSON.stringify(fields) };
      const res = await upstreamFetch(
        upstreamUrl(account, job.operation === 'edit' ? '/images/edits' : '/images/generations'),
        { ...init, timeoutMs: this.timeoutMs },
        signal,
        what,
      );
      if (!res.ok) throw await openaiError(res, what);

      // A gateway that ignores `stream` answers JSON: read it as such.
      if (stream && /text\/event-stream/i.test(res.headers.get('content-type') ?? '')) {
        const { image, usage } = await readStream(res, index, job.params.partialImages, signal, events, what);
        await events.image(index, { image: await fitImage(image, job.params, family === 'gpt'), ...(usage && { usage }) });
        index++;
        continue;
      }

      const images = (await readImages(res, signal, what)).slice(0, n);
      // A short answer is not an error as long as it holds an image: the loop asks for the rest.
      if (images.length === 0) throw new ProviderError('retryable', `the upstream ${what} answered no image`, { maybeAccepted: true });
      for (const raw of images) {
        // GPT image models were sent the request's output_compression (requestFields); others were not.
        const data = await fitImage(raw.data, job.params, family === 'gpt');
        await events.image(index, { image: data, ...(raw.revisedPrompt !== undefined && { revisedPrompt: raw.revisedPrompt }), ...(raw.usage && { usage: raw.usage }) });
        index++;
      }
    }
  }
}

function auth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_key ?? ''}` };
}

/** The request's parameters (§1.1, §1.2), by model family. */
function requestFields(job: ImageJob, family: Family, n: number, stream: boolean): Record<string, string | number | boolean> {
  const p = job.params;
  const fields: Record<string, string | number | boolean> = { model: job.model, prompt: job.prompt, n, size: upstreamImageSize(job.model, p.width, p.height) };
  if (family === 'gpt') {
    // The quality the request is billed at (`auto` resolves to `high` on models priced by quality):
    // an `auto` left to the upstream could come back at a cheaper one than was charged.
    fields.quality = p.resolvedQuality;
    fields.background = p.background;
    fields.output_format = p.outputFormat;
    if (p.outputCompression !== undefined && p.outputFormat !== 'png') fields.output_compression = p.outputCompression;
    // §1.1: generations only (§1.2: not on edits).
    if (p.moderation && job.operation === 'generation') fields.moderation = p.moderation;
    if (stream) {
      fields.stream = true;
      fields.partial_images = p.partialImages;
    }
  } else {
    if (family === 'dall-e-3') fields.quality = p.resolvedQuality === 'high' ? 'hd' : 'standard';
    fields.response_format = 'b64_json';
  }
  return fields;
}

function multipart(fields: Record<string, string | number | boolean>, uploads: { images: Upload[]; mask?: Upload }): FormData {
  const form = new FormData();
  for (const [name, value] of Object.entries(fields)) form.append(name, String(value));
  const field = uploads.images.length === 1 ? 'image' : 'image[]';
  for (const image of uploads.images) form.append(field, image.blob, image.filename);
  if (uploads.mask) form.append('mask', uploads.mask.blob, uploads.mask.filename);
  return form;
}

const EXTENSION: Record<ImageFormat, string> = { png: 'png', jpeg: 'jpg', webp: 'webp' };

/**
 * The edit's files. Inputs the upstream cannot take (a GIF; anything but PNG for dall-e-2, §1.2) and
 * a mask that is not a PNG are converted to PNG; the rest go as they are.
 */
async function editUploads(job: ImageJob, family: Family): Promise<{ images: Upload[]; mask?: Upload }> {
  if (job.inputs.length === 0) throw new ProviderError('invalid_request', 'an image edit needs at least one input image');
  const images = await Promise.all(job.inputs.map((data, i) => upload(data, `image-${i + 1}`, family === 'dall-e-2')));
  const mask = job.mask && (await upload(job.mask, 'mask', true));
  return { images, ...(mask && { mask }) };
}

async function upload(input: Buffer, name: string, pngOnly: boolean): Promise<Upload> {
  const { data, format } = await uploadableImage(input, name, pngOnly);
  return { blob: new Blob([data], { type: MIME[format] }), filename: `${name}.${EXTENSION[format]}` };
}

// ---------------------------------------------------------------------------------------------
// Answers

interface ImagesResponse {
  error?: unknown;
  data?: { b64_json?: unknown; url?: unknown; revised_prompt?: unknown }[];
  usage?: unknown;
}

/**
 * `usage` of an answer or a `completed` frame (§1.3, §1.4), or undefined when there is none. A
 * count that is missing or not a non-negative integer (a gateway's partial usage) reads as zero.
 */
function usageOf(value: unknown): ImageUsage | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const u = value as { input_tokens?: unknown; output_tokens?: unknown; total_tokens?: unknown; input_tokens_details?: unknown };
  const details = (typeof u.input_tokens_details === 'object' && u.input_tokens_details !== null ? u.input_tokens_details : {}) as { text_tokens?: unknown; image_tokens?: unknown };
  const count = (v: unknown) => (Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : 0);
  return {
    inputTokens: count(u.input_tokens),
    outputTokens: count(u.output_tokens),
    totalTokens: count(u.total_tokens),
    textTokens: count(details.text_tokens),
    imageTokens: count(details.image_tokens),
  };
}

/**
 * Image `i`'s share of the usage of an answer with `count` images: each count split as evenly as
 * whole tokens allow, so the shares of the answer's images add up to exactly what it reported (one
 * image's total may then differ by a token from its input plus output).
 */
function shareUsage(usage: ImageUsage, i: number, count: number): ImageUsage {
  const share = (v: number) => Math.floor((v * (i + 1)) / count) - Math.floor((v * i) / count);
  return {
    inputTokens: share(usage.inputTokens),
    outputTokens: share(usage.outputTokens),
    totalTokens: share(usage.totalTokens),
    textTokens: share(usage.textTokens),
    imageTokens: share(usage.imageTokens),
  };
}

/** Where the images of an answer are (§1.3), and of a streamed frame (§1.4). */
const ANSWER_IMAGES = { base64Paths: new Set(['data[].b64_json']) };
const FRAME_IMAGE = { base64Paths: new Set(['b64_json']) };
/** Everything of an answer or frame but its images: usage, sizes, revised prompts, an error. */
const MAX_ANSWER_REST_BYTES = 1024 * 1024;

/**
 * The images of a non-streaming answer (§1.3): `b64_json`, or a `url` (dall-e, gateways) fetched
 * here. Each base64 image is decoded while the answer arrives (readMediaJson): no text of the whole
 * answer, no base64 strings, only the images' bytes.
 */
async function readImages(res: UpstreamResponse, signal: AbortSignal, what: string): Promise<RawImage[]> {
  const { text, media } = await readMediaJson(res, ANSWER_IMAGES, { maxBytes: MAX_RESPONSE_BYTES, maxMediaBytes: MAX_RESPONSE_BYTES, maxOtherBytes: MAX_ANSWER_REST_BYTES }, signal, what);
  let body: ImagesResponse;
  try {
    body = JSON.parse(text) as ImagesResponse;
  } catch {
    throw new ProviderError('retryable', `the upstream ${what} answered something other than JSON`, { maybeAccepted: true });
  }
  // Some gateways answer an error envelope with status 200: its code and type decide.
  if (body?.error !== undefined && body.error !== null) throw openaiErrorOf(body, what);
  if (!Array.isArray(body?.data)) throw new ProviderError('retryable', `the upstream ${what} answered without a data list`, { maybeAccepted: true });
  const usage = usageOf(body.usage);
  const images: RawImage[] = [];
  for (const [i, item] of body.data.entries()) {
    let data: Buffer;
    if (typeof item?.b64_json === 'string' && media.has(item.b64_json)) data = media.get(item.b64_json)!;
    else if (typeof item?.url === 'string' && item.url !== '') data = await fetchImageUrl(item.url, signal).catch(throwAccepted);
    else throw new ProviderError('retryable', `the upstream ${what} answered an image without data`, { maybeAccepted: true });
    images.push({ data, ...(typeof item.revised_prompt === 'string' && { revisedPrompt: item.revised_prompt }), ...(usage && { usage: shareUsage(usage, i, body.data.length) }) });
  }
  return images;
}

/**
 * An image behind a `url` answer. OpenAI's are signed storage URLs; the member's key is not sent
 * (the host is not the API), so its redirects are followed to any host. The URL comes from the
 * operator's upstream, so private addresses are allowed (an on-premises gateway); only http(s) and
 * data: URLs are.
 */
async function fetchImageUrl(url: string, signal: AbortSignal): Promise<Buffer> {
  const dataUrl = /^data:image\/[\w.+-]+;base64,/i.exec(url.slice(0, 64));
  if (dataUrl) return Buffer.from(url.slice(dataUrl[0].length), 'base64');
  if (!/^https?:\/\//i.test(url)) throw new ProviderError('retryable', 'the upstream answered an image URL that cannot be fetched');
  const res = await upstreamFetch(url, { headers: { Accept: 'image/*' }, redirect: 'anywhere' }, signal, 'image download');
  if (!res.ok) {
    res.discard();
    throw new ProviderError('retryable', `the upstream image download failed with HTTP ${res.status}`, { upstreamStatus: res.status });
  }
  return readBounded(res, MAX_URL_IMAGE_BYTES, signal, 'image download');
}

type StreamEvent = { kind: 'partial'; image: Buffer } | { kind: 'completed'; image: Buffer; usage?: ImageUsage } | { kind: 'other' };

/**
 * Reads one streamed image (n=1) as the frames arrive, relays its partials and returns the final
 * image (not yet post-processed) with the usage its completed frame reported. Stops reading at the
 * completed frame.
 */
async function readStream(
  res: UpstreamResponse,
  imageIndex: number,
  asked: number,
  signal: AbortSignal,
  events: ImageEvents,
  what: string,
): Promise<{ image: Buffer; usage?: ImageUsage }> {
  let partials = 0;
  const limits = { maxBytes: MAX_RESPONSE_BYTES, maxMediaBytes: MAX_EVENT_BYTES, maxOtherBytes: MAX_ANSWER_REST_BYTES };
  for await (const frame of sseMediaFrames(res, FRAME_IMAGE, limits, signal, what)) {
    const event = streamEvent(frame, what);
    if (event.kind === 'completed') return event;
    // Numbered here, from 0, and at most the `partial_images` asked for: an OpenAI-compatible
    // upstream may number from 1 or send more, and the client's contract says 0 to partial_images - 1.
    if (event.kind === 'partial' && partials < asked) await events.partial(imageIndex, partials++, event.image);
  }
  throw new ProviderError('retryable', 'the upstream stream ended before the image was complete', { maybeAccepted: true });
}

/** One SSE frame (§1.4): the `event:` line may be missing (the payload's `type` says it), `[DONE]` ends. */
function streamEvent(frame: MediaFrame, what: string): StreamEvent {
  if (frame.text.trim() === '[DONE]') return { kind: 'other' };
  let payload: unknown;
  try {
    payload = JSON.parse(frame.text);
  } catch {
    throw new ProviderError('retryable', `the upstream ${what} streamed an unreadable event`, { maybeAccepted: true });
  }
  const body = (typeof payload === 'object' && payload !== null ? payload : {}) as { type?: unknown; error?: unknown; b64_json?: unknown; usage?: unknown };
  if (frame.event === 'error' || body.type === 'error' || (body.error !== undefined && body.error !== null)) {
    // The SDK's rule (§1.4): an `error` event, or any data carrying `error`; the frame may hold the
    // bare error object, and (no `event:` line) only its payload's `type` may say it is one.
    throw openaiErrorOf(body.error !== undefined ? body : { error: body }, what);
  }
  const type = typeof body.type === 'string' ? body.type : (frame.event ?? '');
  const image = typeof body.b64_json === 'string' ? frame.media.get(body.b64_json) : undefined;
  if (type.endsWith('.partial_image') && image) {
    return { kind: 'partial', image };
  }
  if (type.endsWith('.completed')) {
    if (!image) throw new ProviderError('retryable', `the upstream ${what} completed without the image`, { maybeAccepted: true });
    const usage = usageOf(body.usage);
    return { kind: 'completed', image, ...(usage && { usage }) };
  }
  return { kind: 'other' };
}

// ---------------------------------------------------------------------------------------------
// Post-processing

