/**
 * The lease that keeps a sweeper (the task sweeper, the media sweeper) on one instance at a time,
 * taken by separate processes as separate instances take it: no two ever hold it at once, and a
 * process killed while holding it keeps it from the others only until it runs out.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const repoRoot = fileURLToPath(new URL('../..', import.meta.url));
let t: TestDatabase;
const children: ChildProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
  await t?.destroy();
});

interface Worker {
  /** The JSON lines it printed so far. */
  lines: Record<string, unknown>[];
  /** Resolves with the first line that satisfies `test`. */
  line(test: (l: Record<string, unknown>) => boolean): Promise<Record<string, unknown>>;
  exited: Promise<number | null>;
  /** Writes one line to its stdin. */
  go(): void;
  kill(): void;
}

function worker(...args: string[]): Worker {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/sweeper-lease-worker.ts', t.url, ...args], { cwd: repoRoot, stdio: ['pipe', 'pipe', 'pipe'] });
  children.push(child);
  const lines: Record<string, unknown>[] = [];
  const waiting: { test: (l: Record<string, unknown>) => boolean; resolve: (l: Record<string, unknown>) => void }[] = [];
  let out = '';
  let err = '';
  child.stdout.on('data', (chunk: Buffer) => {
    out += chunk.toString('utf8');
    let nl;
    while ((nl = out.indexOf('\n')) >= 0) {
      const l = JSON.parse(out.slice(0, nl)) as Record<string, unknown>;
      out = out.slice(nl + 1);
      lines.push(l);
      for (const w of waiting.splice(0)) (w.test(l) ? w.resolve(l) : waiting.push(w));
    }
  });
  child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString('utf8')));
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => {
      if (code !== 0 && code !== null) console.error(err);
      resolve(code);
    }),
  );
  return {
    lines,
    line: (test) => {
      const found = lines.find(test);
      return found ? Promise.resolve(found) : new Promise((resolve) => waiting.push({ test, resolve }));
    },
    exited,
    go: () => child.stdin.end('go\n'),
    kill: () => child.kill('SIGKILL'),
  };
}

describe('sweeper lease across processes', () => {
  it('four processes taking it over and over never hold it at the same time', async () => {
    const workers = ['a', 'b', 'c', 'd'].map((owner) => worker('contended', `owner_${owner}`, 'loop', '100', '10000', '3'));
    await Promise.all(workers.map((w) => w.line((l) => l.ready === true)));
    for (const w of workers) w.go();
    expect(await Promise.all(workers.map((w) => w.exited))).toEqual([0, 0, 0, 0]);
    const runs = workers
      .flatMap((w) => w.lines.filter((l) => l.from !== undefined))
      .map((l) => ({ owner: l.owner as string, from: l.from as number, to: l.to as number }))
      .sort((x, y) => x.from - y.from);
    // Every process got it at some point, and there were many hand-overs to check.
    expect(new Set(runs.map((r) => r.owner)).size).toBe(4);
    expect(runs.length).toBeGreaterThanOrEqual(20);
    for (let i = 1; i < runs.length; i++) {
      // Each run began after the one before it had ended: one holder at a time.
      expect(runs[i]!.from, `${runs[i]!.owner} began while ${runs[i - 1]!.owner} held the lease`).toBeGreaterThan(runs[i - 1]!.to);
    }
    // Released at the end of each run: nobody holds it now.
    const row = await t.db.selectFrom('sweepers').selectAll().where('name', '=', 'contended').executeTakeFirstOrThrow();
    expect(row.owner).toBeNull();
    expect(row.leaseUntil).toBeNull();
  });

  it('a process killed while holding it keeps it from the others until the lease runs out, then another takes over', async () => {
    const holder = worker('killed', 'owner_dead', 'hold', '2000');
    await holder.line((l) => l.taken === true);
    const { rows } = await sql<{ until: string }>`select (extract(epoch from lease_until) * 1000000)::bigint::text as until from sweepers where name = 'killed'`.execute(t.db);
    const leaseUntil = Number(rows[0]!.until);
    holder.kill();
    await holder.exited;
    const next = worker('killed', 'owner_next', 'wait', '2000');
    const taken = await next.line((l) => l.from !== undefined);
    expect(await next.exited).toBe(0);
    // Not before the dead holder's lease ended, and not long after it ended or the waiter was
    // ready, whichever came later (it polls every 20 ms; its process may start after the lease ended).
    const from = taken.from as number;
    expect(from).toBeGreaterThanOrEqual(leaseUntil);
    expect(from - Math.max(leaseUntil, taken.firstTry as number)).toBeLessThan(2_000_000);
    const row = await t.db.selectFrom('sweepers').selectAll().where('name', '=', 'killed').executeTakeFirstOrThrow();
    expect(row.owner).toBe('owner_next');
  });
});
