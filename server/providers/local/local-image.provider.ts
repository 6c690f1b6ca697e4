/**
 * The built-in `local` image provider: real PNG, JPEG and WebP files rendered with sharp at exactly
 * the requested pixel size, showing the prompt (procedural, not AI), with partial renders.
 */
import type { ImageEvents, ImageJob, ImageProvider, UpstreamAccount } from '../types.ts';
import { editImage, renderImage } from './image/render-image.ts';

export class LocalImageProvider implements ImageProvider {
  async generate(_account: UpstreamAccount, job: ImageJob, signal: AbortSignal, events: ImageEvents): Promise<void> {
    const p = job.params;
    const common = {
      prompt: job.prompt,
      width: p.width,
      height: p.height,
      format: p.outputFormat,
      transparent: p.transparent,
      partials: p.partialImages,
      ...(p.outputCompression !== undefined && { compression: p.outputCompression }),
    };
    for (let index = 0; index < job.n && !signal.aborted; index++) {
      const input = job.inputs[index % Math.max(1, job.inputs.length)];
      const out =
        job.operation === 'edit' && input
          ? await editImage({ ...common, input, ...(job.mask && index % job.inputs.length === 0 && { mask: job.mask }) })
          : await renderImage({ ...common, seed: index });
      for (const [i, partial] of out.partials.entries()) {
        if (signal.aborted) return;
        await events.partial(index, i, partial);
      }
      if (signal.aborted) return;
      await events.image(index, { image: out.image });
    }
  }
}
