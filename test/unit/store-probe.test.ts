/**
 * The proxy bench's store probe (scripts/bench/store-probe.ts): which mount a directory is on, and
 * whether an ext4 volume has a journal, read from the kernel's own listings; and the probe itself
 * on a real directory.
 */
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { describeProbe, hasJournal, mountFor, probeStore } from '../../scripts/bench/store-probe.ts';

// Lines of a real /proc/self/mountinfo (an overlay root, an ext4 volume, a loop mount with a space
// in its mount point, and /dev/shm), in the kernel's order.
const MOUNTINFO = [
  '580 505 0:45 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w',
  '581 580 254:0 / /work rw,relatime shared:1 - ext4 /dev/vda rw,discard',
  '590 581 7:0 / /work/media\\040store rw,relatime - ext4 /dev/loop0 rw',
  '600 580 0:50 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k',
].join('\n');

describe('mountFor', () => {
  it('takes the mount with the longest mount point that holds the directory', () => {
    expect(mountFor(MOUNTINFO, '/work/main/.mediagate')).toEqual({ point: '/work', fsType: 'ext4', source: '/dev/vda' });
    expect(mountFor(MOUNTINFO, '/work/media store/bench')).toEqual({ point: '/work/media store', fsType: 'ext4', source: '/dev/loop0' });
    expect(mountFor(MOUNTINFO, '/dev/shm')).toMatchObject({ fsType: 'tmpfs' });
    expect(mountFor(MOUNTINFO, '/tmp/x')).toMatchObject({ point: '/', fsType: 'overlay' });
  });

  it('does not take a mount point that is only a prefix of a name', () => {
    expect(mountFor(MOUNTINFO, '/workshop/x')).toMatchObject({ point: '/', fsType: 'overlay' });
  });

  it('takes the last of two mounts on the same point (the one on top)', () => {
    const text = `${MOUNTINFO}\n700 581 7:1 / /work rw - xfs /dev/loop1 rw`;
    expect(mountFor(text, '/work/x')).toMatchObject({ fsType: 'xfs', source: '/dev/loop1' });
  });

  it('says unknown without a listing', () => {
    expect(mountFor('', '/x')).toEqual({ point: '', fsType: 'unknown', source: 'unknown' });
  });
});

describe('hasJournal', () => {
  it("finds an ext4 volume's journal by its device in jbd2's listing", () => {
    expect(hasJournal('ext4', '/dev/loop0', ['loop0-8'])).toBe(true);
    expect(hasJournal('ext4', '/dev/vda', ['loop0-8'])).toBe(false);
    expect(hasJournal('ext4', '/dev/loop1', ['loop10-8'])).toBe(false);
  });

  it('has nothing to say of other filesystems', () => {
    expect(hasJournal('xfs', '/dev/sda1', [])).toBeUndefined();
    expect(hasJournal('tmpfs', 'tmpfs', [])).toBeUndefined();
  });
});

describe('probeStore', () => {
  let dir: string | undefined;
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('creates and renames the files it times, fills and renames spares, leaves them in place, and names the filesystem', () => {
    dir = mkdtempSync(join(tmpdir(), 'store-probe-'));
    const probe = probeStore(join(dir, 'probe'), 25, 1024);
    // Created and renamed (`i`), and spares filled and renamed (`si`): nothing else left.
    expect(readdirSync(join(dir, 'probe')).sort()).toEqual([...Array.from({ length: 25 }, (_, i) => [String(i), `s${i}`]).flat(), '.spare'].sort());
    expect(readdirSync(join(dir, 'probe', '.spare'))).toEqual([]);
    expect(probe.createP50Ms).toBeGreaterThan(0);
    expect(probe.createP90Ms).toBeGreaterThanOrEqual(probe.createP50Ms);
    expect(probe.spareP50Ms).toBeGreaterThan(0);
    expect(probe.spareP90Ms).toBeGreaterThanOrEqual(probe.spareP50Ms);
    expect(probe.fsType).not.toBe('unknown');
    expect(describeProbe(join(dir, 'probe'), probe)).toContain(`on ${probe.fsType} (`);
  });
});
