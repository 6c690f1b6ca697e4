/**
 * Server-sent events of image streaming (product spec §6.1, OpenAI-compatible payloads): for each
 * image, `partial_image` events and then `completed`, written and flushed as they happen. An image
 * counts as delivered once its `completed` event was handed to the socket; `event: error` reports a
 * failure after the stream began.
 */
import type { Response } from 'express';
import type { components } from '../../generated/api.d.ts';
import type { ApiError } from '../errors.ts';
import { Base64Bytes, jsonParts, writeJsonParts } from '../lib/base64-json.ts';
import type { ImageOperation, ImageSink } from '../services/image/image-runner.ts';
import type { PreparedImageRequest } from '../services/image/image.service.ts';

type Schemas = components['schemas'];

export interface ImageStream extends ImageSink {
  error(err: ApiError): void;
  end(): void;
}

const ZERO_USAGE: Schemas['ImageStreamUsage'] = { input_tokens: 0, output_tokens: 0, total_tokens: 0, input_tokens_details: { text_tokens: 0, image_tokens: 0 } };

export function openImageStream(
  res: Response,
  opts: { operation: ImageOperation; prepared: PreparedImageRequest; fileUrl: (fileId: string) => Promise<string> },
): ImageStream {
  const { params } = opts.prepared;
  const prefix = opts.operation === 'generation' ? 'image_generation' : 'image_edit';
  res.status(200);
  res.setHeader('Content-Type', 'text/event-stream; charset=utf-8');
  res.setHeader('Cache-Control', 'no-cache');
  res.setHeader('Connection', 'keep-alive');
  res.setHeader('X-Accel-Buffering', 'no');
  res.flushHeaders();

  /** Writes one frame (images as base64 slices: lib/base64-json.ts); resolves once handed to the socket, rejects when the client is gone. */
  const write = (event: string, data: unknown) => writeJsonParts(res, jsonParts(data), `event: ${event}\ndata: `, '\n\n');

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
    publishesFiles: params.responseFormat === 'url',
    partial: (imageIndex, partialIndex, image) =>
      write(`${prefix}.partial_image`, {
        type: `${prefix}.partial_image`,
        b64_json: new Base64Bytes(image),
        partial_image_index: partialIndex,
        image_index: imageIndex,
        created_at: now(),
        ...requested,
      }),
    image: async (imageIndex, image, file) =>
      write(`${prefix}.completed`, {
        type: `${prefix}.completed`,
        ...(params.responseFormat === 'url' ? { url: await opts.fileUrl(file.id) } : { b64_json: new Base64Bytes(image) }),
        image_index: imageIndex,
        created_at: now(),
        // The delivered image's own size: the resolved one, or the upstream's native one (`resize: native`).
        size: `${file.width ?? params.width}x${file.height ?? params.height}`,
        ...resolved,
        usage: ZERO_USAGE,
      }),
    error(err) {
      const body = err.body();
      void write('error', { type: 'error', error: body.error }).catch(() => undefined);
    },
    end() {
      if (!res.writableEnded) res.end();
    },
  };
}
