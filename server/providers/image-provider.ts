/** What the image pipeline needs from an upstream image provider (design §8). */
import type { ImageParams } from '../services/image/image-request.ts';

export interface ImageJob {
  operation: 'generation' | 'edit';
  model: string;
  prompt: string;
  params: ImageParams;
  /** Edit inputs (decoded image files) and the optional mask. */
  inputs: Buffer[];
  mask?: Buffer;
}

export interface RenderedImage {
  image: Buffer;
  revisedPrompt?: string;
}

export interface ImageProvider {
  readonly kind: string;
  /**
   * Renders image `index` of the job. Partial previews (params.partialImages of them) are handed to
   * `onPartial` in order as they are produced; the final image is returned.
   */
  render(job: ImageJob, index: number, signal: AbortSignal, onPartial: (partialIndex: number, image: Buffer) => Promise<void>): Promise<RenderedImage>;
}
