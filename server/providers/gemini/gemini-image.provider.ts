/**
 * Gemini image models ("Nano Banana": gemini-2.5-flash-image, gemini-3-pro-image-preview,
 * gemini-3.1-flash-image-preview) on the Gemini API, after upstream-apis.md §3:
 *
 *   POST {base}/models/{model}:streamGenerateContent?alt=sse   header x-goog-api-key
 *   {"contents":[{"role":"user","parts":[{"text"},{"inlineData":{"mimeType","data"}}…]}],
 *    "generationConfig":{"responseModalities":["TEXT","IMAGE"],"imageConfig":{"aspectRatio","imageSize"}}}
 *
 * - One call renders one image: `n > 1` asks for n parallel calls, runs at most the member slots
 *   the pool took for the job (`job.slots`) at a time, and hands the images over in order. A call
 *   that fails leaves the others running: the images that come back are handed over, then the
 *   failure is thrown (see `generate`).
 * - `aspectRatio` is the request's when Gemini knows it, else the nearest one Gemini knows;
 *   `imageSize` is the tier (`2K`, `4K`, `512` on 3.1 Flash), left out for 1K (the default) and
 *   always for gemini-2.5-flash-image (no imageSize at all). The catalog gives these models
 *   Google's official pixel table, so the upstream's image normally has exactly the promised size.
 * - Edits send the input images as inline parts (a GIF as a PNG of its first frame: Gemini takes
 *   PNG, JPEG and WebP, not GIF). Gemini has no mask parameter: a mask goes as one more inline
 *   image with an instruction to change only its transparent area.
 * - The answer's `thought: true` parts (3 Pro's interim images) are skipped; the image is the last
 *   non-thought inline image. `promptFeedback.blockReason` and a blocking `finishReason` (at HTTP
 *   200) are content-policy errors; an answer with no image is an upstream failure. Neither is
 *   charged (the runner settles), and both are `maybeAccepted`: Google took, and billed, the call.
 * - Output is PNG; another format or compression is done here (sharp), as is any size difference.
 * - Gemini has no partial images: a streaming client gets the completed images only.
 */
import { Semaphore } from '../../lib/semaphore.ts';
import { MIME, fitImage, readMediaJson, sseMediaFrames, throwAccepted, uploadableImage, type MediaAnswerLimits } from '../image-output.ts';
import { ProviderError } from '../provider-error.ts';
import type { ImageEvents, ImageJob, ImageProvider, UpstreamAccount } from '../types.ts';
import { upstreamFetch, upstreamUrl, type UpstreamResponse } from '../upstream-http.ts';
import { googleError, googleErrorOf } from './gemini-errors.ts';

export const GEMINI_IMAGE_TIMEOUT_MS = 300_000;
const MAX_RESPONSE_BYTES = 256 * 1024 * 1024;
/** The images of an answer (§3.3: `inlineData`, or `inline_data` as some relays write it), also in a list of answers. */
const PART_DATA = ['candidates[].content.parts[].inlineData.data', 'candidates[].content.parts[].inline_data.data'];
const ANSWER_IMAGES = { base64Paths: new Set([...PART_DATA, ...PART_DATA.map((p) => `[].${p}`)]) };
const LIMITS: MediaAnswerLimits = { maxBytes: MAX_RESPONSE_BYTES, maxMediaBytes: MAX_RESPONSE_BYTES, maxOtherBytes: 4 * 1024 * 1024 };

/** The aspect ratios `imageConfig.aspectRatio` takes (§3.2; 3.1 Flash adds the extreme ones). */
const RATIOS = ['1:1', '2:3', '3:2', '3:4', '4:3', '4:5', '5:4', '9:16', '16:9', '21:9'];
const EXTRA_RATIOS_31 = ['1:4', '4:1', '1:8', '8:1'];

/** finishReason values that mean the output was blocked (§3.3). */
const BLOCKED = new Set(['SAFETY', 'PROHIBITED_CONTENT', 'IMAGE_SAFETY', 'IMAGE_PROHIBITED_CONTENT', 'IMAGE_RECITATION', 'RECITATION', 'BLOCKLIST', 'SPII']);

const MASK_INSTRUCTION =
  'The last image is a mask for the first image: change only the area where the mask is transparent and keep everything else exactly as it is.';

export function geminiAspectRatio(model: string, aspectRatio: string, width: number, height: number): string {
  const known = model.startsWith('gemini-3.1') ? [...RATIOS, ...EXTRA_RATIOS_31] : RATIOS;
  if (known.includes(aspectRatio)) return aspectRatio;
  const target = Math.log(width / height);
  let best = '1:1';
  for (const r of known) {
    const [w, h] = r.split(':').map(Number) as [number, number];
    if (Math.abs(Math.log(w / h) - target) < Math.abs(Math.log(Number(best.split(':')[0]) / Number(best.split(':')[1])) - target)) best = r;
  }
  return best;
}

interface Part {
  text?: unknown;
  thought?: unknown;
  inlineData?: { mimeType?: unknown; data?: unknown };
  inline_data?: { mime_type?: unknown; data?: unknown };
}
interface GenerateContentResponse {
  error?: Parameters<typeof googleErrorOf>[0];
  promptFeedback?: { blockReason?: unknown; blockReasonMessage?: unknown };
  candidates?: { content?: { parts?: Part[] }; finishReason?: unknown; finishMessage?: unknown }[];
}

export class GeminiImageProvider implements ImageProvider {
  constructor(private readonly timeoutMs = GEMINI_IMAGE_TIMEOUT_MS) {}

  /** One call per image, all at once when the member has the slots. */
  parallelCalls(job: ImageJob): number {
    return job.n;
  }

  /**
   * As many calls at once as the member slots the job holds. A call that fails does not stop the
   * others: each one running may already have made, and billed, its image, so every image that
   * comes back is handed over (numbered in order, without gaps), and then a failure is thrown,
   * `maybeAccepted` once an image was handed over or any call may have been taken upstream (the
   * runner charges the images delivered and runs nothing again elsewhere). The failure thrown is
   * the first of a call the upstream may have taken, if any, else the first: with nothing
   * delivered the request ends as that call alone would have (a 200 without an image: 502,
   * released), not as another call's 429 or 503 would have, since it cannot move elsewhere. Calls
   * not started yet are not made after a failure: with nothing made, the work may still move to
   * another member whole. A client that went away, or a sink that fails, stops them all.
   */
  async generate(account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const body = JSON.stringify(await requestBody(job));
    const slots = new Semaphore(Math.max(1, Math.min(job.n, job.slots ?? 1)));
    const stop = new AbortController();
    const callSignal = AbortSignal.any([signal, stop.signal]);
    let failed = false;
    /** Each call's image, or undefined when it was not made (another call had failed before it could start). */
    const calls = Array.from({ length: job.n }, async (): Promise<Buffer | undefined> => {
      const release = await slots.acquire(callSignal);
      try {
        if (failed) return undefined;
        const image = await this.once(account, job, body, callSignal);
        return await fitImage(image, job.params);
      } catch (err) {
        failed = true;
        throw err;
      } finally {
        release();
      }
    });
    for (const call of calls) call.catch(() => undefined); // each is awaited below, in order
    let first: unknown;
    /** The first failure of a call the upstream may have taken (and billed). */
    let taken: ProviderError | undefined;
    let delivered = 0;
    try {
      for (const call of calls) {
        let image: Buffer | undefined;
        try {
          image = await call;
        } catch (err) {
          first ??= err;
          if (err instanceof ProviderError && err.maybeAccepted) taken ??= err;
          continue;
        }
        if (image) await events.image(delivered++, { image });
      }
    } finally {
      stop.abort();
    }
    const failure = taken ?? first;
    if (failure === undefined) return;
    if (failure instanceof ProviderError && delivered > 0) throwAccepted(failure);
    throw failure;
  }

  /**
   * One streamGenerateContent call (`alt=sse`, §3.1): the final image of the answer. The stream is
   * where Google reports a failure after its 200 (a frame with `error`), and it keeps bytes flowing
   * while a thinking model works. See {@link readAnswer}.
   */
  private async once(account: UpstreamAccount, job: ImageJob, body: string, signal: AbortSignal): Promise<Buffer> {
    const what = 'image generation';
    const res = await upstreamFetch(
      upstreamUrl(account, `/models/${encodeURIComponent(job.model)}:streamGenerateContent?alt=sse`),
      { method: 'POST', headers: { 'content-type': 'application/json', 'x-goog-api-key': account.credentials.api_key ?? '' }, body, timeoutMs: this.timeoutMs },
      signal,
      what,
    );
    if (!res.ok) throw await googleError(res, what);
    const { answer, media } = await readAnswer(res, signal, what);
    try {
      return imageOf(answer, media);
    } catch (err) {
      // A whole answer at 200 without an image (blocked, NO_IMAGE, text only): Google took the
      // call and bills its tokens, so it is not made again on another member.
      throwAccepted(err);
    }
  }
}

async function requestBody(job: ImageJob): Promise<unknown> {
  const p = job.params;
  const parts: unknown[] = [{ text: job.mask ? `${job.prompt}\n\n${MASK_INSTRUCTION}` : job.prompt }];
  // Gemini takes PNG, JPEG, WebP (and HEIC/HEIF) inline: a GIF input goes as a PNG of its first frame.
  const named = [...job.inputs.map((data, i) => ({ data, name: `image-${i + 1}` })), ...(job.mask ? [{ data: job.mask, name: 'mask' }] : [])];
  for (const { data, format } of await Promise.all(named.map((input) => uploadableImage(input.data, input.name)))) {
    parts.push({ inlineData: { mimeType: MIME[format], data: data.toString('base64') } });
  }
  const imageConfig: Record<string, string> = { aspectRatio: geminiAspectRatio(job.model, p.aspectRatio, p.width, p.height) };
  const imageSize = geminiImageSize(job.model, p.resolution);
  if (imageSize) imageConfig.imageSize = imageSize;
  return { contents: [{ role: 'user', parts }], generationConfig: { responseModalities: ['TEXT', 'IMAGE'], imageConfig } };
}

/**
 * `imageConfig.imageSize` for a tier (§3.2): `2K` / `4K` in uppercase, `512` on 3.1 Flash; nothing
 * for 1K (the default), and nothing ever for gemini-2.5-flash-image, which takes no imageSize (it
 * renders 1K; a tier it lacks is resized here, like a ratio it lacks).
 */
export function geminiImageSize(model: string, resolution: string): string | undefined {
  if (model.startsWith('gemini-2.5-flash-image')) return undefined;
  const tier = resolution.toUpperCase();
  if (tier === '2K' || tier === '4K') return tier;
  if (tier === '512' && model.startsWith('gemini-3.1')) return '512';
  return undefined;
}

/** A JSON answer or frame: one GenerateContentResponse, or (a stream read without SSE) a list of them. */
function parseAnswer(text: string): GenerateContentResponse[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new ProviderError('retryable', 'the upstream answered something that is not JSON', { cause: err, maybeAccepted: true });
  }
  const list = Array.isArray(parsed) ? parsed : [parsed];
  return list.filter((x): x is GenerateContentResponse => typeof x === 'object' && x !== null);
}

/**
 * The whole answer of a call as one GenerateContentResponse, its images decoded while they arrive
 * (`media`, by the token that stands for each in the answer: sseMediaFrames, readMediaJson). An
 * SSE stream (§3.1: bare `data:` frames, no `event:` names, no `[DONE]`, blank lines in LF or CRLF
 * form) is merged: parts joined in order, the last `finishReason`, any `promptFeedback`. A frame
 * holding `error` is the upstream's failure (the SDK raises it as an API error) and is classified at
 * once; a stream that ends with no outcome at all broke off (retryable and, like a body that cannot
 * be read or parsed after the 200, `maybeAccepted`: Google may have made the image). An upstream
 * that answers plain JSON instead (a relay that ignores `alt=sse`) is read as it is. Bounded like
 * any answer.
 */
async function readAnswer(res: UpstreamResponse, signal: AbortSignal, what: string): Promise<{ answer: GenerateContentResponse; media: Map<string, Buffer> }> {
  if (!/text\/event-stream/i.test(res.headers.get('content-type') ?? '')) {
    const { text, media } = await readMediaJson(res, ANSWER_IMAGES, LIMITS, signal, what);
    return { answer: mergeAnswers(parseAnswer(text), what, false), media };
  }
  const answers: GenerateContentResponse[] = [];
  const media = new Map<string, Buffer>();
  for await (const frame of sseMediaFrames(res, ANSWER_IMAGES, LIMITS, signal, what)) {
    // Google sends no `[DONE]`; a relay might.
    if (frame.text.trim() === '[DONE]') continue;
    for (const [token, bytes] of frame.media) media.set(token, bytes);
    for (const answer of parseAnswer(frame.text)) {
      if (answer.error) throw googleErrorOf(answer.error, what);
      answers.push(answer);
    }
  }
  return { answer: mergeAnswers(answers, what, true), media };
}

function mergeAnswers(frames: GenerateContentResponse[], what: string, stream: boolean): GenerateContentResponse {
  const failed = frames.find((f) => f.error);
  if (failed) throw googleErrorOf(failed.error, what);
  const promptFeedback = frames.findLast((f) => f.promptFeedback)?.promptFeedback;
  const candidates = frames.map((f) => f.candidates?.[0]).filter((c) => c !== undefined);
  const finishReason = candidates.findLast((c) => c.finishReason !== undefined)?.finishReason;
  const parts = candidates.flatMap((c) => c.content?.parts ?? []);
  if (stream && !promptFeedback && finishReason === undefined && parts.length === 0) {
    throw new ProviderError('retryable', `the upstream ${what} stream ended before the answer was complete`, { maybeAccepted: true });
  }
  return {
    ...(promptFeedback && { promptFeedback }),
    ...(candidates.length > 0 && { candidates: [{ content: { parts }, ...(finishReason !== undefined && { finishReason }) }] }),
  };
}

/** The answer's final image (its bytes in `media` under the token the answer holds), or the reason there is none (§3.3). */
function imageOf(answer: GenerateContentResponse, media: Map<string, Buffer>): Buffer {
  if (answer.error) throw googleErrorOf(answer.error, 'image generation');
  const blockReason = answer.promptFeedback?.blockReason;
  if (typeof blockReason === 'string' && blockReason !== 'BLOCK_REASON_UNSPECIFIED') {
    throw new ProviderError('policy', `the prompt was blocked (${blockReason})`, { upstreamCode: blockReason });
  }
  const candidate = answer.candidates?.[0];
  const finish = typeof candidate?.finishReason === 'string' ? candidate.finishReason : undefined;
  const images = (candidate?.content?.parts ?? [])
    .filter((part) => part.thought !== true)
    .map((part) => {
      const data = part.inlineData?.data ?? part.inline_data?.data;
      const mime = part.inlineData?.mimeType ?? part.inline_data?.mime_type;
      return typeof data === 'string' && (typeof mime !== 'string' || mime.startsWith('image/')) ? data : undefined;
    })
    .filter((d): d is string => d !== undefined);
  if (finish && BLOCKED.has(finish)) throw new ProviderError('policy', `the image was blocked (${finish})`, { upstreamCode: finish });
  const last = images.at(-1);
  if (!last) throw new ProviderError('failed', `no image returned by the upstream${finish ? ` (finishReason ${finish})` : ''}`, { upstreamCode: finish });
  // An image at a path the scanner does not know stayed base64.
  return media.get(last) ?? Buffer.from(last, 'base64');
}
