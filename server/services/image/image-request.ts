/**
 * The rules of the image endpoints (product spec §4.3, §4.4) that a schema cannot express, in one
 * pass: the alias pair, quality/background/format/compression per model, `n`, the output size
 * (image-size.ts, an edit's input size included) and the price of that size. Pure: the caller
 * passes the model's capabilities and prices, and an edit's first input size.
 */
import type { ImageCapabilities } from '../../catalog/capabilities.ts';
import { ApiError, badRequest } from '../../errors.ts';
import type { ImageFormat, ImageParams } from '../../providers/types.ts';
import { resolveImageSize, type PixelSize } from './image-size.ts';

/** The parameters shared by generations and edits, after JSON parsing or multipart coercion. */
export interface ImageRequestFields {
  prompt: string;
  model: string;
  aspectRatio?: string;
  aspect_ratio?: string;
  resolution?: string;
  quality?: 'auto' | 'low' | 'medium' | 'high';
  response_format?: 'url' | 'b64_json';
  output_format?: ImageFormat;
  output_compression?: number;
  background?: 'transparent' | 'opaque' | 'auto';
  stream?: boolean;
  n?: number;
  partial_images?: number;
  size?: string;
  /** Generations only (the edit schemas have no such field). */
  moderation?: 'auto' | 'low';
}

export interface PricedImageRequest {
  params: ImageParams;
  n: number;
  /** Micro-credits per image. */
  unitPrice: number;
}

export interface NormalizeOptions {
  sizeParam: 'accept' | 'reject';
  /** An edit's first input image (kept as the output size when the request names none). */
  inputSize?: PixelSize;
}

/** Validates the request against the model and prices it per image (price per resolution, and per quality where the model has it). */
export function normalizeImageRequest(
  body: ImageRequestFields,
  caps: ImageCapabilities,
  prices: { resolution: string; quality: string; unitPrice: number }[],
  options: NormalizeOptions,
): PricedImageRequest {
  if (body.aspectRatio !== undefined && body.aspect_ratio !== undefined && body.aspectRatio !== body.aspect_ratio) {
    throw badRequest('alias_conflict', `'aspectRatio' and 'aspect_ratio' are the same field and must agree (got '${body.aspectRatio}' and '${body.aspect_ratio}').`, 'aspect_ratio');
  }
  const quality = body.quality ?? 'auto';
  if (quality !== 'auto' && !caps.supportsQuality) {
    throw badRequest('quality_not_supported', `Model '${body.model}' does not support 'quality'; omit it (or send 'auto').`, 'quality');
  }
  // Unset: png, or the model's first format when the operator left png out of its catalog entry.
  const outputFormat = body.output_format ?? (caps.outputFormats.includes('png') ? 'png' : (caps.outputFormats[0] ?? 'png'));
  if (!caps.outputFormats.includes(outputFormat)) {
    throw badRequest('invalid_request', `Model '${body.model}' cannot produce '${outputFormat}'; allowed: ${caps.outputFormats.join(', ')}.`, 'output_format');
  }
  if (body.output_compression !== undefined && outputFormat !== 'jpeg' && outputFormat !== 'webp') {
    const got = body.output_format === undefined ? `output_format is unset, which means '${outputFormat}'` : `got '${outputFormat}'`;
    throw badRequest('output_compression_requires_jpeg_or_webp', `'output_compression' applies only when output_format is 'jpeg' or 'webp' (${got}).`, 'output_compression');
  }
  const background = body.background ?? 'auto';
  const transparent = background === 'transparent';
  if (transparent && !caps.supportsTransparentBackground) {
    throw badRequest('background_not_supported', `Model '${body.model}' does not support a transparent background.`, 'background');
  }
  if (transparent && outputFormat !== 'png' && outputFormat !== 'webp') {
    throw badRequest('transparent_background_requires_png_or_webp', `A transparent background needs output_format 'png' or 'webp' (got '${outputFormat}').`, 'background');
  }
  const n = body.n ?? 1;
  if (n > caps.maxN) throw badRequest('invalid_request', `Model '${body.model}' generates at most ${caps.maxN} images per request.`, 'n');

  const size = resolveImageSize({
    ...(body.size !== undefined && { size: body.size }),
    ...((body.aspectRatio ?? body.aspect_ratio) !== undefined && { aspectRatio: body.aspectRatio ?? body.aspect_ratio }),
    ...(body.resolution !== undefined && { resolution: body.resolution }),
    sizeParam: options.sizeParam,
    caps,
    ...(options.inputSize && { inputSize: options.inputSize }),
  });

  // `quality: auto` (or none) is billed at the `high` tier on models that price by quality.
  const resolvedQuality = caps.supportsQuality ? (quality === 'auto' ? 'high' : quality) : 'auto';
  const priceQuality = caps.supportsQuality ? resolvedQuality : '';
  const price = prices.find((p) => p.resolution === size.resolution && p.quality === priceQuality);
  if (!price) {
    throw new ApiError(503, 'no_reachable_member', `Model '${body.model}' has no price for ${size.resolution}${priceQuality ? ` ${priceQuality}` : ''}; ask the operator to set one.`);
  }
  return {
    n,
    unitPrice: price.unitPrice,
    params: {
      width: size.width,
      height: size.height,
      resolution: size.resolution,
      aspectRatio: size.aspectRatio,
      quality,
      resolvedQuality,
      background,
      transparent,
      outputFormat,
      outputCompression: body.output_compression,
      responseFormat: body.response_format ?? 'b64_json',
      partialImages: body.partial_images ?? 0,
      requestedSize: body.size ?? 'auto',
      ...(body.moderation === 'low' && { moderation: 'low' as const }),
      ...(caps.resize === 'native' && { resize: 'native' as const }),
    },
  };
}
