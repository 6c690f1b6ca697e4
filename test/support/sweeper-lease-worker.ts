/**
 * One process of test/process/sweeper-lease.test.ts: takes the lease of sweeper job `name` through
 * SweeperRepository (the statement the task and media sweepers run), as another instance would.
 *
 *   sweeper-lease-worker.ts <database url> <name> <owner> loop <runs> <lease ms> <hold ms>
 *     prints {"owner","ready":true}, waits for a line on stdin (so that every process starts at
 *     once), then tries `runs` times; each time it holds the lease it reads PostgreSQL's clock (µs) when the run
 *     begins and when it ends (`hold ms` later), prints {"owner","from","to"} as one JSON line,
 *     and releases the lease as a finished run does.
 *   sweeper-lease-worker.ts <database url> <name> <owner> hold <lease ms>
 *     takes the lease, prints {"owner","taken":true} and never releases it (it waits to be killed).
 *   sweeper-lease-worker.ts <database url> <name> <owner> wait <lease ms>
 *     tries every 20 ms until it holds the lease, then prints {"owner","from"} (PostgreSQL's clock, µs).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { createDatabase } from '../../server/db/database.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';

const [url, name, owner, mode, ...rest] = process.argv.slice(2) as [string, string, string, 'loop' | 'hold' | 'wait', ...string[]];
const db = createDatabase(url, { max: 1, applicationName: 'mediagate-test-sweeper-lease' });
const sweepers = new SweeperRepository(db);
/** PostgreSQL's clock, in microseconds since the epoch (one clock for every process). */
const clock = async () => Number((await sql<{ now: string }>`select (extract(epoch from clock_timestamp()) * 1000000)::bigint::text as now`.execute(db)).rows[0]!.now);
const print = (line: unknown) => process.stdout.write(`${JSON.stringify(line)}\n`);

if (mode === 'loop') {
  const [runs, leaseMs, holdMs] = rest.map(Number) as [number, number, number];
  // Connected and ready; all processes start together once the test writes a line to each.
  await clock();
  print({ owner, ready: true });
  await new Promise((resolve) => process.stdin.once('data', resolve));
  process.stdin.pause();
  for (let i = 0; i < runs; i++) {
    if (await sweepers.take(name, owner, leaseMs)) {
      const from = await clock();
      await sleep(holdMs);
      const to = await clock();
      print({ owner, from, to });
      await sweepers.save(name, owner, null, true);
    }
    await sleep(Math.random() * 4);
  }
} else if (mode === 'hold') {
  if (!(await sweepers.take(name, owner, Number(rest[0])))) throw new Error('the lease was not free');
  print({ owner, taken: true });
  await new Promise(() => undefined);
} else {
  // When it could first try: a process started on a loaded machine may be ready after the lease ended.
  const firstTry = await clock();
  while (!(await sweepers.take(name, owner, Number(rest[0])))) await sleep(20);
  print({ owner, firstTry, from: await clock() });
}
await db.destroy();
