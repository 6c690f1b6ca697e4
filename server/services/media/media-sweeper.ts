/**
 * Keeping the media store and the files table in step (design §7, issue 29), on one instance at a
 * time (a lease in the sweepers table), every minute:
 *
 *   expired   files past their expiry — outputs after their retention, inputs after their task's
 *             lifetime and theirs, uploads after their own — lose their bytes and their row
 *             (detached from their task, whose lookup then answers without the URL), in batches,
 *             walking them in expiry order over runs (the walk's place is kept in the sweeper's
 *             row); a file whose bytes the store refuses to delete keeps its row until the next walk;
 *   unlanded  rows of image outputs whose bytes never landed (a process died while writing them:
 *             an answer that carries its images records their rows while they are written) are
 *             deleted, checked once, 10 minutes after they were written, in batches until caught
 *             up or for a minute a run;
 *   pending   bytes of files a client deleted that the store did not delete then (an outage, a
 *             refusal, a crash after the rows' commit: FileService.deleteOwned records them in
 *             pending_deletes with the rows' delete), tried again when due — every run, backing off
 *             up to an hour for an object the store keeps refusing — in batches;
 *   orphans   objects of Mediagate's own key shape (MEDIA_KEY) that no row names (a crash between
 *             a write and its row; temporary files of the filesystem store) and older than an hour
 *             are deleted, a page of the store per run, walking the whole store over time (the
 *             walk's place is kept in the sweeper's row).
 *
 * Each phase runs whatever the others did: a store failing one of them (an object it refuses to
 * delete, an I/O error) is logged and that phase is tried again at the next run. A store failing as
 * a whole (unreachable, timing out, refusing every call) ends a phase at its first failure: walking
 * on would cost a call per file, each after the SDK's retries, past the run's lease.
 *
 * stop() ends a run at once (a stopping process): a store call in flight is left to end on its own;
 * what it did is done again by a later run, as deleting bytes already gone is no error.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from '../../logger.ts';
import type { ExpiredPlace, FileRepository } from '../../repositories/file.repository.ts';
import type { SweeperRepository } from '../../repositories/sweeper.repository.ts';
import type { Transactor } from '../../db/transaction.ts';
import { StorageError, type MediaStore } from '../../storage/media-store.ts';

const NAME = 'media';
/** Longer than a run can take: a run that dies lets another instance take over after it. */
const LEASE_MS = 5 * 60_000;
const EXPIRED_BATCH = 100;
/**
 * Refused deletes after which a run's expired phase ends (the walk goes on from there at the next
 * run): a store that refuses every delete (a missing s3:DeleteObject) costs this many calls a run.
 */
const MAX_REFUSED = 1000;
/**
 * What the store answers when it refuses one object but works: permissions of a file or its folder
 * (EACCES, EPERM), S3's AccessDenied (a bucket policy on some keys, an object lock). Anything else
 * (a network error, a timeout, a 5xx, a missing bucket, bad credentials, EIO, EROFS) is about the
 * store as a whole.
 */
const REFUSALS = new Set(['EACCES', 'EPERM', 'AccessDenied']);
/**
 * Rows checked for bytes that never landed: written 10 minutes to 2 hours ago, in batches, until
 * the walk has caught up or for `budgetMs` a run (a stat per row: a store answering in 20 ms checks
 * some 3,000 a run, against the 200 a run of one batch checked, which fell behind a busier gateway
 * until rows aged out of the window unchecked).
 */
const UNLANDED = { toMs: 10 * 60_000, fromMs: 2 * 60 * 60_000, batch: 200, budgetMs: 60_000 };
/** Objects older than this without a row are orphans (younger ones may be writes in flight). */
const ORPHAN_AGE_MS = 60 * 60_000;
const ORPHAN_PAGE = 500;
const PENDING_BATCH = 100;

/**
 * The keys Mediagate writes, the only ones the orphan sweep deletes: anything else the store lists
 * is someone else's data — a bucket shared with an empty S3_PREFIX, another deployment whose
 * S3_PREFIX begins with this one's (`prod2…` listed under `prod`, seen here as `2image_output/…`),
 * a MEDIA_DIR that holds other files. A key is `<purpose>/<the id's first 2 characters>/<file id>`
 * (storageKeyOf in file.service.ts; `.<extension>` after it in keys written before that), a
 * sendable copy's `<that key>.<8 hex>` (FileService.sendableCopy, whose id is the source's with
 * `png`/`jpg` and its expiry in base 36), and a temporary file of the filesystem store's writes,
 * `<key>.<12 hex>.tmp` (FilesystemMediaStore.put).
 */
const MEDIA_KEY = /^(?:upload|input|image_output|video_output)\/([0-9A-Za-z]{2})\/file_\1[0-9A-Za-z]*(?:\.[0-9a-z]+)?(?:\.[0-9a-f]{12}\.tmp)?$/;

/** Whether `key` is of the shape of the keys Mediagate writes (MEDIA_KEY). */
function isMediaKey(key: string): boolean {
  return MEDIA_KEY.test(key);
}

export interface SweepReport {
  pending: number;
  expired: number;
  unlanded: number;
  orphans: number;
}

interface Cursor {
  /** The last expired file the walk handled (deleted or refused); unset: the walk starts over. */
  expired?: ExpiredPlace;
  /** The last row checked for landed bytes. */
  unlanded?: { createdAt: string; id: string };
  /** The last key of the store's walk. */
  orphans?: string;
}

/** The run was stopped (stop()); not a failure. */
class SweepStopped extends Error {
  override readonly name = 'SweepStopped';
}

export class MediaSweeper {
  private readonly owner = `sweeper_${process.pid}_${randomBytes(4).toString('hex')}`;
  /** The run in progress's: stop() ends it at its next file. */
  private abort = new AbortController();
  /** The run of this process in progress, which a run() meanwhile joins. */
  private inFlight: Promise<SweepReport | undefined> | undefined;

  constructor(
    private readonly deps: { files: FileRepository; sweepers: SweeperRepository; store: MediaStore; tx: Transactor; log: Logger; now?: () => number },
  ) {}

  /**
   * One run, when no other instance is running one; undefined when another holds the lease or stop()
   * came first. While a run of this process is in progress (one longer than the interval: an expired
   * backlog on a slow store), the call joins it rather than starting a second one beside it, which
   * the lease would not keep out (it is renewed for its own owner) and which would walk from the
   * same cursor and release the lease under the first; it answers that run's report, so a stopping
   * process that waits for its latest call waits for the run in progress.
   */
  run(): Promise<SweepReport | undefined> {
    this.inFlight ??= this.runOnce().finally(() => (this.inFlight = undefined));
    return this.inFlight;
  }

  private async runOnce(): Promise<SweepReport | undefined> {
    // Made before the lease is taken: a stop() while that statement runs stops this run (as TaskSweeper.run).
    const abort = new AbortController();
    this.abort = abort;
    const taken = await this.deps.sweepers.take(NAME, this.owner, LEASE_MS);
    if (!taken) return undefined;
    const cursor = parseCursor(taken.cursor);
    if (abort.signal.aborted) {
      await this.deps.sweepers.save(NAME, this.owner, taken.cursor, true);
      return undefined;
    }
    const report: SweepReport = { pending: 0, expired: 0, unlanded: 0, orphans: 0 };
    // One phase failing (the store unreachable, a query) must not stop the others: an object that
    // cannot be listed is no reason to keep expired files, nor the reverse.
    const phase = async (name: keyof SweepReport, sweep: () => Promise<number>) => {
      if (abort.signal.aborted) return;
      try {
        report[name] = await sweep();
      } catch (err) {
        if (!abort.signal.aborted) this.deps.log.warn({ err, phase: name }, 'media sweep phase failed; retrying at the next run');
      }
    };
    try {
      await phase('pending', () => this.sweepPending());
      await phase('expired', () => this.sweepExpired(cursor));
      await phase('unlanded', () => this.sweepUnlanded(cursor));
      await phase('orphans', () => this.sweepOrphans(cursor));
    } finally {
      await this.deps.sweepers.save(NAME, this.owner, JSON.stringify(cursor), true);
    }
    if (report.pending + report.expired + report.unlanded + report.orphans > 0) this.deps.log.info({ ...report }, 'media sweep removed files');
    return report;
  }

  /** Ends the run in progress before its next store call (a stopping process); a later run starts afresh. */
  stop(): void {
    this.abort.abort();
  }

  /**
   * Expired files, a batch at a time, from where `cursor` says the walk is: the batch is read (no
   * row locks kept), its bytes deleted, then in one statement the rows of those whose bytes are gone.
   * Two sweepers on the same batch (a run that outlasted its lease) delete bytes twice, which is no
   * error, and each row once. A file whose bytes the store refuses to delete (EACCES, an S3 object
   * lock) keeps its row, unchanged, and is tried again at the next walk; after MAX_REFUSED of them
   * the run ends its phase and the next run walks on from there. A failure of the store as a whole
   * ends the phase at once, the walk kept where it was.
   */
  async sweepExpired(cursor: Cursor = {}): Promise<number> {
    let removed = 0;
    let refusals = 0;
    for (;;) {
      const batch = await this.deps.files.expiredAfter(cursor.expired, EXPIRED_BATCH, this.deps.tx.single);
      const done = await this.deleteEach(batch.map((file) => ({ ...file, key: file.storageKey })));
      removed += await this.deps.files.deleteExpired(done.deleted.map((f) => f.id), this.deps.tx.single);
      const last = batch[done.handled - 1];
      if (last) cursor.expired = { expiresAt: last.expiresAt, id: last.id };
      if (done.refused.length > 0) {
        refusals += done.refused.length;
        this.deps.log.warn(
          { count: done.refused.length, files: done.refused.slice(0, 20).map((r) => ({ id: r.item.id, key: r.item.key, err: r.err })) },
          'could not delete the bytes of expired files; their rows are kept and tried again at the next walk',
        );
      }
      if (done.failure !== undefined) throw done.failure;
      if (batch.length < EXPIRED_BATCH) {
        cursor.expired = undefined;
        return removed;
      }
      if (refusals >= MAX_REFUSED) {
        this.deps.log.warn({ refused: refusals }, 'the media store refused many deletes of expired files; the sweep goes on from here at the next run');
        return removed;
      }
    }
  }

  /**
   * The pending deletes that are due, a batch at a time, until none is due: the bytes deleted drop
   * their row, a refusal puts its row off (`deferPendingDeletes`), and a failure of the store as a
   * whole ends the phase, the rest left due for the next run. Returns how many were deleted.
   */
  async sweepPending(): Promise<number> {
    let removed = 0;
    for (;;) {
      const due = await this.deps.files.duePendingDeletes(PENDING_BATCH);
      const done = await this.deleteEach(due);
      await this.deps.files.forgetPendingDeletes(done.deleted.map((d) => d.key));
      await this.deps.files.deferPendingDeletes(done.refused.map((r) => ({ key: r.item.key, err: r.err })));
      removed += done.deleted.length;
      if (done.refused.length > 0) {
        this.deps.log.warn(
          { count: done.refused.length, objects: done.refused.slice(0, 20).map((r) => ({ key: r.item.key, attempts: r.item.attempts + 1, err: r.err })) },
          "could not delete the bytes of deleted files; tried again later",
        );
      }
      if (done.failure !== undefined) throw done.failure;
      if (due.length < PENDING_BATCH) return removed;
    }
  }

  /**
   * Deletes the objects' bytes one at a time, in order. A refusal of one object is noted and the
   * rest go on; any other failure (the store as a whole), or stop(), ends the walk there: `handled`
   * says how many were dealt with (deleted or refused), `failure` why it ended early.
   */
  private async deleteEach<T extends { key: string }>(objects: readonly T[]): Promise<{ deleted: T[]; refused: { item: T; err: string }[]; handled: number; failure?: unknown }> {
    const deleted: T[] = [];
    const refused: { item: T; err: string }[] = [];
    for (const [i, item] of objects.entries()) {
      try {
        await this.untilStopped(this.deps.store.delete(item.key));
        deleted.push(item);
      } catch (err) {
        if (!isRefusal(err)) return { deleted, refused, handled: i, failure: err };
        refused.push({ item, err: messageOf(err) });
      }
    }
    return { deleted, refused, handled: objects.length };
  }

  /**
   * `call`, or SweepStopped as soon as stop() is called: a store that does not answer must not hold
   * a stopping process for the SDK's retries and timeouts. The call itself goes on unobserved.
   */
  private untilStopped<T>(call: Promise<T>): Promise<T> {
    const signal = this.abort.signal;
    return new Promise<T>((resolve, reject) => {
      const stopped = () => reject(new SweepStopped('media sweep stopped'));
      if (signal.aborted) stopped();
      signal.addEventListener('abort', stopped, { once: true });
      call.then(resolve, reject).finally(() => signal.removeEventListener('abort', stopped));
    });
  }

  private async sweepUnlanded(cursor: Cursor): Promise<number> {
    const until = Date.now() + UNLANDED.budgetMs;
    let removed = 0;
    for (;;) {
      const rows = await this.deps.files.recentOutputs(cursor.unlanded, UNLANDED, UNLANDED.batch);
      const missing: string[] = [];
      for (const row of rows) if (!(await this.untilStopped(this.deps.store.stat(row.storageKey)))) missing.push(row.id);
      if (missing.length > 0) {
        await this.deps.tx.run((trx) => this.deps.files.deleteRows(missing, trx));
        this.deps.log.warn({ files: missing }, 'removed the rows of image outputs whose bytes never landed');
      }
      removed += missing.length;
      const last = rows.at(-1);
      if (last) cursor.unlanded = { createdAt: last.createdAt, id: last.id };
      if (rows.length < UNLANDED.batch || Date.now() >= until) return removed;
    }
  }

  private async sweepOrphans(cursor: Cursor): Promise<number> {
    const page = await this.untilStopped(this.deps.store.list(cursor.orphans, ORPHAN_PAGE));
    // A short page ended the walk: the next run starts over. (The walk goes on past foreign keys:
    // the page's length, not what is left of it, says whether the store has more.)
    const next = page.length < ORPHAN_PAGE ? undefined : page.at(-1)!.key;
    const ours = page.filter((o) => isMediaKey(o.key));
    const known = await this.deps.files.keysWithRows(ours.map((o) => o.key));
    const now = (this.deps.now ?? Date.now)();
    const orphans = ours.filter((o) => !known.has(o.key) && now - o.modifiedAt.getTime() > ORPHAN_AGE_MS);
    // A refused one is found again at the next walk; the rest of the page is removed meanwhile.
    const done = await this.deleteEach(orphans);
    const removed = done.deleted.map((o) => o.key);
    if (removed.length > 0) this.deps.log.warn({ keys: removed.slice(0, 20), count: removed.length }, 'removed stored media no file row names');
    if (done.refused.length > 0) this.deps.log.warn({ count: done.refused.length, objects: done.refused.slice(0, 20).map((r) => ({ key: r.item.key, err: r.err })) }, 'could not delete stored media no file row names; tried again at the next walk');
    // The page is walked again at the next run.
    if (done.failure !== undefined) throw done.failure;
    cursor.orphans = next;
    return removed.length;
  }
}

/** A failure of the store about one object only (REFUSALS); anything else is about the store. */
function isRefusal(err: unknown): boolean {
  return err instanceof StorageError && REFUSALS.has(err.code);
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function parseCursor(raw: string | null): Cursor {
  if (!raw) return {};
  try {
    return JSON.parse(raw) as Cursor;
  } catch {
    return {};
  }
}
