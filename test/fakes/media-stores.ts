/** Fake media stores for failure injection. */
import type { Readable } from 'node:stream';
import type { MediaStore } from '../../server/storage/media-store.ts';

/**
 * A media store whose writes of image outputs fail (the disk is full, the bucket is gone, …) after
 * `okOutputs` successful ones, up to the `recoversAt`-th write (0-based; by default never again).
 */
export class BrokenOutputStore implements MediaStore {
  private outputs = 0;
  constructor(
    private readonly inner: MediaStore,
    private readonly okOutputs = 0,
    private readonly recoversAt = Number.POSITIVE_INFINITY,
  ) {}
  reset() {
    this.outputs = 0;
  }
  put(key: string, data: Buffer | Readable, opts?: { maxBytes?: number }) {
    if (key.startsWith('image_output/')) {
      const index = this.outputs++;
      if (index >= this.okOutputs && index < this.recoversAt) return Promise.reject(new Error('ENOSPC: no space left on device'));
    }
    return this.inner.put(key, data, opts);
  }
  read(key: string) {
    return this.inner.read(key);
  }
  size(key: string) {
    return this.inner.size(key);
  }
  delete(key: string) {
    return this.inner.delete(key);
  }
}

/** A media store whose writes of image outputs wait until the test opens the gate (`open()`). */
export class GatedOutputStore implements MediaStore {
  private opened!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.opened = resolve));
  /** Writes of image outputs waiting at the gate. */
  waiting = 0;
  constructor(private readonly inner: MediaStore) {}
  open() {
    this.opened();
  }
  async put(key: string, data: Buffer | Readable, opts?: { maxBytes?: number }) {
    if (key.startsWith('image_output/')) {
      this.waiting++;
      await this.gate;
      this.waiting--;
    }
    return this.inner.put(key, data, opts);
  }
  read(key: string) {
    return this.inner.read(key);
  }
  size(key: string) {
    return this.inner.size(key);
  }
  delete(key: string) {
    return this.inner.delete(key);
  }
}
