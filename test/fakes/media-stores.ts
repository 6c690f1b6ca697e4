/** Fake media stores for failure injection: each wraps a real store and changes how some writes go. */
import { Readable, Transform, pipeline } from 'node:stream';
import { asStorageError, StorageUnavailable } from '../../server/storage/storage-error.ts';
import type { ByteRange, MediaStore, PutOptions } from '../../server/storage/media-store.ts';

/** A system error as Node reports one (`ENOSPC`, `EIO`, …). */
export function systemError(code: string, syscall = 'write'): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: simulated failure, ${syscall}`), { code, syscall });
}

/** The storage error the filesystem store raises for the system error `code` on `key` (StorageFull for ENOSPC). */
export function storageError(code: string, key = 'image_output/xx/file_x.png'): Error {
  return asStorageError(systemError(code), key) as Error;
}

/** A store that passes every call to `inner`: the fakes below change some of them. */
class DelegatingStore implements MediaStore {
  constructor(protected readonly inner: MediaStore) {}
  put(key: string, data: Buffer | Readable, opts?: PutOptions) {
    return this.inner.put(key, data, opts);
  }
  read(key: string, range?: ByteRange) {
    return this.inner.read(key, range);
  }
  stat(key: string) {
    return this.inner.stat(key);
  }
  list(after: string | undefined, limit: number) {
    return this.inner.list(after, limit);
  }
  delete(key: string) {
    return this.inner.delete(key);
  }
}

/** A store that passes every call to `inner` except the writes of image outputs (`putOutput`). */
abstract class OutputWrappingStore extends DelegatingStore {
  protected abstract putOutput(write: () => Promise<{ bytes: number }>, key: string): Promise<{ bytes: number }>;
  override put(key: string, data: Buffer | Readable, opts?: PutOptions) {
    const write = () => this.inner.put(key, data, opts);
    return key.startsWith('image_output/') ? this.putOutput(write, key) : write();
  }
}

/**
 * A media store whose writes of image outputs fail after `okOutputs` successful ones, up to the
 * `recoversAt`-th write (0-based; by default never again), with `error(key)`: by default an error
 * the store did not classify (not a storage condition: the outcome is unknown); `storageError`
 * for a full or failing disk.
 */
export class BrokenOutputStore extends OutputWrappingStore {
  private outputs = 0;
  constructor(
    inner: MediaStore,
    private readonly okOutputs = 0,
    private readonly recoversAt = Number.POSITIVE_INFINITY,
    private readonly error: (key: string) => Error = () => new Error('the write was lost'),
  ) {
    super(inner);
  }
  reset() {
    this.outputs = 0;
  }
  protected putOutput(write: () => Promise<{ bytes: number }>, key: string) {
    const index = this.outputs++;
    return index >= this.okOutputs && index < this.recoversAt ? Promise.reject(this.error(key)) : write();
  }
}

/** A media store whose writes of image outputs wait until the test opens the gate (`open()`). */
export class GatedOutputStore extends OutputWrappingStore {
  private opened!: () => void;
  private gate = new Promise<void>((resolve) => (this.opened = resolve));
  /** Writes of image outputs waiting at the gate. */
  waiting = 0;
  open() {
    this.opened();
  }
  /** Closes the gate again for the writes that come next (those waiting now stay released by `open`). */
  close() {
    this.gate = new Promise<void>((resolve) => (this.opened = resolve));
  }
  protected async putOutput(write: () => Promise<{ bytes: number }>) {
    this.waiting++;
    await this.gate;
    this.waiting--;
    return write();
  }
}

/**
 * A media store whose every write fails with the storage error of the system error `code`
 * (`ENOSPC`: StorageFull; `EIO`, `EROFS`: StorageUnavailable) while `failing` is set, as the
 * filesystem store does: a stream written to it is destroyed with that error, nothing is kept.
 * Reads and removals pass to `inner`. `failedWrites` counts the refused writes.
 */
export class FailingWritesStore extends DelegatingStore {
  failing = true;
  failedWrites = 0;
  constructor(
    inner: MediaStore,
    public code = 'ENOSPC',
  ) {
    super(inner);
  }
  override put(key: string, data: Buffer | Readable, opts?: PutOptions) {
    if (!this.failing) return this.inner.put(key, data, opts);
    this.failedWrites++;
    const err = storageError(this.code, key);
    if (!Buffer.isBuffer(data)) {
      data.on('error', () => undefined);
      data.destroy(err);
    }
    return Promise.reject(err);
  }
}

/**
 * A media store whose reads fail before their first byte while `failing` is set, with `error(key)`
 * (by default the StorageUnavailable of EIO), as S3's GetObject answered 503 after a HEAD passed:
 * the stream is destroyed with it when first read. Everything else passes to `inner`. `failedReads`
 * counts the refused reads.
 */
export class FailingReadsStore extends DelegatingStore {
  failing = true;
  failedReads = 0;
  constructor(
    inner: MediaStore,
    private readonly error: (key: string) => Error = (key) => storageError('EIO', key),
  ) {
    super(inner);
  }
  override read(key: string, range?: ByteRange): Readable {
    if (!this.failing) return this.inner.read(key, range);
    this.failedReads++;
    const err = this.error(key);
    return new Readable({
      read() {
        this.destroy(err);
      },
    });
  }
}

/**
 * A media store whose deletes of the keys `refuses(key)` picks (by default every key) fail while
 * `failing` is set, with the StorageUnavailable of S3's `503 SlowDown`; everything else passes to
 * `inner`. `failedDeletes` lists the keys whose delete failed.
 */
export class FailingDeletesStore extends DelegatingStore {
  failing = true;
  readonly failedDeletes: string[] = [];
  constructor(
    inner: MediaStore,
    private readonly refuses: (key: string) => boolean = () => true,
  ) {
    super(inner);
  }
  override delete(key: string) {
    if (!this.failing || !this.refuses(key)) return this.inner.delete(key);
    this.failedDeletes.push(key);
    return Promise.reject(new StorageUnavailable(key, Object.assign(new Error('SlowDown (HTTP 503): simulated failure'), { code: 'SlowDown', syscall: 's3' })));
  }
}

/**
 * A media store whose links cannot be made while `failing` is set (S3 whose credentials fail to
 * load: the SDK's CredentialsProviderError); everything else passes to `inner`. `presigns` counts
 * the links asked for.
 */
export class PresignFailingStore extends DelegatingStore {
  failing = true;
  presigns = 0;
  presign(key: string): Promise<string> {
    this.presigns++;
    if (this.failing) return Promise.reject(Object.assign(new Error('Could not load credentials from any providers'), { name: 'CredentialsProviderError' }));
    return Promise.resolve(`https://media.example.com/${key}?X-Amz-Signature=abc`);
  }
}

/**
 * A store that holds back the first chunk of every streamed write of client media (uploads, staged
 * inputs) for `stallMs`, as an S3 part upload that takes long to answer does: what follows waits
 * behind it. `stalls` counts the writes held back.
 */
export class StallingStore extends DelegatingStore {
  stalls = 0;
  constructor(
    inner: MediaStore,
    private readonly stallMs: number,
  ) {
    super(inner);
  }
  override put(key: string, data: Buffer | Readable, opts?: PutOptions) {
    if (Buffer.isBuffer(data) || !/^(upload|input)\//.test(key)) return this.inner.put(key, data, opts);
    this.stalls++;
    let first = true;
    const stallMs = this.stallMs;
    const slow = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        if (!first) return done(null, chunk);
        first = false;
        setTimeout(() => done(null, chunk), stallMs);
      },
    });
    return this.inner.put(key, pipeline(data, slow, () => undefined), opts);
  }
}
