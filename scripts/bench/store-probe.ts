/**
 * What creating a file costs in the bench's media store at the moment a run starts, and on what
 * filesystem: a synchronous image writes one stored copy a request (a create, a write and a rename,
 * on the event loop), so this cost is part of every figure the proxy bench prints.
 *
 * It is not constant. On ext4 **without a journal** (the root filesystem of some VM images, this
 * project's bench machines among them) the inode allocator skips every inode freed in the last 60 s
 * (300 s while its inode table block is dirty: `recently_deleted` in fs/ext4/ialloc.c), so after a
 * mass deletion (the previous run's store, a test suite's temporary files, a dropped database) each
 * create walks past thousands of them: measured here 0.35 ms a create and rename for about a minute
 * after 30,000 deletions, against 0.035 ms otherwise, and 0.037 ms on a journaled ext4 either way
 * (docs/BENCHMARKS.md, ninth look). The probe makes that visible in each run's header; `--data-dir`
 * puts the store on another volume. The store itself now renames spare files made ahead of time
 * off the loop (spare-files.ts); the probe times that way too, so the header shows both.
 */
import { mkdirSync, readFileSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { SPARE_DIR } from '../../server/storage/media-store.ts';
import { performance } from 'node:perf_hooks';

export interface StoreProbe {
  /** The mount the directory is on: its filesystem type and source device. */
  fsType: string;
  source: string;
  /** ext3/ext4 only: whether the filesystem has a journal (a jbd2 entry for its device); undefined elsewhere. */
  journal: boolean | undefined;
  /** Median time of one create (exclusive), write and rename of a `bytes`-byte file, in ms. */
  createP50Ms: number;
  createP90Ms: number;
  /** The same with a spare file made beforehand (FilesystemMediaStore's small writes: spare-files.ts): open, write, close and rename. */
  spareP50Ms: number;
  spareP90Ms: number;
}

/**
 * The mount whose mount point is the longest prefix of `dir`, from the text of /proc/self/mountinfo
 * (`id parent major:minor root mount-point options [optional fields] - fstype source super-options`).
 */
export function mountFor(mountinfo: string, dir: string): { point: string; fsType: string; source: string } {
  let best = { point: '', fsType: 'unknown', source: 'unknown' };
  for (const line of mountinfo.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!left || !right) continue;
    const point = left.split(' ')[4]?.replace(/\\040/g, ' ');
    const [fsType, source] = right.split(' ');
    if (!point || !fsType || !source) continue;
    const inside = point === '/' || dir === point || dir.startsWith(`${point}/`);
    if (inside && point.length >= best.point.length) best = { point, fsType, source };
  }
  return best;
}

/**
 * For ext3/ext4, whether the volume has a journal: jbd2 lists each journal in /proc/fs/jbd2 as
 * `<device>-<inode>` (`loop0-8`), and nothing for a volume without one. Undefined for other filesystems.
 */
export function hasJournal(fsType: string, source: string, jbd2Entries: readonly string[]): boolean | undefined {
  if (fsType !== 'ext4' && fsType !== 'ext3') return undefined;
  const device = basename(source);
  return jbd2Entries.some((entry) => entry.startsWith(`${device}-`));
}

function readOr<T>(read: () => T, fallback: T): T {
  try {
    return read();
  } catch {
    return fallback;
  }
}

/**
 * Creates `files` files of `bytes` bytes in `dir` (made if missing) as the store writes a copy
 * (`wx`, then a rename to its final name) and times each. The files are left in place: deleting
 * them would itself slow the next creates on a journal-less ext4 (above); the caller removes `dir`
 * with the rest of the run's data.
 */
export function probeStore(dir: string, files = 400, bytes = 34 * 1024): StoreProbe {
  const absolute = resolve(dir);
  mkdirSync(absolute, { recursive: true });
  const data = Buffer.alloc(bytes, 0x5a);
  const times: number[] = [];
  for (let i = 0; i < files; i++) {
    const tmp = join(absolute, `${i}.tmp`);
    const started = performance.now();
    writeFileSync(tmp, data, { flag: 'wx' });
    renameSync(tmp, join(absolute, String(i)));
    times.push(performance.now() - started);
  }
  times.sort((a, b) => a - b);
  // As the store writes with a spare (spare-files.ts): the files made first, untimed (the pool makes
  // them in libuv's threads), in a directory of their own, then each filled and renamed into place
  // (a rename from one directory into another, as the store's from `.spare/`).
  mkdirSync(join(absolute, SPARE_DIR), { recursive: true });
  const spares = Array.from({ length: files }, (_, i) => join(absolute, SPARE_DIR, `${i}.tmp`));
  for (const spare of spares) writeFileSync(spare, '', { flag: 'wx' });
  const spareTimes = spares.map((spare, i) => {
    const started = performance.now();
    writeFileSync(spare, data, { flag: 'r+' });
    renameSync(spare, join(absolute, `s${i}`));
    return performance.now() - started;
  });
  spareTimes.sort((a, b) => a - b);
  const { fsType, source } = mountFor(readOr(() => readFileSync('/proc/self/mountinfo', 'utf8'), ''), absolute);
  return {
    fsType,
    source,
    journal: hasJournal(fsType, source, readOr(() => readdirSync('/proc/fs/jbd2'), [])),
    createP50Ms: times[Math.floor(times.length / 2)]!,
    createP90Ms: times[Math.floor(times.length * 0.9)]!,
    spareP50Ms: spareTimes[Math.floor(spareTimes.length / 2)]!,
    spareP90Ms: spareTimes[Math.floor(spareTimes.length * 0.9)]!,
  };
}

/** One line for a run's header. */
export function describeProbe(dir: string, p: StoreProbe): string {
  const journal = p.journal === undefined ? '' : p.journal ? ', with a journal' : ', no journal: creates slow down for a minute or more after mass deletions';
  return `media store ${dir} on ${p.fsType} (${p.source}${journal}); a file created and renamed there: p50 ${p.createP50Ms.toFixed(3)} ms, p90 ${p.createP90Ms.toFixed(3)} ms; a spare made beforehand, filled and renamed (the store's way): p50 ${p.spareP50Ms.toFixed(3)} ms, p90 ${p.spareP90Ms.toFixed(3)} ms`;
}
