/**
 * The media inputs one request stores before its task exists (design §7). A data URL is decoded
 * while the body is read and streamed into the media store as an `input` file that expires an hour
 * later; an https URL input is fetched into the same kind of file. Creating the task adopts the
 * files it uses (in the statement that places the credit hold), and once the request is answered,
 * `discardUnadopted` removes the rest at once: a rejected request, a replayed one or a client that
 * went away leaves nothing behind. Not before: a client that leaves while its task is created
 * must not take away the inputs the hold is about to adopt. If the process dies first, the
 * sweeper removes them when they expire.
 *
 * A staged file is known in the request's JSON by a token (`mg-staged:<nonce>:<n>`); its identity
 * for idempotency and alias agreement is the SHA-256 of its bytes.
 */
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { PassThrough, Transform, type Readable } from 'node:stream';
import type { FileRow } from '../../repositories/file.repository.ts';
import { StorageError, type FileService } from '../file.service.ts';

/** How long an input no task adopted is kept (a request that died before cleaning up). */
export const STAGED_INPUT_TTL_MS = 3_600_000;

export interface StagedInput {
  file: FileRow;
  /** Hex SHA-256 of the bytes. */
  sha256: string;
  /** The request field it came from. */
  param: string;
}

/** A destination for one input's bytes, as the body reader feeds it. */
export interface InputSink {
  write(chunk: Buffer): void | Promise<void>;
  /** The bytes are complete: the token of the stored file. */
  end(): Promise<string>;
  abort(err: Error): void;
}

export class InputStaging {
  private readonly nonce = randomBytes(12).toString('hex');
  private readonly staged = new Map<string, StagedInput>();
  /** `sha256:<hex>` identity -> the input. */
  private readonly byIdentity = new Map<string, StagedInput>();
  private readonly pending = new Set<Promise<unknown>>();
  /** The unadopted files are being removed: a file stored from now on is removed at once. */
  private closed = false;
  /** The response is over (sent, or its client gone). */
  private over = false;
  /** Run when the response is over (the large-body budget its named inputs took). */
  private readonly whenDone: (() => void)[] = [];

  constructor(
    private readonly files: FileService,
    readonly accountId: string,
  ) {}

  /** The staged input a token or an identity (`sha256:<hex>`) of this request names. */
  get(value: string): StagedInput | undefined {
    return this.staged.get(value) ?? this.byIdentity.get(value);
  }

  /** What a media value stands for: `sha256:<hex>` of a staged input's bytes, or the value itself. */
  identity(value: string): string {
    const staged = this.staged.get(value);
    return staged ? `sha256:${staged.sha256}` : value;
  }

  /** Total bytes stored so far. */
  get bytes(): number {
    let total = 0;
    for (const s of this.staged.values()) total += s.file.bytes;
    return total;
  }

  /**
   * A sink that stores the bytes written to it as an input file. `onStoreFailure` hears at once
   * when the store cannot take them (full, failing: a StorageError), so that the body reader can
   * answer without waiting for more of the body to write.
   */
  open(param: string, contentType: string, onStoreFailure?: (err: StorageError) => void): InputSink {
    const pass = new PassThrough({ highWaterMark: 1 << 20 });
    // An abort before the store attached its pipeline must not be an unhandled 'error' event;
    // the store's outcome is observed through `saving`.
    pass.on('error', () => undefined);
    const hash = createHash('sha256');
    const saving = this.track(this.files.save({ accountId: this.accountId, purpose: 'input', contentType, expiresAt: this.expiry() }, pass));
    // Observed by write/end. Once the store failed (full, I/O: a StorageError), the next write
    // reports it, so the body reader stops at once instead of filling the buffer first.
    let failed: { err: unknown } | undefined;
    saving.catch((err: unknown) => {
      failed = { err };
      if (err instanceof StorageError) onStoreFailure?.(err);
    });
    return {
      write: (chunk) => {
        if (failed) return Promise.reject(failed.err);
        hash.update(chunk);
        // Waiting ends with the store's own outcome when it fails (not the buffer's 'destroyed' error).
        if (!pass.write(chunk)) return Promise.race([once(pass, 'drain'), saving]).then(() => undefined, () => saving.then(() => undefined));
      },
      end: async () => {
        pass.end();
        return this.add(await saving, hash.digest('hex'), param);
      },
      abort: (err) => void pass.destroy(err),
    };
  }

  /** Stores a stream (a fetched URL) as an input file under `maxBytes` (MediaTooLarge beyond). */
  async store(param: string, contentType: string, stream: Readable, maxBytes: number): Promise<StagedInput> {
    const hash = createHash('sha256');
    const hashing = new Transform({
      transform(chunk: Buffer, _enc, done) {
        hash.update(chunk);
        done(null, chunk);
      },
    });
    stream.on('error', (err) => hashing.destroy(err));
    try {
      const file = await this.track(this.files.save({ accountId: this.accountId, purpose: 'input', contentType, expiresAt: this.expiry() }, stream.pipe(hashing), { maxBytes }));
      return this.staged.get(this.add(file, hash.digest('hex'), param))!;
    } finally {
      stream.destroy(); // over the limit or failed: stop reading the source (its connection) too
    }
  }

  /** Runs `release` once the response is over (at once when it already is). */
  holdUntilDone(release: () => void): void {
    if (this.over) release();
    else this.whenDone.push(release);
  }

  /** The response is over: runs what `holdUntilDone` was given. */
  responseOver(): void {
    this.over = true;
    for (const release of this.whenDone.splice(0)) release();
  }

  /**
   * Removes every staged file no task adopted; call once the request's handler is done with them
   * (it answered): called earlier, it races the hold that adopts them.
   */
  async discardUnadopted(): Promise<number> {
    this.closed = true;
    await Promise.allSettled([...this.pending]);
    const ids = [...this.staged.values()].map((s) => s.file.id);
    this.staged.clear();
    this.byIdentity.clear();
    return this.files.discardUnadopted(ids);
  }

  private add(file: FileRow, sha256: string, param: string): string {
    if (this.closed) void this.files.discardUnadopted([file.id]).catch(() => undefined);
    const token = `mg-staged:${this.nonce}:${this.staged.size}`;
    const input = { file, sha256, param };
    this.staged.set(token, input);
    if (!this.byIdentity.has(`sha256:${sha256}`)) this.byIdentity.set(`sha256:${sha256}`, input);
    return token;
  }

  private expiry(): Date {
    return new Date(Date.now() + STAGED_INPUT_TTL_MS);
  }

  /** Remembers a save in progress, so that cleanup waits for it (and then removes its file). */
  private track<T>(promise: Promise<T>): Promise<T> {
    this.pending.add(promise);
    void promise.finally(() => this.pending.delete(promise)).catch(() => undefined);
    return promise;
  }
}
