/**
 * Keeping the media store and the files table in step (design §7, issue 29), on one instance at a
 * time (a lease in the sweepers table), every minute:
 *
 *   expired   files past their expiry — outputs after their retention, inputs after their task's
 *             lifetime and theirs, uploads after their own — lose their row (detached from their
 *             task, whose lookup then answers without the URL) and their bytes, in batches;
 *   unlanded  rows of image outputs whose bytes never landed (a process died while writing them:
 *             an answer that carries its images records their rows while they are written) are
 *             deleted, checked once, 10 minutes after they were written;
 *   orphans   objects no row names (a crash between a write and its row; temporary files of the
 *             filesystem store) and older than an hour are deleted, a page of the store per run,
 *             walking the whole store over time (the walk's place is kept in the sweeper's row).
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
    try {
      report.expired = await this.sweepExpired();
      report.unlanded = await this.sweepUnlanded(cursor);
      report.orphans = await this.sweepOrphans(cursor);
    } finally {
      await this.deps.sweepers.save(NAME, this.owner, JSON.stringify(cursor), true);
    }
    if (report.expired + report.unlanded + report.orphans > 0) this.deps.log.info({ ...report }, 'media sweep removed files');
    return report;
  }

  /** Expired files, a batch per transaction: a store that fails to delete rolls its batch's rows back. */
  async sweepExpired(): Promise<number> {
    let removed = 0;
    for (;;) {
      const n = await this.deps.tx.run(async (trx) => {
        const expired = await this.deps.files.takeExpired(EXPIRED_BATCH, trx);
        for (const file of expired) await this.deps.store.delete(file.storageKey);
        return expired.length;
      });
      removed += n;
      if (n < EXPIRED_BATCH) return removed;
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
    // A short page ended the walk: the next run starts over.
    cursor.orphans = page.length < ORPHAN_PAGE ? undefined : page.at(-1)!.key;
    const known = await this.deps.files.keysWithRows(page.map((o) => o.key));
    const now = (this.deps.now ?? Date.now)();
    const orphans = page.filter((o) => !known.has(o.key) && now - o.modifiedAt.getTime() > ORPHAN_AGE_MS);
    for (const orphan of orphans) await this.deps.store.delete(orphan.key);
    if (orphans.length > 0) this.deps.log.warn({ keys: orphans.slice(0, 20).map((o) => o.key), count: orphans.length }, 'removed stored media no file row names');
    return orphans.length;
  }
}

function parseCursor(raw: string | null): Cursor {
  if (!raw) return {};
  try {
    return JSON.parse(raw) as Cursor;
  } catch {
    return {};
  }
}
