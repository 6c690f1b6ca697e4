/**
 * Empty files made ahead of time, off the event loop, for the filesystem store's small writes
 * (FilesystemMediaStore: the synchronous ones, a generated image's bytes). On the VMs this runs
 * on, making a file is what a small write costs: allocating its inode took the loop 0.2–1.0 ms
 * per file on the bench machine, while opening a file that exists, writing 25 KiB into it,
 * closing it and renaming it into place took 0.05–0.09 ms (docs/BENCHMARKS.md, nineteenth look).
 * So each write takes a spare and renames it into place, and once it is done the pool is made up
 * again in libuv's thread pool while the loop does other work.
 *
 * The spares live in `.spare/` under the store's root, on the same filesystem (a rename cannot
 * cross one), where no media key lives: the orphan sweep passes them by (media-sweeper.ts:
 * MEDIA_KEY). A graceful stop removes its spares (`FilesystemMediaStore.close`); a process that
 * dies leaves them (empty files) behind, and the first pool made under the root after a day
 * removes them. A spare that cannot be used when taken (removed
 * meanwhile, or the disk full) is dropped and the write made the ordinary way, which reports the
 * store's failure as before. No descriptor is held: a spare is a name. A directory removed right
 * after a write (a test's scratch root) can meet a spare being made, and `rm -r` then fails with
 * ENOTEMPTY: close the store first (`FilesystemMediaStore.close`), or retry (`maxRetries`).
 */
import { close, mkdir, open, readdir, stat, unlink } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { randomHex } from '../lib/ids.ts';

const openFile = promisify(open);
const closeFile = promisify(close);
const readDir = promisify(readdir);
const statFile = promisify(stat);
const unlinkFile = promisify(unlink);
const makeDir = promisify(mkdir);

/** Spares kept ready: more than a burst of 16 concurrent requests takes between two refills. */
export const SPARE_FILES = 16;
/** Spares older than this in `.spare/` were left by a process that stopped. */
export const STALE_SPARE_MS = 24 * 60 * 60 * 1000;
/** After a spare could not be made (the disk full, no permission), none is tried for this long. */
const RETRY_AFTER_MS = 1000;

export class SpareFiles {
  private readonly ready: string[] = [];
  private refilling = false;
  private started = false;
  private failedAt = Number.NEGATIVE_INFINITY;
  private stopped = false;
  /** The refill in progress, if any. */
  private filling: Promise<void> | undefined;

  constructor(
    /** Where the spares live: `.spare` under the store's root. */
    readonly dir: string,
    private readonly size = SPARE_FILES,
    private readonly now: () => number = Date.now,
  ) {}

  /** A spare's path, or undefined when none is ready (`replenish` makes the pool up). */
  take(): string | undefined {
    return this.ready.pop();
  }

  /**
   * No more spares for this store, the spares ready removed (best effort) and the one being made
   * too: the store stops (a graceful stop leaves none behind), or a rename out of `.spare/` crossed
   * filesystems (a key's directory is a mount of its own), so every spare would be written, dropped
   * and written again.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.ready.splice(0).map((spare) => unlinkFile(spare).catch(() => undefined)));
    // A spare being made is removed as soon as it is (makeUp).
    await this.filling;
  }

  /**
   * Makes the pool up in the background; called once the write that took a spare is done, not when
   * it is taken: a file being made holds its directory's lock, which the write's rename out of
   * that directory would wait for (measured: a rename's mean 0.05 ms rose to 0.39 ms).
   */
  replenish(): void {
    if (this.stopped || this.refilling || this.ready.length >= this.size || this.now() - this.failedAt < RETRY_AFTER_MS) return;
    this.refilling = true;
    this.filling = this.makeUp().finally(() => {
      this.refilling = false;
    });
  }

  private async makeUp(): Promise<void> {
    try {
      if (!this.started) {
        await makeDir(this.dir, { recursive: true });
        this.started = true;
        await this.removeStale();
      }
      while (!this.stopped && this.ready.length < this.size) {
        const path = join(this.dir, `${randomHex(8)}.tmp`);
        await closeFile(await openFile(path, 'wx'));
        // Stopped while it was being made: not kept.
        if (this.stopped) await unlinkFile(path).catch(() => undefined);
        else this.ready.push(path);
      }
    } catch (err) {
      // Writes go the ordinary way meanwhile, and report whatever this was if it is the store's.
      this.failedAt = this.now();
      // `.spare/` was removed while the process ran (an operator cleaning up), with the spares in
      // it: made again next time.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        this.started = false;
        this.ready.length = 0;
      }
    }
  }

  /** Removes spares a stopped process left behind (older than STALE_SPARE_MS). Best effort. */
  private async removeStale(): Promise<void> {
    const names = await readDir(this.dir).catch(() => [] as string[]);
    for (const name of names) {
      const path = join(this.dir, name);
      const s = await statFile(path).catch(() => undefined);
      if (s?.isFile() && this.now() - s.mtimeMs > STALE_SPARE_MS) await unlinkFile(path).catch(() => undefined);
    }
  }
}
