/**
 * The media store on S3-compatible object storage (AWS S3, Cloudflare R2, MinIO, Backblaze B2,
 * GCS's S3 API), so that any instance serves any file (design §7). AWS SDK v3 does all the S3:
 * `@aws-sdk/lib-storage`'s `Upload` streams a write in parts (at most PART_BYTES × PART_QUEUE in
 * memory, whatever the object's size) and aborts the multipart upload when the write fails, so a
 * failed or abandoned write leaves no object; `@aws-sdk/s3-request-presigner` signs GET URLs.
 * Credentials come from the standard AWS chain (environment, profiles, instance roles) unless given.
 *
 * Keys are the store keys under S3_PREFIX, prepended as it is: `prod/` makes a folder, `prod` makes
 * `prodimage_output/…` (deployments that stored objects so keep finding them). Errors of the store
 * itself (unreachable, refused, a missing bucket, a full quota) are StorageErrors; an error of the
 * data being written (a client that went away, a byte limit) is passed on as it is.
 */
import { DeleteObjectCommand, GetObjectCommand, HeadObjectCommand, ListObjectsV2Command, S3Client, type S3ClientConfig } from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import { PassThrough, pipeline, Readable, Transform } from 'node:stream';
import { MediaTooLarge, byteLimit, type ByteRange, type MediaStore, type PutOptions, type StoredObject } from './media-store.ts';
import { StorageFull, StorageUnavailable, type StorageError } from './storage-error.ts';

/** Size of each uploaded part (S3's least is 5 MiB), and parts in flight at once: memory per write. */
const PART_BYTES = 8 * 1024 * 1024;
const PART_QUEUE = 2;

export interface S3StoreOptions {
  bucket: string;
  region: string;
  /** Unset: AWS. */
  endpoint?: string;
  /** Path-style URLs (`https://host/bucket/key`), as MinIO-style servers need. */
  forcePathStyle?: boolean;
  /**
   * Prepended to every key as it is (several deployments in one bucket). Not made a folder here:
   * that would move the objects of a deployment that stored them under `prod` without a slash.
   */
  prefix?: string;
  /** Explicit credentials (tests); unset: the standard AWS chain. */
  credentials?: S3ClientConfig['credentials'];
  /** Limits of each attempt of a call, in ms (tests); unset: S3_TIMEOUTS. */
  timeouts?: { connectMs: number; requestMs: number };
}

/**
 * Each attempt of a call (the SDK makes up to 3) gets a TCP connection within `connectMs` and the
 * answer's headers within `requestMs` (a part upload's 8 MiB body included: 30 s is ~280 KB/s), or
 * fails as a timeout: the SDK's default waits forever, and a store that accepts connections and
 * never answers held a sweep run (and its process's stop) for good. A body being read is timed only
 * while its reader waits for it (read(): `requestMs` without a byte): a slow client paces a download,
 * and its going away ends the request.
 */
const S3_TIMEOUTS = { connectMs: 5_000, requestMs: 30_000 };

/**
 * Error names of S3 (and compatible servers) that mean the bucket or the account is out of space
 * (MinIO's full drives: `XMinioStorageFull`, HTTP 507). Any answer at 507 Insufficient Storage is
 * full too, whatever its code.
 */
const FULL = new Set(['QuotaExceeded', 'StorageQuotaExceeded', 'InsufficientStorage', 'EntityTooLarge', 'XMinioStorageFull']);

/**
 * Sockets of the client that streams reads (`read`): a download holds one until its reader is done,
 * for as long as a slow client takes; the SDK's default of 50 would make the 51st wait.
 */
const READ_SOCKETS = 1024;

export class S3MediaStore implements MediaStore {
  readonly client: S3Client;
  /**
   * The client of `read` alone, with sockets of its own: downloads in progress hold their sockets,
   * and on the same client a stat, a put of a paid output or a delete would queue behind them,
   * its connection timeout running while it waits for a socket (a healthy store answering
   * storage_unavailable).
   */
  readonly reader: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  /** How long a GET body may send nothing while its reader waits for it (read()). */
  private readonly bodyIdleMs: number;

  constructor(opts: S3StoreOptions) {
    this.bucket = opts.bucket;
    this.prefix = opts.prefix ?? '';
    this.bodyIdleMs = (opts.timeouts ?? S3_TIMEOUTS).requestMs;
    const client = (maxSockets?: number) =>
      new S3Client({
        region: opts.region,
        ...(opts.endpoint && { endpoint: opts.endpoint }),
        forcePathStyle: opts.forcePathStyle ?? false,
        ...(opts.credentials && { credentials: opts.credentials }),
        // throwOnRequestTimeout: without it the SDK only logs a warning when requestTimeout passes.
        requestHandler: {
          connectionTimeout: (opts.timeouts ?? S3_TIMEOUTS).connectMs,
          requestTimeout: (opts.timeouts ?? S3_TIMEOUTS).requestMs,
          throwOnRequestTimeout: true,
          ...(maxSockets && { httpAgent: { keepAlive: true, maxSockets }, httpsAgent: { keepAlive: true, maxSockets } }),
        },
        // Checksums only where S3 requires them: several S3-compatible stores (R2, B2, older MinIO)
        // refuse the SDK's default CRC32 trailers, and a streamed part needs none (SigV4 signs it).
        requestChecksumCalculation: 'WHEN_REQUIRED',
        responseChecksumValidation: 'WHEN_REQUIRED',
      });
    this.client = client();
    this.reader = client(READ_SOCKETS);
  }

  private objectKey(key: string): string {
    return `${this.prefix}${key}`;
  }

  async put(key: string, data: Buffer | Readable, opts: PutOptions = {}): Promise<{ bytes: number }> {
    if (Buffer.isBuffer(data)) {
      if (opts.maxBytes !== undefined && data.length > opts.maxBytes) throw new MediaTooLarge(opts.maxBytes);
      await this.upload(key, data, opts);
      return { bytes: data.length };
    }
    let bytes = 0;
    let sourceError: unknown;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        bytes += chunk.length;
        done(null, chunk);
      },
    });
    const body = new PassThrough();
    const stages: Transform[] = opts.maxBytes !== undefined ? [byteLimit(opts.maxBytes), counter] : [counter];
    // The data's own failure (its error, the byte limit, a source closed before its end: a client
    // that went away) fails the upload, and is what the caller hears — not the SDK's wrapping of
    // it. Heard before pipeline() passes it on to the body: once the body is gone (the Upload ends
    // it when a part fails), what reaches the data is the upload's failure, not its own.
    const own = (err: unknown) => {
      if (!body.destroyed) sourceError ??= err;
    };
    for (const stream of [data, ...stages]) stream.once('error', own);
    data.once('close', () => {
      if (!data.readableEnded) own(Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' }));
    });
    // pipeline, not .pipe(): a source destroyed without an error ends the body too, so the upload
    // settles instead of waiting for bytes that never come.
    pipeline([data, ...stages, body], () => undefined);
    try {
      await this.upload(key, body, opts);
    } catch (err) {
      const cause = sourceError ?? err;
      // The upload's own failure releases the data (pipeline destroys it with the body).
      body.destroy();
      throw cause;
    }
    return { bytes };
  }

  private async upload(key: string, body: Buffer | Readable, opts: PutOptions): Promise<void> {
    const upload = new Upload({
      client: this.client,
      params: {
        Bucket: this.bucket,
        Key: this.objectKey(key),
        Body: body,
        // What a presigned GET serves it as: its type, shown in the browser under its name.
        ...(opts.contentType && { ContentType: opts.contentType }),
        ...(opts.filename && { ContentDisposition: `inline; filename="${opts.filename.replace(/["\\\r\n]/g, '')}"` }),
      },
      partSize: PART_BYTES,
      queueSize: PART_QUEUE,
      // A failed multipart upload is aborted: no parts (and no object) are left behind.
      leavePartsOnError: false,
    });
    try {
      await upload.done();
    } catch (err) {
      throw storageErrorOf(err, key);
    }
  }

  read(key: string, range?: ByteRange): Readable {
    const out = new PassThrough();
    // A reader that stops (a client that went away, even before S3 answered) ends the request to
    // S3: an answer whose body nobody reads would keep its socket, and once the client's sockets
    // (50) are all held so, every S3 call of the process waits forever.
    const abort = new AbortController();
    out.once('close', () => abort.abort());
    this.reader
      .send(new GetObjectCommand({ Bucket: this.bucket, Key: this.objectKey(key), ...(range && { Range: `bytes=${range.start}-${range.end}` }) }), { abortSignal: abort.signal })
      .then(
        (res) => {
          const body = res.Body as Readable;
          if (out.destroyed) {
            body.destroy();
            return;
          }
          // Before pipeline's own listener: the reader hears the store's failure as a StorageError.
          body.once('error', (err) => out.destroy(storageErrorOf(err, key)));
          // Either side ending early destroys the other (the body frees its socket).
          pipeline(body, out, () => undefined);
          watchIdle(body, this.bodyIdleMs, () => {
            const cause = Object.assign(new Error(`ReadStalled: the object's body sent nothing for ${this.bodyIdleMs} ms`), { code: 'ReadStalled', syscall: 's3' });
            out.destroy(new StorageUnavailable(key, cause));
          });
        },
        (err: unknown) => out.destroy(storageErrorOf(err, key)),
      );
    return out;
  }

  async stat(key: string): Promise<StoredObject | undefined> {
    try {
      const head = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: this.objectKey(key) }));
      return { key, bytes: head.ContentLength ?? 0, modifiedAt: head.LastModified ?? new Date(0) };
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw storageErrorOf(err, key);
    }
  }

  async delete(key: string): Promise<void> {
    try {
      await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: this.objectKey(key) }));
    } catch (err) {
      if (!isNotFound(err)) throw storageErrorOf(err, key);
    }
  }

  /**
   * Lists the bucket's keys that begin with the prefix, without it. A prefix that is not a folder
   * (`prod`) lists other prefixes' objects too (`prod2/image_output/…` as `2/image_output/…`), and
   * an empty one every object of a shared bucket: what is listed is not all Mediagate's (the sweep
   * deletes only keys of its own shape, isMediaKey in media-sweeper.ts).
   */
  async list(after: string | undefined, limit: number): Promise<StoredObject[]> {
    try {
      // One page as S3 sends it (up to 1,000 keys), cut to `limit` here: MaxKeys with StartAfter
      // trips some S3-compatible servers (s3rver answers 500), and a page costs one request anyway.
      const res = await this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix: this.prefix || undefined, ...(after !== undefined && { StartAfter: this.objectKey(after) }) }));
      return (res.Contents ?? [])
        .filter((o) => o.Key)
        .slice(0, limit)
        .map((o) => ({ key: o.Key!.slice(this.prefix.length), bytes: o.Size ?? 0, modifiedAt: o.LastModified ?? new Date(0) }));
    } catch (err) {
      throw storageErrorOf(err, after ?? '');
    }
  }

  /** A GET URL of the object for `ttlSeconds` (it serves the type and name the object was stored with). */
  presign(key: string, ttlSeconds: number): Promise<string> {
    return getSignedUrl(this.client, new GetObjectCommand({ Bucket: this.bucket, Key: this.objectKey(key) }), { expiresIn: ttlSeconds });
  }

  /**
   * Whether the store can list what it keeps (ListObjectsV2 under its prefix, one key: the request
   * the media sweeper makes, allowed by a policy that grants ListBucket on the prefix alone), within
   * `timeoutMs` or until `signal`, for the start: 'ok'; 'refused' with what no retry changes (no
   * such bucket, the credentials or the policy refused, the bucket in another region, an endpoint
   * that is no S3 store, no credentials found); 'unknown' with why it could not tell (unreachable,
   * a timeout, a 5xx: the store may come back).
   */
  async checkBucket(timeoutMs = 10_000, signal?: AbortSignal): Promise<{ outcome: 'ok' } | { outcome: 'refused' | 'unknown'; reason: string }> {
    const bound = AbortSignal.timeout(timeoutMs);
    try {
      await this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, MaxKeys: 1, ...(this.prefix && { Prefix: this.prefix }) }), {
        abortSignal: signal ? AbortSignal.any([signal, bound]) : bound,
      });
      return { outcome: 'ok' };
    } catch (err) {
      const e = err as { name?: string; message?: string; $metadata?: { httpStatusCode?: number }; $response?: { headers?: Record<string, string> } };
      const status = e.$metadata?.httpStatusCode;
      const where = `the S3 bucket '${this.bucket}'`;
      // AWS names the bucket's region on a request signed for another (a 301, or a 400).
      const region = e.$response?.headers?.['x-amz-bucket-region'];
      if (region && (status === 301 || status === 400)) return { outcome: 'refused', reason: `${where} is in region ${region}, not the one the requests were signed for (S3_REGION)` };
      if (status === 404 && e.name === 'NoSuchBucket') return { outcome: 'refused', reason: `${where} does not exist` };
      if (status === 404) return { outcome: 'refused', reason: `S3_ENDPOINT answered 404 to a listing of ${where}: it does not look like an S3 API endpoint` };
      if (status === 403) return { outcome: 'refused', reason: `the S3 store refused to list ${where}${this.prefix ? ` under '${this.prefix}'` : ''} (403 ${e.name ?? ''}: the credentials, or a policy without s3:ListBucket)`.replace(' :', ':') };
      if (status === 301) return { outcome: 'refused', reason: `${where} is in another region than S3_REGION (301)` };
      if (status === 400) return { outcome: 'refused', reason: `the S3 store refused the request for ${where} (400${e.name ? ` ${e.name}` : ''}${e.message ? `: ${e.message}` : ''})` };
      if (e.name === 'CredentialsProviderError') return { outcome: 'refused', reason: `no S3 credentials were found (${e.message ?? e.name})` };
      return { outcome: 'unknown', reason: status ? `HTTP ${status} ${e.name ?? ''}`.trim() : (e.message ?? String(err)) };
    }
  }

  /** Closes the client's connections (shutdown, tests). */
  close(): void {
    this.client.destroy();
    this.reader.destroy();
  }
}

/**
 * Calls `stalled` once `body` has sent nothing for `idleMs` while its reader waits for bytes. The
 * SDK's requestTimeout ends with the headers and no socket timeout is set, so a connection gone
 * silent mid-body held its reader until TCP gave up, hours later: a download's client, or the
 * gateway itself (an input copied to a file for inspection or conversion, `FileService.sendableCopy`
 * holding its process-wide turn meanwhile). A reader applying backpressure pauses the body (the
 * pipe), which is not the store's stall: the count starts again when it resumes.
 */
function watchIdle(body: Readable, idleMs: number, stalled: () => void): void {
  const timer = setTimeout(() => (body.isPaused() ? timer.refresh() : stalled()), idleMs);
  timer.unref();
  const restart = () => timer.refresh();
  body.on('data', restart);
  body.on('resume', restart);
  body.once('close', () => clearTimeout(timer));
}

function isNotFound(err: unknown): boolean {
  const e = err as { name?: string; $metadata?: { httpStatusCode?: number } };
  return e?.name === 'NotFound' || e?.name === 'NoSuchKey' || e?.$metadata?.httpStatusCode === 404;
}

/** An S3 failure as a StorageError: full for quota and full-disk answers, unavailable for everything else. */
function storageErrorOf(err: unknown, key: string): StorageError {
  const e = err as { name?: string; code?: string; message?: string; $metadata?: { httpStatusCode?: number } };
  const code = e?.name && e.name !== 'Error' ? e.name : (e?.code ?? 'S3Error');
  const status = e?.$metadata?.httpStatusCode;
  const cause = Object.assign(new Error(`${code}${status ? ` (HTTP ${status})` : ''}: ${e?.message ?? String(err)}`), { code, syscall: 's3' }) as NodeJS.ErrnoException;
  return FULL.has(code) || status === 507 ? new StorageFull(key, cause) : new StorageUnavailable(key, cause);
}
