/**
 * Keeping the media store and the files table in step (design §7, issue 29), on one instance at a
 * time (a lease in the sweepers table), every minute:
 *
 *   expired   files past their expiry — outputs after their retention, inputs after their task's
 *             lifetime and theirs, uploads after their own — lose their bytes and their row
 *             (detached from their task, whose lookup then answers without the URL), in batches;
 *             a file whose bytes the store refuses to delete keeps its row until a later run;
 *   unlanded  rows of image outputs whose bytes never landed (a process died while writing them:
 *             an answer that carries its images records their rows while they are written) are
 *             deleted, checked once, 10 minutes after they were written;
 *   orphans   objects of Mediagate's own key shape (MEDIA_KEY) that no row names (a crash between
 *             a write and its row; temporary files of the filesystem store) and older than an hour
 *             are deleted, a page of the store per run, walking the whole store over time (the
 *             walk's place is kept in the sweeper's row).
 *
 * Each phase runs whatever the others did: a store failing one of them (an object it refuses to
 * delete, an I/O error) is logged and that phase is tried again at the next run.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from '../../logger.ts';
import type { FileRepository } from '../../repositories/file.repository.ts';
import type { SweeperRepository } from '../../repositories/sweeper.repository.ts';
import type { Transactor } from '../../db/transaction.ts';
import type { MediaStore } from '../../storage/media-store.ts';

const NAME = 'media';
/** Longer than a run can take: a run that dies lets another instance take over after it. */
const LEASE_MS = 5 * 60_000;
const EXPIRED_BATCH = 100;
/** Rows checked for bytes that never landed: written 10 minutes to 2 hours ago. */
const UNLANDED = { toMs: 10 * 60_000, fromMs: 2 * 60 * 60_000, batch: 200 };
/** Objects older than this without a row are orphans (younger ones may be writes in flight). */
const ORPHAN_AGE_MS = 60 * 60_000;
const ORPHAN_PAGE = 500;

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
export function isMediaKey(key: string): boolean {
  return MEDIA_KEY.test(key);
}

export interface SweepReport {
  expired: number;
  unlanded: number;
  orphans: number;
}

interface Cursor {
  /** The last row checked for landed bytes. */
  unlanded?: { createdAt: string; id: string };
  /** The last key of the store's walk. */
  orphans?: string;
}

export class MediaSweeper {
  private readonly owner = `sweeper_${process.pid}_${randomBytes(4).toString('hex')}`;

  constructor(
    private readonly deps: { files: FileRepository; sweepers: SweeperRepository; store: MediaStore; tx: Transactor; log: Logger; now?: () => number },
  ) {}

  /** One run, when no other instance is running one; undefined when another holds the lease. */
  async run(): Promise<SweepReport | undefined> {
    const taken = await this.deps.sweepers.take(NAME, this.owner, LEASE_MS);
    if (!taken) return undefined;
    const cursor = parseCursor(taken.cursor);
    const report: SweepReport = { expired: 0, unlanded: 0, orphans: 0 };
    // One phase failing (the store unreachable, a query) must not stop the others: an object that
    // cannot be listed is no reason to keep expired files, nor the reverse.
    const phase = async (name: keyof SweepReport, sweep: () => Promise<number>) => {
      try {
        report[name] = await sweep();
      } catch (err) {
        this.deps.log.warn({ err, phase: name }, 'media sweep phase failed; retrying at the next run');
      }
    };
    try {
      await phase('expired', () => this.sweepExpired());
      await phase('unlanded', () => this.sweepUnlanded(cursor));
      await phase('orphans', () => this.sweepOrphans(cursor));
    } finally {
      await this.deps.sweepers.save(NAME, this.owner, JSON.stringify(cursor), true);
    }
    if (report.expired + report.unlanded + report.orphans > 0) this.deps.log.info({ ...report }, 'media sweep removed files');
    return report;
  }

  /**
   * Expired files, a batch per transaction: their bytes are deleted, then the rows of those whose
   * bytes are gone. A file whose bytes the store refuses to delete (EACCES, an S3 object lock)
   * keeps its row, unchanged, and is left out for the rest of the run: it is tried again at the
   * next run, and never holds back the files after it.
   */
  async sweepExpired(): Promise<number> {
    let removed = 0;
    const failed: string[] = [];
    for (;;) {
      // Counted once committed (the transactor may run the batch again after a conflict).
      const batch = await this.deps.tx.run(async (trx) => {
        const expired = await this.deps.files.lockExpired(EXPIRED_BATCH, failed, trx);
        const deleted: string[] = [];
        const refused: { id: string; key: string; err: string }[] = [];
        for (const file of expired) {
          try {
            await this.deps.store.delete(file.storageKey);
            deleted.push(file.id);
          } catch (err) {
            refused.push({ id: file.id, key: file.storageKey, err: messageOf(err) });
          }
        }
        await this.deps.files.deleteRows(deleted, trx);
        return { taken: expired.length, deleted: deleted.length, refused };
      });
      removed += batch.deleted;
      if (batch.refused.length > 0) {
        failed.push(...batch.refused.map((f) => f.id));
        this.deps.log.warn({ count: batch.refused.length, files: batch.refused.slice(0, 20) }, 'could not delete the bytes of expired files; their rows are kept and tried again at the next run');
      }
      if (batch.taken < EXPIRED_BATCH) return removed;
    }
  }

  private async sweepUnlanded(cursor: Cursor): Promise<number> {
    const after = cursor.unlanded && { createdAt: new Date(cursor.unlanded.createdAt), id: cursor.unlanded.id };
    const rows = await this.deps.files.recentOutputs(after, UNLANDED, UNLANDED.batch);
    const missing: string[] = [];
    for (const row of rows) if (!(await this.deps.store.stat(row.storageKey))) missing.push(row.id);
    if (missing.length > 0) {
      await this.deps.tx.run((trx) => this.deps.files.deleteRows(missing, trx));
      this.deps.log.warn({ files: missing }, 'removed the rows of image outputs whose bytes never landed');
    }
    const last = rows.at(-1);
    if (last) cursor.unlanded = { createdAt: last.createdAt.toISOString(), id: last.id };
    return missing.length;
  }

  private async sweepOrphans(cursor: Cursor): Promise<number> {
    const page = await this.deps.store.list(cursor.orphans, ORPHAN_PAGE);
    // A short page ended the walk: the next run starts over. (The walk goes on past foreign keys:
    // the page's length, not what is left of it, says whether the store has more.)
    const next = page.length < ORPHAN_PAGE ? undefined : page.at(-1)!.key;
    const ours = page.filter((o) => isMediaKey(o.key));
    const known = await this.deps.files.keysWithRows(ours.map((o) => o.key));
    const now = (this.deps.now ?? Date.now)();
    const orphans = ours.filter((o) => !known.has(o.key) && now - o.modifiedAt.getTime() > ORPHAN_AGE_MS);
    const removed: string[] = [];
    const refused: { key: string; err: string }[] = [];
    for (const orphan of orphans) {
      try {
        await this.deps.store.delete(orphan.key);
        removed.push(orphan.key);
      } catch (err) {
        // Found again at the next walk; the rest of the page is removed meanwhile.
        refused.push({ key: orphan.key, err: messageOf(err) });
      }
    }
    cursor.orphans = next;
    if (removed.length > 0) this.deps.log.warn({ keys: removed.slice(0, 20), count: removed.length }, 'removed stored media no file row names');
    if (refused.length > 0) this.deps.log.warn({ count: refused.length, objects: refused.slice(0, 20) }, 'could not delete stored media no file row names; tried again at the next walk');
    return removed.length;
  }
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
