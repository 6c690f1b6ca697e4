/**
 * The local renderer's MP4 writer reports a trailer that could not be written (a full disk at the
 * end of a clip) instead of leaving a truncated file that looks finished: node-av's Muxer.close()
 * writes the trailer itself and ignores its result. The writes are made to fail with a file size
 * limit on a process of its own (`prlimit --fsize`, util-linux), running test/support/mp4-trailer-probe.ts.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../support/server-process.ts';

const hasPrlimit = spawnSync('prlimit', ['--version']).status === 0;
const dir = mkdtempSync(join(tmpdir(), 'mp4-trailer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function probe(path: string, maxFileBytes?: number): Promise<{ finished?: boolean; size?: number; error?: string }> {
  const node = [process.execPath, '--import', 'tsx', 'test/support/mp4-trailer-probe.ts', path];
  const [cmd, ...args] = maxFileBytes === undefined ? node : ['prlimit', `--fsize=${maxFileBytes}`, ...node];
  const child = spawn(cmd!, args, { cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  const line = stdout.split('\n').find((l) => l.startsWith('{'));
  if (code !== 0 || !line) throw new Error(`the probe exited with ${code}:\n${stdout}\n${stderr.slice(-3000)}`);
  return JSON.parse(line) as { finished?: boolean; size?: number; error?: string };
}

describe.skipIf(!hasPrlimit)('MP4 writer: the trailer', () => {
  it('finishes a clip whose index is at the front (faststart), and fails when the last byte cannot be written', async () => {
    const whole = await probe(join(dir, 'whole.mp4'));
    expect(whole).toEqual({ finished: true, size: expect.any(Number) });
    const bytes = readFileSync(join(dir, 'whole.mp4'));
    expect(bytes.length).toBe(whole.size);
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(bytes.indexOf('moov')).toBeGreaterThan(0);
    expect(bytes.indexOf('moov')).toBeLessThan(bytes.indexOf('mdat'));

    // One byte short: the header fits, the trailer's flush does not.
    const short = await probe(join(dir, 'short.mp4'), whole.size! - 1);
    expect(short.finished).toBeUndefined();
    expect(short.error).toMatch(/trailer.*File too large/);
  }, 60_000);
});
