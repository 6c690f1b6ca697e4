/** Fake media stores for failure injection: each wraps a real store and changes how image outputs are written. */
import type { Readable } from 'node:stream';
import type { MediaStore } from '../../server/storage/media-store.ts';

/** A store that passes every call to `inner` except the writes of image outputs (`putOutput`). */
abstract class OutputWrappingStore implements MediaStore {
  constructor(private readonly inner: MediaStore) {}
  protected abstract putOutput(write: () => Promise<{ bytes: number }>): Promise<{ bytes: number }>;
  put(key: string, data: Buffer | Readable, opts?: { maxBytes?: number }) {
    const write = () => this.inner.put(key, data, opts);
    return key.startsWith('image_output/') ? this.putOutput(write) : write();
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

/**
 * A media store whose writes of image outputs fail (the disk is full, the bucket is gone, …) after
 * `okOutputs` successful ones, up to the `recoversAt`-th write (0-based; by default never again).
 */
export class BrokenOutputStore extends OutputWrappingStore {
  private outputs = 0;
  constructor(
    inner: MediaStore,
    private readonly okOutputs = 0,
    private readonly recoversAt = Number.POSITIVE_INFINITY,
  ) {
    super(inner);
  }
  reset() {
    this.outputs = 0;
  }
  protected putOutput(write: () => Promise<{ bytes: number }>) {
    const index = this.outputs++;
    return index >= this.okOutputs && index < this.recoversAt ? Promise.reject(new Error('ENOSPC: no space left on device')) : write();
  }
}

/** A media store whose writes of image outputs wait until the test opens the gate (`open()`). */
export class GatedOutputStore extends OutputWrappingStore {
  private opened!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.opened = resolve));
  /** Writes of image outputs waiting at the gate. */
  waiting = 0;
  open() {
    this.opened();
  }
  protected async putOutput(write: () => Promise<{ bytes: number }>) {
    this.waiting++;
    await this.gate;
    this.waiting--;
    return write();
  }
}
