/**
 * The answers of a synchronous image request, shaped and written here only: the JSON answer
 * (product spec §2.3) and the event stream (§6.1). Images go out as base64 made slice by slice
 * from their bytes (lib/base64-json.ts), never as one string.
 *
 * JSON: an answer longer than one write (CORKED_BYTES) is written while the task settles
 * (`ExecuteOptions.whileSettling`), all but its last byte, which goes out once `runSync` has
 * returned, i.e. once the settlement has committed: an answer is never complete before its charge
 * is durable, and a crash before the commit leaves a truncated, uncharged answer (Content-Length is
 * not reached). A shorter one (links, or small images) goes out whole, in one write, after the
 * commit: its head written early would cost a second write — a second wake-up of the client, about
 * 0.2 ms of CPU on the bench machine — and gain nothing, since one write of it takes no longer than
 * its last byte would. Links (`url`) come made with the images (ImageRunner, before the charge):
 * nothing here can fail after the commit but the socket.
 *
 * Stream: for each image, `partial_image` events and then `completed`, written and flushed as they
 * happen. An image counts as delivered once its `completed` event was handed to the socket (a write
 * that fails rejects with ClientGone: the client went away); `event: error` reports a failure after
 * the stream began.
 *
 * Both are written under `WriteLimits` (STREAM_WRITE_IDLE_MS): a client that stops reading is cut
 * off and counts as gone, instead of holding its task — the member's slot, the lease, the credits
 * held — for as long as it keeps its socket open.
 */
import type { Response } from 'express';
import type { components } from '../../generated/api.d.ts';
import type { ApiError } from '../errors.ts';
import { Base64Bytes, CORKED_BYTES, joinJsonParts, jsonParts, jsonPartsLength, writeJsonParts, type JsonParts, type WithBase64, type WriteLimits } from '../lib/base64-json.ts';
import type { GeneratedImage, ImageParams } from '../providers/types.ts';
import type { ImageTaskRow } from '../repositories/image-task.repository.ts';
import { ClientGone, type DeliveredImages, type ExecuteResult, type ImageOperation, type ImageSink } from '../services/image/image-runner.ts';

type Schemas = components['schemas'];

/** The JSON answer of a synchronous request: begun while its task settles, ended after the commit. */
export interface JsonImageAnswer {
  /** `ExecuteOptions.whileSettling`: writes all of the answer but its last byte; resolves once handed to the socket, rejects when the client went away. */
  whileSettling(delivered: DeliveredImages): Promise<void>;
  /** After `runSync` returned: the last byte (the whole answer when nothing was begun), then the end (nothing when the client went away). */
  end(result: ExecuteResult): Promise<void>;
}

/** A `url` answer's image without the link the runner makes to each (a bug). */
function missingLink(fileId: string): never {
  throw new Error(`no link was made to the delivered file ${fileId}`);
}

/**
 * The `ImageResult` of what was delivered: images as bytes, or the links made to their files as they
 * were stored; `size` is the delivered images' (their files'): the resolved size, or the upstream's
 * native one on a model with `resize: native`.
 */
function imageResult(task: ImageTaskRow, delivered: DeliveredImages): WithBase64<Schemas['ImageResult']> {
  const params = task.params as unknown as ImageParams;
  const first = delivered.files[0];
  return {
    created: Math.floor(task.createdAt.getTime() / 1000),
    data: delivered.files.map((file, i) => ({
      ...(params.responseFormat === 'url' ? { url: delivered.links[i] ?? missingLink(file.id) } : { b64_json: new Base64Bytes(delivered.images[i]!) }),
      ...(delivered.revisedPrompt && { revised_prompt: delivered.revisedPrompt }),
    })),
    output_format: params.outputFormat,
    size: `${first?.width ?? params.width}x${first?.height ?? params.height}`,
    quality: params.resolvedQuality,
    background: params.transparent ? 'transparent' : 'opaque',
  };
}

export function openJsonAnswer(res: Response, opts: { task: ImageTaskRow; limits: WriteLimits }): JsonImageAnswer {
  /** The body, and (when it is longer than one write) all of its JSON but its last character, written early, then that character. */
  let held: { parts: JsonParts; head?: Promise<void>; last?: string } | undefined;
  const begin = async (delivered: DeliveredImages) => {
    const parts = jsonParts(imageResult(opts.task, delivered));
    const length = jsonPartsLength(parts);
    res.status(200);
    res.setHeader('Content-Type', 'application/json; charset=utf-8');
    res.setHeader('Content-Length', String(length));
    held = { parts };
    if (length <= CORKED_BYTES) return;
    const at = parts.text.length - 1;
    const text = parts.text[at]!;
    const head = writeJsonParts(res, { ...parts, text: [...parts.text.slice(0, at), text.slice(0, -1)] }, '', '', opts.limits);
    head.catch(() => undefined);
    held = { parts, head, last: text.slice(-1) };
    return head;
  };
  return {
    whileSettling: begin,
    async end(result) {
      if (!held) await begin(result);
      if (!held!.head) {
        // One write: the headers and the whole body.
        if (!res.destroyed) res.end(joinJsonParts(held!.parts));
        return;
      }
      try {
        await held!.head;
      } catch (err) {
        if (res.destroyed) return;
        throw err;
      }
      res.end(held!.last);
    },
  };
}

export interface ImageStream extends ImageSink {
  error(err: ApiError): void;
  end(): void;
  /**
   * While nothing of the stream was sent (no upstream call made yet, no keep-alive): takes its
   * headers back and returns true, so that the request's error is answered in JSON with its status
   * and headers (a 503 with Retry-After, which SDKs retry) instead of a 200 stream's error event.
   */
  withdraw(): boolean;
}

/** A completed event's `usage` (ImageStreamUsage): the image's as the upstream reported it, zero when it reported none. */
function streamUsage(usage: GeneratedImage['usage']): Schemas['ImageStreamUsage'] {
  const u = usage ?? { inputTokens: 0, outputTokens: 0, totalTokens: 0, textTokens: 0, imageTokens: 0 };
  return { input_tokens: u.inputTokens, output_tokens: u.outputTokens, total_tokens: u.totalTokens, input_tokens_details: { text_tokens: u.textTokens, image_tokens: u.imageTokens } };
}

/**
 * `keepAliveMs` (STREAM_KEEPALIVE_MS): once the upstream call started, an SSE comment
 * (`: keep-alive`) goes out whenever that long passed without a frame — an upstream that takes
 * minutes for one image (no partials asked for) — so that a proxy's idle timeout (nginx 60 s, many
 * load balancers 60–100 s) does not cut a stream the upstream is still working on. Not before: the
 * status line would go out with it, and a request refused while it waits for a free member (at most
 * IMAGE_CAPACITY_WAIT_MS) is answered with its own status. Comments are ignored by SSE clients (the
 * openai SDKs among them). `requestId` goes into an error event as into a JSON error.
 */
export function openImageStream(
  res: Response,
  opts: { operation: ImageOperation; task: ImageTaskRow; limits: WriteLimits; keepAliveMs: number; requestId?: string },
): ImageStream {
  const params = opts.task.params as unknown as ImageParams;
  const prefix = opts.operation === 'generation' ? 'image_generation' : 'image_edit';
  res.status(200);
  res.setHeader('Content-Type', 'text/event-stream; charset=utf-8');
  res.setHeader('Cache-Control', 'no-cache');
  res.setHeader('Connection', 'keep-alive');
  res.setHeader('X-Accel-Buffering', 'no');
  // The status line and headers go out once a member's upstream call starts (`calling`), but not
  // before it: scheduled after the synchronous work and microtasks that start the call, their write
  // overlaps the upstream's time instead of delaying it (and an event written first carries them).
  let called = false;
  /** The error is answered in JSON instead (`withdraw`): the scheduled flush must not send the stream's head. */
  let withdrawn = false;

  /** Frames being written (a frame's slices may wait for 'drain': no comment goes between them), and whether one was written since the last keep-alive tick. */
  let writing = 0;
  let wrote = false;
  let keepAlive: NodeJS.Timeout | undefined;
  const startKeepAlive = () => {
    keepAlive = setInterval(() => {
      if (writing === 0 && !wrote && !res.writableEnded && !res.destroyed && !res.writableNeedDrain) res.write(': keep-alive\n\n');
      wrote = false;
    }, opts.keepAliveMs);
  };
  const stopKeepAlive = () => clearInterval(keepAlive);
  res.once('close', stopKeepAlive);
  /** Writes one frame (images as base64 slices: lib/base64-json.ts); resolves once handed to the socket, rejects when the client is gone or stalled (cut off). */
  const write = (event: string, data: unknown) => {
    writing++;
    wrote = true;
    return writeJsonParts(res, jsonParts(data), `event: ${event}\ndata: `, '\n\n', opts.limits).finally(() => {
      writing--;
    });
  };
  /** `write` of an image's event: only the socket can fail it — the client went away, or stalled and was cut off (StalledClient) — so it was not delivered (ClientGone). */
  const deliver = (event: string, data: unknown) =>
    write(event, data).catch((err: unknown) => {
      throw new ClientGone('the client went away while an image was being sent', { cause: err });
    });

  const now = () => Math.floor(Date.now() / 1000);
  const requested = {
    size: params.requestedSize,
    quality: params.quality,
    background: params.background,
    output_format: params.outputFormat,
  };
  const resolved = {
    quality: params.resolvedQuality,
    background: params.transparent ? ('transparent' as const) : ('opaque' as const),
    output_format: params.outputFormat,
  };

  return {
    publishesFiles: true,
    calling() {
      if (called) return;
      called = true;
      if (!res.destroyed) startKeepAlive();
      setImmediate(() => {
        if (!withdrawn && !res.headersSent && !res.destroyed) res.flushHeaders();
      });
    },
    withdraw() {
      if (res.headersSent) return false;
      withdrawn = true;
      stopKeepAlive();
      for (const name of ['Content-Type', 'Cache-Control', 'Connection', 'X-Accel-Buffering']) res.removeHeader(name);
      return true;
    },
    partial: (imageIndex, partialIndex, image) =>
      deliver(`${prefix}.partial_image`, {
        type: `${prefix}.partial_image`,
        b64_json: new Base64Bytes(image),
        partial_image_index: partialIndex,
        image_index: imageIndex,
        created_at: now(),
        ...requested,
      }),
    image: (imageIndex, { bytes, file, url, usage }) =>
      deliver(`${prefix}.completed`, {
        type: `${prefix}.completed`,
        ...(params.responseFormat === 'url' ? { url: url ?? missingLink(file.id) } : { b64_json: new Base64Bytes(bytes) }),
        image_index: imageIndex,
        created_at: now(),
        // The delivered image's own size: the resolved one, or the upstream's native one (`resize: native`).
        size: `${file.width ?? params.width}x${file.height ?? params.height}`,
        ...resolved,
        usage: streamUsage(usage),
      }),
    error(err) {
      const body = err.body(opts.requestId);
      void write('error', { type: 'error', error: body.error }).catch(() => undefined);
    },
    end() {
      stopKeepAlive();
      if (!res.writableEnded) res.end();
    },
  };
}
