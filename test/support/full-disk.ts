/**
 * A small tmpfs mounted as a media directory, so that the gateway runs on a disk that really fills
 * up (the kernel's ENOSPC), is filled with a filler file, and gets its space back when the filler is
 * removed. Mounting needs root on Linux (this machine and CI run as root); elsewhere `canMount` is
 * false and the tests that need it are skipped (`it.skipIf(!canMount)`, see `NO_MOUNT`), while the
 * tests with an injected store error still run.
 */
import { spawnSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readdirSync, rmSync, statfsSync, statSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { SPARE_DIR } from '../../server/storage/media-store.ts';

const FILLER = '.filler';

function mount(dir: string, bytes: number): boolean {
  return spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${bytes}`, 'tmpfs', dir], { stdio: 'ignore' }).status === 0;
}

function probe(): boolean {
  if (process.platform !== 'linux' || process.getuid?.() !== 0) return false;
  const dir = mkdtempSync(join(tmpdir(), 'mg-mount-probe-'));
  try {
    if (!mount(dir, 64 * 1024)) return false;
    spawnSync('umount', [dir], { stdio: 'ignore' });
    return true;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** This process may mount a tmpfs (root on Linux). */
export const canMount = probe();

if (!canMount) {
  // Said once per test file that imports this, next to vitest's "skipped" count.
  process.stderr.write('full-disk tests skipped: mounting a tmpfs needs root on Linux; the tests with an injected store error still run\n');
}

export class FullDisk {
  private constructor(readonly dir: string) {}

  /** Mounts a tmpfs of `bytes` on a new directory. */
  static mount(bytes: number): FullDisk {
    const dir = mkdtempSync(join(tmpdir(), 'mg-full-disk-'));
    if (!mount(dir, bytes)) throw new Error(`could not mount a tmpfs on ${dir}`);
    return new FullDisk(dir);
  }

  /** Bytes free for an unprivileged write. */
  free(): number {
    const s = statfsSync(this.dir);
    return s.bavail * s.bsize;
  }

  /** Fills the disk with the filler until about `leave` bytes stay free (0: full to the last byte). */
  fill(leave = 0): void {
    const fd = openSync(join(this.dir, FILLER), 'a');
    try {
      const chunk = Buffer.alloc(64 * 1024, 1);
      for (let want = Math.floor(this.free() - leave); want > 0; want = Math.floor(this.free() - leave)) {
        try {
          writeSync(fd, chunk, 0, Math.min(chunk.length, want));
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOSPC') return;
          throw err;
        }
      }
    } finally {
      closeSync(fd);
    }
  }

  /** Gives the space back: removes the filler. */
  release(): void {
    rmSync(join(this.dir, FILLER), { force: true });
  }

  /**
   * Every file on the disk but the filler and the filesystem store's spares (empty files made
   * ahead of time: spare-files.ts; one that holds bytes is listed), as paths relative to it
   * (temporary files included).
   */
  files(): string[] {
    const entries = readdirSync(this.dir, { recursive: true, withFileTypes: true });
    return entries
      .filter((e) => e.isFile() && e.name !== FILLER)
      .map((e) => relative(this.dir, join(e.parentPath ?? e.path, e.name)))
      .filter((path) => !(path.startsWith(`${SPARE_DIR}/`) && statSync(join(this.dir, path)).size === 0))
      .sort();
  }

  unmount(): void {
    spawnSync('umount', ['-l', this.dir], { stdio: 'ignore' });
    rmSync(this.dir, { recursive: true, force: true });
  }
}
