/**
 * Stored media and their signed, expiring URLs (design §7): `GET /v1/files/{file_id}?expires=&signature=`.
 * The signature is the credential, so the URL works in a browser or a download tool without the key.
 * The Files API (OpenAI's shape: list, retrieve, content, delete) shows a key's account its uploads
 * and generated outputs.
 */
import type { Readable } from 'node:stream';
import sharp, { type OutputInfo } from 'sharp';
import type { components } from '../../generated/api.d.ts';
import { ApiError } from '../errors.ts';
import type { FileRepository, FileRow, FileUser, ListedFileRow, ListedPurpose } from '../repositories/file.repository.ts';
import { accountPage, invalidAfter, listPage, type ListPage, type ListQuery } from './account-lists.ts';
import type { ByteRange, MediaStore, StoredObject } from '../storage/media-store.ts';
import { linkFailure } from '../storage/storage-error.ts';
import type { MediaInput } from '../providers/types.ts';
import type { Transactor } from '../db/transaction.ts';
import { newId, randomHex } from '../lib/ids.ts';
import { Semaphore } from '../lib/semaphore.ts';
import { hmac, signatureMatches } from '../lib/signing.ts';
import { inspectImage, type InspectedImage } from '../lib/image-inspect.ts';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';

export { MediaTooLarge, StorageError } from '../storage/media-store.ts';

const EXTENSIONS: Record<string, string> = {
  'image/png': 'png',
  'image/jpeg': 'jpg',
  'image/webp': 'webp',
  'image/gif': 'gif',
  'video/mp4': 'mp4',
};

/** A stored file's row (re-exported for the HTTP layer, which sees services only). */
export type { FileRow, ListedFileRow };

/** The `purpose` of the contract's File object; an upload is stored as `upload`. */
export type ApiFilePurpose = 'input' | 'image_output' | 'video_output';

export const apiPurposeOf = (purpose: string): ApiFilePurpose => (purpose === 'upload' ? 'input' : (purpose as ApiFilePurpose));
const storedPurposeOf = (purpose: ApiFilePurpose): ListedPurpose => (purpose === 'input' ? 'upload' : purpose);

type Schemas = components['schemas'];

/** The contract's File object of a Files API file (an upload, or a generated image or video). */
export function toApiFile(file: ListedFileRow): Schemas['File'] {
  return {
    id: file.id,
    object: 'file',
    purpose: apiPurposeOf(file.purpose),
    filename: file.filename ?? '',
    bytes: file.bytes,
    content_type: file.contentType as Schemas['File']['content_type'],
    width: file.width,
    height: file.height,
    created_at: file.createdAt.toISOString(),
    expires_at: file.expiresAt?.toISOString() ?? null,
    task_id: file.taskId,
  };
}

const fileNotFound = (id: string) => new ApiError(404, 'file_not_found', `No file '${id}' exists for this account.`);

function inUse(id: string, user: FileUser): ApiError {
  const task = `${user.kind} task '${user.taskId}'`;
  const what = user.role === 'input' ? `is an input of ${task}` : `is the output of ${task}`;
  return new ApiError(409, 'file_in_use', `File '${id}' ${what}, which has not finished; delete it once the task has finished.`);
}

export interface StoreFileInput {
  accountId: string;
  purpose: 'image_output' | 'video_output' | 'input' | 'upload';
  contentType: string;
  taskId?: string;
  width?: number;
  height?: number;
  /** When the sweeper may remove it (inputs not yet adopted by a task, uploads). */
  expiresAt?: Date;
  filename?: string;
  /** The EXIF orientation inspection found the bytes to carry (1 when none), for bytes inspected before they are stored. */
  orientation?: number;
}

/**
 * Where a file's bytes live in the store: a function of its purpose and id alone, so that a URL can
 * be presigned for a file from its id (a task row names its outputs by id) without reading its row.
 * (Files stored before keys took this form keep their recorded `storage_key`.)
 */
export function storageKeyOf(purpose: StoreFileInput['purpose'], id: string): string {
  return `${purpose}/${id.slice(5, 7)}/${id}`;
}

/** The name a file is served under (its id and extension). */
function fileNameOf(id: string, contentType: string): string {
  return `${id}.${EXTENSIONS[contentType] ?? 'bin'}`;
}

/** Purposes of what the gateway generated (kept for OUTPUT_RETENTION_DAYS, or the account's own period). */
const OUTPUTS: readonly string[] = ['image_output', 'video_output'];

/**
 * The row of a new file, its bytes not stored yet (`bytes` 0). An output expires after the default
 * retention (`outputExpiresAt`); the insert applies its account's own period where it has one.
 */
function unstoredRow(input: StoreFileInput, outputExpiresAt: Date): FileRow {
  const id = newId('file');
  return {
    id,
    accountId: input.accountId,
    purpose: input.purpose,
    contentType: input.contentType,
    bytes: 0,
    storageKey: storageKeyOf(input.purpose, id),
    width: input.width ?? null,
    height: input.height ?? null,
    taskId: input.taskId ?? null,
    expiresAt: input.expiresAt ?? (OUTPUTS.includes(input.purpose) ? outputExpiresAt : null),
    filename: input.filename ?? null,
    orientation: input.orientation ?? null,
  };
}

/** A stored file opened for a download: its row, what the store holds, and its bytes (whole or a range) on demand. */
export interface OpenedFile {
  file: FileRow;
  stored: StoredObject;
  /** The name it is downloaded under (an upload's own name, else its id and extension). */
  name: string;
  read(range?: ByteRange): Readable;
  /** Whether the file's row is gone now (deleted, or swept at its expiry, since it was opened). */
  deleted(): Promise<boolean>;
}

/** The image types every upstream takes as an input: others are sent as PNG (`mediaInputs`). */
const SENDABLE_IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/webp']);

/**
 * JPEG qualities tried for an upright copy (`sendableCopy`), best first: 95, as uploadableImage
 * re-encodes one for the adapters that send an edit's bytes, then lower until the copy is no larger
 * than the client's file (upstreams limit an input's bytes: Kling and DashScope 10 MB; a copy
 * larger than the file the gateway checked would be refused after the hold).
 */
const UPRIGHT_JPEG_QUALITIES = [95, 90, 85, 80];

export class FileService {
  /** Copies made at once (`sendableCopy`): each decodes a whole image. */
  private readonly conversions = new Semaphore(1);

  constructor(
    private readonly files: FileRepository,
    private readonly store: MediaStore,
    private readonly tx: Transactor,
    private readonly urlKey: Buffer,
    /** PUBLIC_BASE_URL, or the address the server listens on (known before the context is built). */
    private readonly publicBaseUrl: string,
    private readonly ttlSeconds: number,
    private readonly opts: { urls: 'presigned' | 'gateway'; outputRetentionDays: number } = { urls: 'gateway', outputRetentionDays: 30 },
    private readonly now: () => number = Date.now,
  ) {}

  /** Stores bytes or a stream (under `maxBytes` when given: MediaTooLarge beyond) and records the file row. */
  async save(input: StoreFileInput, data: Buffer | Readable, opts: { maxBytes?: number } = {}): Promise<FileRow> {
    const row = await this.put(input, data, opts);
    try {
      row.expiresAt = await this.files.insert(row);
    } catch (err) {
      // The insert's failure is the answer: a store failing the cleanup too must not replace it
      // (what it leaves, no row names: the orphan sweep removes it).
      await this.store.delete(row.storageKey).catch(() => undefined);
      throw err;
    }
    return row;
  }

  /**
   * Stores the bytes only: the returned row is not written yet. Its task writes it when it finishes
   * (ImageTaskRepository.complete); `discardUnrecorded` removes the bytes when it does not.
   */
  async put(input: StoreFileInput, data: Buffer | Readable, opts: { maxBytes?: number } = {}): Promise<FileRow> {
    const row = unstoredRow(input, this.outputExpiry());
    row.bytes = (await this.store.put(row.storageKey, data, { ...opts, ...this.served(row) })).bytes;
    return row;
  }

  /** When an output written now expires, by default (OUTPUT_RETENTION_DAYS). */
  private outputExpiry(): Date {
    return new Date(this.now() + this.opts.outputRetentionDays * 86_400_000);
  }

  /** How the store serves the file by itself (a presigned URL): its type and name. */
  private served(row: FileRow): { contentType: string; filename: string } {
    return { contentType: row.contentType, filename: fileNameOf(row.id, row.contentType) };
  }

  /**
   * `put` of bytes in memory whose row is ready at once and whose bytes are written when `write` is
   * called (it settles when they are, or rejects): for an answer that carries the bytes itself, whose
   * storing overlaps the statement that records the row.
   */
  deferredPut(input: StoreFileInput, data: Buffer): { file: FileRow; write: () => Promise<void> } {
    const file = unstoredRow(input, this.outputExpiry());
    file.bytes = data.length;
    return { file, write: () => this.store.put(file.storageKey, data, this.served(file)).then(() => undefined) };
  }

  /** Writes the row of a file `put` stored. */
  async record(row: FileRow): Promise<void> {
    row.expiresAt = await this.files.insert(row);
  }

  /**
   * The URL a client downloads a file from, valid for FILE_URL_TTL_SECONDS (or at least
   * `minTtlSeconds`): presigned by the store where it serves files itself (S3 with
   * MEDIA_URLS=presigned: the bytes never pass through Mediagate), else Mediagate's own signed URL,
   * which any instance serves from the store.
   */
  async downloadUrl(fileId: string, purpose: StoreFileInput['purpose'], minTtlSeconds = 0, expiresAt?: Date | null): Promise<string> {
    return this.urlOf(fileId, storageKeyOf(purpose, fileId), minTtlSeconds, expiresAt);
  }

  /**
   * `downloadUrl` of a file whose stored key is known (its row's: an input may be an upload or an
   * earlier output), and whose expiry is known when given. A presigned URL cannot be revoked and the
   * store serves the bytes until the sweep removes them, so it lives no longer than the file; a file
   * with less than a second left gets Mediagate's signed URL, which answers 404 for an expired file
   * as for any expired link (open()).
   */
  private async urlOf(fileId: string, storageKey: string, minTtlSeconds: number, expiresAt?: Date | null): Promise<string> {
    const left = expiresAt ? Math.floor((expiresAt.getTime() - this.now()) / 1000) : Number.POSITIVE_INFINITY;
    if (this.opts.urls === 'presigned' && this.store.presign && left >= 1) {
      // A presigner that fails (its credentials) is the store's failure: 503 storage_unavailable wherever a link is made.
      return this.store.presign(storageKey, Math.min(Math.max(this.ttlSeconds, minTtlSeconds), left)).catch((err: unknown) => Promise.reject(linkFailure(err, storageKey)));
    }
    return this.signedUrl(fileId, minTtlSeconds);
  }

  /**
   * A fresh Mediagate signed URL, valid for FILE_URL_TTL_SECONDS (or at least `minTtlSeconds`),
   * served by any instance from the store: what webhook bodies carry, whose URLs must outlive the
   * retry schedule (longer than a presigned URL of temporary credentials lives).
   */
  signedUrl(fileId: string, minTtlSeconds = 0): string {
    const expires = Math.floor(this.now() / 1000) + Math.max(this.ttlSeconds, minTtlSeconds);
    const signature = hmac(this.urlKey, `${fileId}.${expires}`).toString('base64url');
    return `${this.publicBaseUrl}/v1/files/${fileId}?expires=${expires}&signature=${signature}`;
  }

  /** Verifies a signed URL and opens the file; one 404 for unknown, forged and expired URLs alike. */
  async open(fileId: string, expires: number, signature: string): Promise<OpenedFile & { maxAgeSeconds: number }> {
    const notFound = new ApiError(404, 'file_not_found', 'No file at this URL, or the URL has expired.');
    const nowSeconds = Math.floor(this.now() / 1000);
    if (!signatureMatches(hmac(this.urlKey, `${fileId}.${expires}`), signature) || expires <= nowSeconds) throw notFound;
    const file = await this.files.find(fileId);
    // An expired file is gone for its URLs too, even before the sweeper has removed its bytes.
    const fileLeft = file?.expiresAt ? Math.floor(file.expiresAt.getTime() / 1000) - nowSeconds : Number.POSITIVE_INFINITY;
    if (fileLeft <= 0) throw notFound;
    const opened = file && (await this.opened(file));
    if (!opened) throw notFound;
    // A cache keeps it no longer than the URL or the file lives.
    return { ...opened, maxAgeSeconds: Math.min(expires - nowSeconds, fileLeft) };
  }

  /** A file whose bytes are in the store, ready to be sent whole or in part; undefined when they are not. */
  private async opened(file: FileRow): Promise<OpenedFile | undefined> {
    const stored = await this.store.stat(file.storageKey);
    if (!stored) return undefined;
    return {
      file,
      stored,
      name: file.filename ?? fileNameOf(file.id, file.contentType),
      read: (range) => this.store.read(file.storageKey, range),
      deleted: async () => (await this.files.find(file.id)) === undefined,
    };
  }

  /**
   * The stored inputs `ids` of a task as media inputs (one query, for their sizes and types): their
   * bytes are read only when an adapter opens them, as streams. Throws when one is missing.
   */
  async mediaInputs(ids: readonly string[]): Promise<MediaInput[]> {
    const rows = await this.files.findMany(ids);
    if (rows.length !== ids.length) throw new Error(`input files of the task are missing: ${ids.filter((id) => !rows.some((r) => r.id === id)).join(', ')}`);
    return Promise.all(
      rows.map(async (row) => {
        // Opened and fetched by URL alike: the copy when one is needed, else the file as stored.
        const file = (await this.needsCopy(row)) ? await this.sendableCopy(row) : row;
        // The row's key: an input named by file id is stored as an upload or an output, not under `input/`.
        const url = (minTtlSeconds = 0) => this.urlOf(file.id, file.storageKey, minTtlSeconds, file.expiresAt);
        return { contentType: file.contentType, bytes: file.bytes, width: file.width, height: file.height, open: () => this.store.read(file.storageKey), url };
      }),
    );
  }

  /**
   * Whether an input goes upstream as a copy (`sendableCopy`) rather than as stored: a GIF (an
   * upload may be one), since upstreams take PNG, JPEG and WebP (Veo, MiniMax and OpenAI refuse
   * GIF); and an image stored turned (an EXIF orientation other than 1: a phone's photo), since it
   * was measured upright (inspectImage), a mask was checked against it upright, and an upstream
   * that ignores the tag would see it sideways. The orientation is the row's, recorded when the
   * image was inspected: nothing is decoded here, except once for a row that has none.
   */
  private async needsCopy(row: FileRow): Promise<boolean> {
    if (!SENDABLE_IMAGE_TYPES.has(row.contentType)) return true;
    return (row.orientation ?? (await this.recordOrientation(row))) !== 1;
  }

  /**
   * The orientation of a row written without one (before it was recorded, an output named as an
   * input by a writer that did not inspect it): read from the file's header once, and recorded.
   */
  private async recordOrientation(row: FileRow): Promise<number> {
    const meta = await this.withLocalFile(row, (path) => sharp(path).metadata());
    const orientation = meta.orientation ?? 1;
    await this.files.recordOrientation(row.id, orientation);
    return orientation;
  }

  /**
   * The copy a stored image is sent upstream as (`needsCopy`), made once and kept as an input file
   * of its own that every later call finds (each attempt of the task, each task naming the same
   * file): turned upright, without the tag (no metadata is kept), a GIF's first frame. A JPEG stays
   * a JPEG (a WebP without alpha becomes one), at high quality but no larger than the client's file:
   * a PNG of a phone's photo is several times its size, past what some upstreams take. Anything
   * else becomes a PNG, which loses nothing (transparency kept).
   * Its id is the source's, its extension (`png`, `jpg`) and the source's expiry, which it shares;
   * a source whose expiry a later task extended gets a copy of its own that lives as long. The
   * source stays as it is: an upload is the client's file, whatever it is sent upstream as.
   */
  private async sendableCopy(source: FileRow): Promise<FileRow> {
    const expiry = source.expiresAt ? Math.floor(source.expiresAt.getTime() / 1000).toString(36) : '';
    const idOf = (jpeg: boolean) => `${source.id}${jpeg ? 'jpg' : 'png'}${expiry}`;
    // A JPEG stays a JPEG; a WebP that has no alpha becomes one too (a photo: as PNG it would be
    // many times the size), which only its decoding tells; a GIF's frame, a PNG and a WebP with
    // alpha become a PNG. A WebP's copy made earlier is found under either id without a read.
    const candidates = source.contentType === 'image/jpeg' ? [true] : source.contentType === 'image/webp' ? [true, false] : [false];
    const findMade = async () => {
      for (const jpeg of candidates) {
        const made = await this.files.find(idOf(jpeg));
        if (made) return made;
      }
      return undefined;
    };
    const known = await findMade();
    if (known) return known;
    const release = await this.conversions.acquire();
    try {
      // Made by another call of this process while this one waited.
      const made = await findMade();
      if (made) return made;
      return await withTemporaryDir(async (dir) => {
        // libvips reads the source from a file and writes the copy to one, streamed into the store:
        // neither file is ever whole in memory (only the decoded image, in libvips).
        const out = join(dir, 'copy');
        const { info, jpeg } = await this.withLocalFile(source, async (path) => {
          const jpeg = source.contentType === 'image/jpeg' || (source.contentType === 'image/webp' && !((await sharp(path).metadata()).hasAlpha ?? false));
          if (!jpeg) return { info: await sharp(path).autoOrient().png().toFile(out), jpeg };
          let info!: OutputInfo;
          for (const quality of UPRIGHT_JPEG_QUALITIES) {
            info = await sharp(path).autoOrient().jpeg({ quality }).toFile(out);
            if (info.size <= source.bytes) break;
          }
          return { info, jpeg };
        });
        const id = idOf(jpeg);
        // A key of this write's own (not `storageKeyOf`): another instance converting the same
        // source at once writes its own object, and the one whose row is not written removes it.
        const row: FileRow = {
          id,
          accountId: source.accountId,
          purpose: 'input',
          contentType: jpeg ? 'image/jpeg' : 'image/png',
          bytes: 0,
          storageKey: `${storageKeyOf('input', id)}.${randomHex(4)}`,
          width: info.width,
          height: info.height,
          taskId: source.taskId,
          expiresAt: source.expiresAt,
          filename: null,
          orientation: 1,
        };
        row.bytes = (await this.store.put(row.storageKey, createReadStream(out), this.served(row))).bytes;
        try {
          row.expiresAt = await this.files.insert(row);
        } catch (err) {
          await this.store.delete(row.storageKey).catch(() => undefined);
          const other = await this.files.find(id);
          if (other) return other;
          throw err;
        }
        return row;
      });
    } finally {
      release();
    }
  }

  /** The whole file in memory (inputs of an image edit, which are held in memory anyway). */
  async readAll(id: string): Promise<Buffer> {
    const file = await this.files.find(id);
    if (!file) throw new Error(`file ${id} is missing`);
    const chunks: Buffer[] = [];
    for await (const chunk of this.store.read(file.storageKey)) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /** Removes a file that was stored but never published (its task was taken over meanwhile). */
  async discard(file: FileRow): Promise<void> {
    await this.files.delete(file.id);
    await this.store.delete(file.storageKey);
  }

  /** Removes the bytes of a file whose row was never written (`put` without `record`). */
  discardUnrecorded(file: FileRow): Promise<void> {
    return this.store.delete(file.storageKey);
  }

  /** Removes the bytes of files whose rows are already deleted (a task's unpublished outputs). */
  async discardStored(storageKeys: readonly string[]): Promise<void> {
    for (const key of storageKeys) await this.store.delete(key);
  }

  find(id: string): Promise<FileRow | undefined> {
    return this.files.find(id);
  }

  /**
   * A file of the Files API of the account (an upload that has not expired, or a generated
   * output); 404 file_not_found for anything else, whoever owns it.
   */
  async getOwned(id: string, accountId: string): Promise<ListedFileRow> {
    const file = await this.files.findListed(id, accountId);
    if (!file) throw fileNotFound(id);
    return file;
  }

  /** `getOwned` and its bytes as a stream (404 when the bytes are gone too). */
  async openOwned(id: string, accountId: string): Promise<OpenedFile> {
    const opened = await this.opened(await this.getOwned(id, accountId));
    if (!opened) throw fileNotFound(id);
    return opened;
  }

  /** The contract's File object of a Files API file of the account (404 file_not_found otherwise). */
  async describeOwned(id: string, accountId: string): Promise<Schemas['File']> {
    return toApiFile(await this.getOwned(id, accountId));
  }

  /**
   * One page of the account's Files API files. An `after` that matched nothing and names no file
   * of the account, live or deleted within the last week, is 400 invalid_cursor.
   */
  async listOwned(accountId: string, query: ListQuery & { purpose?: ApiFilePurpose }): Promise<ListPage<Schemas['File']>> {
    const { page, size } = accountPage(accountId, query);
    const rows = await this.files.listForAccount(page, query.purpose && storedPurposeOf(query.purpose));
    if (rows.length === 0 && page.after !== undefined && !(await this.files.isAccountFile(page.after, accountId))) throw invalidAfter('file');
    return listPage(rows, size, toApiFile);
  }

  /**
   * Deletes a Files API file of the account: its row, detached from the task that generated it,
   * and the rows of its copies, in one transaction that also records their bytes as pending
   * deletes; then, once that has committed, the bytes, and the pending deletes of those the store
   * deleted. A file an unfinished task still needs — as an input, or as the output it is producing
   * — is 409 file_in_use, and nothing changes. Bytes the store fails to delete (deleted inside the
   * transaction, a failing delete of a copy or a failing commit would leave a listed file with no
   * bytes) stay pending: the media sweeper tries them again every minute, so a presigned link
   * handed out before stops serving them soon after the store is back. Returns the objects so
   * left, and why, for the log.
   */
  async deleteOwned(id: string, accountId: string): Promise<{ key: string; err: string }[]> {
    const keys = await this.tx.run(async (trx) => {
      const file = await this.files.findListed(id, accountId, trx);
      if (!file) throw fileNotFound(id);
      const producing = await this.files.lockProducingTask(file, trx);
      if (producing) throw inUse(id, producing);
      if (!(await this.files.lockForDelete(id, trx))) throw fileNotFound(id);
      const user = await this.files.activeInputUser(id, accountId, trx);
      if (user) throw inUse(id, user);
      return this.files.deleteDetached(file, trx);
    });
    const left: { key: string; err: string }[] = [];
    const deleted: string[] = [];
    for (const key of keys) {
      await this.store.delete(key).then(
        () => deleted.push(key),
        (err: unknown) => left.push({ key, err: err instanceof Error ? err.message : String(err) }),
      );
    }
    // The client has its answer once the rows are gone: a failure here leaves the rows to the
    // sweeper, whose delete of bytes already gone is no error.
    await this.files.forgetPendingDeletes(deleted).catch(() => undefined);
    return left;
  }

  /** A file of the account that has not expired (any purpose: an upload, an input, an output). */
  findForAccount(id: string, accountId: string): Promise<FileRow | undefined> {
    return this.files.findForAccount(id, accountId);
  }

  /** The stored bytes as a stream. */
  read(file: Pick<FileRow, 'storageKey'>): Readable {
    return this.store.read(file.storageKey);
  }

  /**
   * Inspects a stored image (inspectImage: a complete PNG/JPEG/WebP/GIF, its size). The decoder
   * reads a file: the store's own (filesystem), else a temporary copy streamed from the store
   * (S3) and removed afterwards — an input may be hundreds of MiB, never read into memory. The
   * decode waits for its turn among the process's (`fullDecodes`), and gives it up when `signal`
   * aborts first.
   */
  inspectStored(file: FileRow, param: string, signal?: AbortSignal): Promise<InspectedImage> {
    return this.withLocalFile(file, (path) => inspectImage(path, param, signal));
  }

  /** Runs `use` with a path where the file's bytes are: the store's own, else a copy streamed from the store. */
  private withLocalFile<T>(file: FileRow, use: (path: string) => Promise<T>): Promise<T> {
    const local = this.store.localPath?.(file.storageKey);
    if (local) return use(local);
    return withTemporaryDir(async (dir) => {
      const copy = join(dir, 'source');
      await pipeline(this.store.read(file.storageKey), createWriteStream(copy));
      return use(copy);
    });
  }

  /**
   * Makes an uploaded file (POST /v1/files) usable: it must be a complete image (400
   * invalid_image); its real type and size are recorded and it expires `expiresInSeconds` from now.
   * `signal`: the client is gone; an inspection still waiting for its turn to decode is given up
   * (rejecting with the signal's reason) instead of decoding a file nobody will get.
   */
  async confirmUpload(file: FileRow, expiresInSeconds: number, signal?: AbortSignal): Promise<FileRow & { createdAt: Date }> {
    const image = await this.inspectStored(file, 'file', signal);
    const expiresAt = new Date(this.now() + expiresInSeconds * 1000);
    const facts = { contentType: image.mimeType, width: image.width, height: image.height, orientation: image.orientation ?? 1 };
    const createdAt = await this.files.confirmUpload(file.id, { ...facts, expiresAt });
    return { ...file, ...facts, expiresAt, createdAt };
  }

  /** Records what inspection found an input to be (its real type, size and EXIF orientation). */
  describeImage(id: string, image: Pick<InspectedImage, 'mimeType' | 'width' | 'height' | 'orientation'>): Promise<void> {
    return this.files.describeImage(id, { contentType: image.mimeType, width: image.width, height: image.height, orientation: image.orientation ?? 1 });
  }

  /** Removes the inputs among `ids` that no task adopted (a request that created no task). */
  async discardUnadopted(ids: readonly string[]): Promise<number> {
    const keys = await this.files.deleteUnadopted(ids);
    for (const key of keys) await this.store.delete(key);
    return keys.length;
  }
}

/** Runs `use` with a new temporary directory, removed afterwards. */
async function withTemporaryDir<T>(use: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'mediagate-media-'));
  try {
    return await use(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
