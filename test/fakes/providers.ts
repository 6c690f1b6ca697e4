/**
 * Fake provider adapters for failure injection: the local image provider slowed down or failing
 * part-way, and video upstreams that fail or never finish. Injected with
 * `startTestServer({ overrides: { providers: { local: { image: …, video: … } } } })`.
 */
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { LocalImageProvider } from '../../server/providers/local/local-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageProvider, VideoProvider } from '../../server/providers/types.ts';

const local = new LocalImageProvider();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The local image provider, `delayMs` slower per image, failing from image `failFrom` on (as an
 * adapter reports a broken upstream: a retryable ProviderError); from image 0 when the prompt is
 * 'fail at once'. Two prompts fail inside the gateway instead, before any image: 'crash at once'
 * (a bug: a TypeError) and 'database gone' (node-postgres's error for a connection that ended).
 */
export function flakyImageProvider(opts: { delayMs?: number; failFrom?: number }): ImageProvider {
  return {
    async generate(account, job, signal, events) {
      if (job.prompt === 'crash at once') throw new TypeError("Cannot read properties of undefined (reading 'width')");
      if (job.prompt === 'database gone') throw new Error('Connection terminated unexpectedly');
      const failFrom = job.prompt === 'fail at once' ? 0 : opts.failFrom;
      if (failFrom === 0) throw new ProviderError('retryable', 'upstream exploded');
      await sleep(opts.delayMs ?? 0);
      await local.generate(account, job, signal, {
        partial: events.partial,
        image: async (index, image) => {
          await events.image(index, image);
          if (failFrom !== undefined && index + 1 >= failFrom) throw new ProviderError('retryable', 'upstream exploded');
          await sleep(opts.delayMs ?? 0);
        },
      });
    },
  };
}

/**
 * Photo-weight images: each of the job's `n` is the same 1024x1024 noise PNG (about 3 MiB, 4 MiB in
 * base64), so a JSON answer is longer than one write (http/image-answer.ts); `delayMs` before the first.
 */
export function noiseImageProvider(opts: { delayMs?: number } = {}): ImageProvider {
  let png: Promise<Buffer> | undefined;
  return {
    async generate(_account, job, _signal, events) {
      await sleep(opts.delayMs ?? 0);
      png ??= sharp(randomBytes(1024 * 1024 * 3), { raw: { width: 1024, height: 1024, channels: 3 } }).png({ compressionLevel: 1 }).toBuffer();
      for (let i = 0; i < job.n; i++) await events.image(i, { image: await png });
    },
  };
}

/** Accepts every job and reports it failed at the first poll with `message`. */
export function failingVideoProvider(message: string): VideoProvider {
  return {
    pollIntervalMs: 10,
    submit: async () => 'job-1',
    poll: async () => ({ state: 'failed', error: new ProviderError('failed', message) }),
    download: async () => {
      throw new Error('a failed job has no output');
    },
  };
}

/** Accepts every job and keeps it running forever. */
export function neverFinishingVideoProvider(pollIntervalMs = 50): VideoProvider {
  return {
    pollIntervalMs,
    submit: async () => 'slow-job',
    poll: async () => ({ state: 'running' }),
    download: async () => {
      throw new Error('a running job has no output');
    },
  };
}

/** Returns `image` for every image of a job at once: an upstream that costs no CPU here. */
export function instantImageProvider(image: Buffer): ImageProvider {
  return {
    async generate(_account, job, _signal, events) {
      for (let i = 0; i < job.n; i++) await events.image(i, { image });
    },
  };
}

/** Completes every job at its first poll with `bytes` as the video: an upstream that costs no CPU here. */
export function instantVideoProvider(bytes: Buffer): VideoProvider {
  return {
    pollIntervalMs: 0,
    submit: async (_account, job) => `instant-${job.taskId}`,
    poll: async () => ({ state: 'succeeded', output: {} }),
    download: async () => ({ stream: Readable.from([bytes]), contentType: 'video/mp4', bytes: bytes.length }),
  };
}

/**
 * The local image provider with its second and later images held back while `gate.afterFirst` is
 * set (a test sets it to a promise it resolves): the first image reaches the client, the rest wait.
 * A held image whose request is aborted meanwhile (its client gone, its lease lost) is not made.
 */
export function gatedImageProvider(): { provider: ImageProvider; gate: { afterFirst?: Promise<void> } } {
  const gate: { afterFirst?: Promise<void> } = {};
  const provider: ImageProvider = {
    generate: (account, job, signal, events) =>
      local.generate(account, job, signal, {
        ...events,
        image: async (index, image) => {
          const held = gate.afterFirst;
          if (index > 0 && held) {
            await new Promise<void>((resolve) => {
              void held.then(resolve);
              signal.addEventListener('abort', () => resolve(), { once: true });
            });
            if (signal.aborted) return;
          }
          await events.image(index, image);
        },
      }),
  };
  return { provider, gate };
}
