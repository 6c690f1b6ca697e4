/**
 * Failures of the media store itself: its disk or quota is full (`StorageFull`), or it cannot be
 * written at all (`StorageUnavailable`: an I/O error, a read-only or vanished volume, permissions).
 * They are the gateway's own fault, never the client's input nor the upstream's: the API answers
 * `507 storage_full` / `503 storage_unavailable` (`apiErrorOfStorage` in errors.ts), nothing is
 * charged, and nothing about them is remembered, so the first write after space returns succeeds.
 */

/** System error codes of a full disk or an exhausted quota. */
const FULL_CODES = new Set(['ENOSPC', 'EDQUOT']);

export abstract class StorageError extends Error {
  abstract readonly condition: 'full' | 'unavailable';
  /** The system error code (`ENOSPC`, `EIO`, `EROFS`, …), the call and the file, as Node reported them (for the logs). */
  readonly code: string;
  readonly syscall: string | undefined;
  readonly path: string | undefined;

  constructor(
    /** The store key being written or removed. */
    readonly key: string,
    cause: NodeJS.ErrnoException,
  ) {
    super(`media store at '${key}': ${cause.message}`, { cause });
    this.code = cause.code!;
    this.syscall = cause.syscall;
    this.path = cause.path;
  }
}

/** The disk or the quota of the media store is full (ENOSPC, EDQUOT). */
export class StorageFull extends StorageError {
  readonly condition = 'full';
  override readonly name = 'StorageFull';
}

/** The media store cannot be written (EIO, EROFS, EACCES, any other system error of its I/O). */
export class StorageUnavailable extends StorageError {
  readonly condition = 'unavailable';
  override readonly name = 'StorageUnavailable';
}

/**
 * The storage error that a failure of the store's own I/O on `key` stands for. Anything that is
 * not a system error (a bug, an error of the data being written) is returned unchanged.
 */
export function asStorageError(err: unknown, key: string): unknown {
  if (err instanceof StorageError || !isSystemError(err)) return err;
  return FULL_CODES.has(err.code) ? new StorageFull(key, err) : new StorageUnavailable(key, err);
}

function isSystemError(err: unknown): err is NodeJS.ErrnoException & { code: string } {
  return err instanceof Error && typeof (err as NodeJS.ErrnoException).code === 'string' && /^E[A-Z0-9]+$/.test((err as NodeJS.ErrnoException).code!);
}

/**
 * A link to a stored file that the store could not make (S3 presigning, its credentials failing to
 * load), as the store's failure it is: the gateway's own, 503 storage_unavailable, as a failed write.
 * A presigner's error is no system error, so it is named by its class (`CredentialsProviderError`,
 * …) for the operator's log line.
 */
export function linkFailure(err: unknown, key: string): StorageError {
  if (err instanceof StorageError) return err;
  const name = err instanceof Error && err.name !== 'Error' ? err.name : 'LinkError';
  const cause = Object.assign(new Error(`${name}: ${err instanceof Error ? err.message : String(err)}`, { cause: err }), { code: name, syscall: 'presign' });
  return new StorageUnavailable(key, cause);
}
