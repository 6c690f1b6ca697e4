import type { MediagateApi } from './api.ts';
import { isPassing, retryDelay } from './create-video.ts';
import { MediagateError, sendRequest } from './mediagate-error.ts';
import type { MediagateFile, MediagateResult } from './types.ts';
import { sleep } from './wait-for-video.ts';

/** Options of `uploadFile`. */
export interface UploadFileOptions {
  /** The file's name as the server keeps it (`filename`); default: the `File`'s own name, else `upload`. */
  filename?: string;
  /**
   * Seconds from the upload until the server deletes the file (`expires_after[seconds]`, counted
   * from `created_at`): 3600 (1 hour) to 2592000 (30 days). Default: the server's (7 days).
   */
  expiresAfterSeconds?: number;
  /**
   * How many times an upload the server refused without keeping anything (`429`, `503`
   * `database_unavailable` / `not_ready` / `server_busy` / `storage_unavailable`, `507`) is sent
   * again (default 2; 0 turns retries off). An upload that got no answer is never sent again: the
   * server may have stored it, and a second upload would store a second file.
   */
  maxRetries?: number;
  /** Aborts the upload; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Uploads an image once (`POST /v1/files`, `purpose: input`) so that later requests name it by id
 * (`images`/`mask` of an edit, `firstFrame`/`lastFrame`/`reference_images` of a video). `file` is
 * any `Blob`; in Node, `fs.openAsBlob(path)` gives one that is read from disk as it is sent, never held in memory
 * (uploads up to the server's `UPLOAD_MAX_BYTES`, 512 MiB by default). The server checks it is a
 * complete PNG, JPEG, WebP or GIF image whatever its `type` says. Returns `{ data }` (the stored
 * file: `data.id`) or `{ error }` (a `MediagateError`), like `createVideo`.
 */
export async function uploadFile(api: MediagateApi, file: Blob, options: UploadFileOptions = {}): Promise<MediagateResult<MediagateFile>> {
  const { maxRetries = 2, signal, expiresAfterSeconds } = options;
  // NaN would never stop retrying.
  if (!(maxRetries >= 0)) throw new RangeError('maxRetries must be 0 or more');
  if (expiresAfterSeconds !== undefined && !Number.isSafeInteger(expiresAfterSeconds)) {
    throw new RangeError('expiresAfterSeconds must be a whole number of seconds');
  }
  const filename = options.filename ?? ((file as Partial<File>).name || 'upload');
  for (let attempt = 0; ; attempt += 1) {
    // A body of its own for each try: the Blob is read again from its start.
    const form = new FormData();
    form.append('purpose', 'input');
    if (expiresAfterSeconds !== undefined) {
      form.append('expires_after[anchor]', 'created_at');
      form.append('expires_after[seconds]', String(expiresAfterSeconds));
    }
    // The file part last: the server reads the fields before the bytes it streams into storage.
    form.append('file', file, filename);
    const { data, error, response } = await sendRequest(
      (middleware) =>
        api.POST('/v1/files', {
          // openapi-fetch sends a FormData as it is (fetch writes the multipart body and its boundary);
          // the contract types the body by its fields.
          body: form as never,
          signal,
          middleware,
        }),
      signal,
    );
    if (response.ok && data !== undefined) return { data };
    const failure = MediagateError.fromResponse(response, error);
    const delayMs = retryDelay(failure, attempt, maxRetries, isPassing);
    if (delayMs === undefined) return { error: failure };
    await sleep(delayMs, signal);
  }
}
