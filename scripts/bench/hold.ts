/**
 * Repository-level credit hold on one hot key: LedgerRepository.holdAndInsertTask (one statement)
 * against the same writes as a BEGIN / UPDATE api_keys / UPDATE accounts / INSERT credit_holds /
 * INSERT ledger_entries / INSERT video_tasks / COMMIT transaction, and the one statement committed
 * without waiting for the WAL flush (HoldCommit 'unflushed', a synchronous image's hold). Same
 * pool, same concurrency, same rows; run in ABCCBA order so no variant profits from a smaller table.
 * Then a synchronous image's hold, a statement each against the group commit (compareGroupCommit).
 */
import { performance } from 'node:perf_hooks';
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { DEFAULT_HOLD_BATCHING, LedgerRepository, type HoldOutcome, type HoldRequest, type TaskInsert } from '../../server/repositories/ledger.repository.ts';
import { newId } from '../../server/lib/ids.ts';
import type { Customer } from './database.ts';
import { cpuOf } from './proxy.ts';
import { queryCounts, resetQueryCounts, type QueryCounts } from './query-counter.ts';
import { summarize, type Summary } from './stats.ts';

/** local-video-1, 4 s at 720p: 0.12 credits per second. */
const UNIT_PRICE = 120_000;
const SECONDS = 4;

function holdFor(c: Customer, seq: string): { hold: HoldRequest; task: TaskInsert } {
  const taskId = newId('vid');
  const amount = UNIT_PRICE * SECONDS;
  return {
    hold: { holdId: newId('hold'), accountId: c.accountId, apiKeyId: c.apiKeyId, taskId, amount },
    task: {
      table: 'videoTasks',
      // The row VideoService.create inserts for a text-only request.
      row: {
        id: taskId,
        accountId: c.accountId,
        apiKeyId: c.apiKeyId,
        groupId: c.groupId,
        clientRequestId: `bench-hold-${seq}`,
        model: 'local-video-1',
        prompt: 'a red fox running through snow',
        negativePrompt: null,
        durationSeconds: SECONDS,
        aspectRatio: '16:9',
        resolution: '720p',
        generateAudio: false,
        inputMode: 'text',
        inputFileIds: [],
        referenceVideos: [],
        referenceAudios: [],
        callbackUrl: null,
        billingKind: 'snapshot',
        billingMode: 'per_second',
        unitPrice: UNIT_PRICE,
        quotedCredits: amount,
        deadlineAt: new Date(Date.now() + 3600_000),
      },
    },
  };
}

class InsufficientBalance extends Error {}

/** Makes every client_request_id of the process unique, across variants, halves and warm-ups. */
let sequence = 0;

/** The same writes as holdAndInsertTask, as the classic multi-statement transaction. */
export async function holdInTransaction(db: Kysely<DB>, hold: HoldRequest, task: TaskInsert): Promise<HoldOutcome> {
  const row = task.row as Record<string, unknown>;
  const snake = (n: string) => n.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  const names = Object.keys(row);
  const columns = sql.join(names.map((n) => sql.ref(snake(n))));
  const values = sql.join(names.map((n) => sql`${row[n]}`));
  try {
    return await db.transaction().execute(async (trx) => {
      const key = await sql`
        update api_keys set credits_used = credits_used + ${hold.amount}
        where id = ${hold.apiKeyId} and (credit_limit is null or credits_used + ${hold.amount} <= credit_limit)
        returning id`.execute(trx);
      if (key.rows.length === 0) return 'key_quota_exceeded';
      const account = await sql`
        update accounts set balance = balance - ${hold.amount}
        where id = ${hold.accountId} and balance >= ${hold.amount}
        returning id`.execute(trx);
      if (account.rows.length === 0) throw new InsufficientBalance(); // rolls the key update back
      await sql`
        insert into credit_holds (id, account_id, api_key_id, task_id, amount)
        values (${hold.holdId}, ${hold.accountId}, ${hold.apiKeyId}, ${hold.taskId}, ${hold.amount})`.execute(trx);
      await sql`
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
        values (${hold.accountId}, ${hold.apiKeyId}, ${hold.holdId}, 'hold', ${hold.amount}, ${hold.taskId})`.execute(trx);
      await sql`insert into ${sql.table(snake(task.table))} (${columns}) values (${values})`.execute(trx);
      return 'ok';
    });
  } catch (err) {
    if (err instanceof InsufficientBalance) return 'insufficient_balance';
    throw err;
  }
}

export type HoldVariant = 'single statement' | 'transaction' | 'single statement, unflushed';

export interface HoldResult {
  summary: Summary;
  queries: QueryCounts;
  firstError?: string;
}

interface Tally {
  latencies: number[];
  errors: number;
  seconds: number;
  firstError?: string;
  queries: Map<string, number>;
}

async function runFor(db: Kysely<DB>, variant: HoldVariant, customer: Customer, concurrency: number, ms: number, maxOps: number, tally: Tally): Promise<void> {
  const ledger = new LedgerRepository(db);
  resetQueryCounts();
  const start = performance.now();
  const stopAt = start + ms;
  let last = start;
  const loop = async () => {
    while (performance.now() < stopAt && tally.latencies.length + tally.errors < maxOps) {
      const { hold, task } = holdFor(customer, String(++sequence));
      const t0 = performance.now();
      try {
        const outcome =
          variant === 'transaction'
            ? await holdInTransaction(db, hold, task)
            : (await ledger.holdAndInsertTask(hold, task, undefined, variant === 'single statement' ? 'flushed' : 'unflushed')).outcome;
        if (outcome !== 'ok') throw new Error(`hold outcome ${outcome}`);
        last = performance.now();
        tally.latencies.push(last - t0);
      } catch (err) {
        last = performance.now();
        tally.errors++;
        tally.firstError ??= (err as Error).message;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, loop));
  tally.seconds += (last - start) / 1000;
  for (const [text, n] of queryCounts().statements) tally.queries.set(text, (tally.queries.get(text) ?? 0) + n);
}

/** Each variant runs for `durationMs` in total, as two halves in ABCCBA order, after a short warm-up of each. */
export async function compareHolds(db: Kysely<DB>, customer: Customer, concurrency: number, durationMs: number, warmupMs: number, maxOps: number): Promise<Record<HoldVariant, HoldResult>> {
  const tallies: Record<HoldVariant, Tally> = {
    'single statement': { latencies: [], errors: 0, seconds: 0, queries: new Map() },
    transaction: { latencies: [], errors: 0, seconds: 0, queries: new Map() },
    'single statement, unflushed': { latencies: [], errors: 0, seconds: 0, queries: new Map() },
  };
  const variants = ['single statement', 'transaction', 'single statement, unflushed'] as const;
  for (const variant of variants) {
    await runFor(db, variant, customer, concurrency, warmupMs / 2, maxOps, { latencies: [], errors: 0, seconds: 0, queries: new Map() });
  }
  for (const variant of [...variants, ...[...variants].reverse()]) {
    await runFor(db, variant, customer, concurrency, durationMs / 2, maxOps, tallies[variant]);
  }
  const result = (t: Tally): HoldResult => {
    const statements = [...t.queries.entries()].sort((a, b) => b[1] - a[1]);
    return {
      summary: summarize(t.latencies, t.seconds, t.errors),
      queries: { total: statements.reduce((n, [, c]) => n + c, 0), requests: 0, statements },
      firstError: t.firstError,
    };
  };
  return {
    'single statement': result(tallies['single statement']),
    transaction: result(tallies.transaction),
    'single statement, unflushed': result(tallies['single statement, unflushed']),
  };
}

/** CPU seconds of a process (0 when it is gone or not on this machine). */
function cpuSeconds(pid: number): number {
  try {
    return cpuOf(`/proc/${pid}/stat`);
  } catch {
    return 0;
  }
}

/** CPU seconds of every PostgreSQL backend of the pool (its application_name), by pid. */
async function backendCpu(db: Kysely<DB>, applicationName: string): Promise<Map<number, number>> {
  const { rows } = await sql<{ pid: number }>`select pid from pg_stat_activity where application_name = ${applicationName}`.execute(db);
  return new Map(rows.map(({ pid }) => [pid, cpuSeconds(pid)]));
}

export interface GroupCommitResult {
  summary: Summary;
  /** PostgreSQL backend CPU per hold, ms. */
  pgCpuMs: number;
  /** Holds per statement. */
  holdsPerStatement: number;
}

/**
 * A synchronous image's hold (unflushed, as ImageService places it) from `concurrency` callers:
 * a statement per hold (`DB_BATCH_MAX=1`) against the group commit of db/statement-batcher.ts
 * (the default), in ABBA halves, with the PostgreSQL backends' CPU per hold.
 */
export async function compareGroupCommit(
  db: Kysely<DB>,
  applicationName: string,
  customer: Customer,
  concurrency: number,
  durationMs: number,
  maxOps: number,
): Promise<Record<'alone' | 'group commit', GroupCommitResult>> {
  const tallies = { alone: { latencies: [] as number[], errors: 0, seconds: 0, cpu: 0, statements: 0 }, 'group commit': { latencies: [] as number[], errors: 0, seconds: 0, cpu: 0, statements: 0 } };
  const run = async (variant: 'alone' | 'group commit', ms: number, record: boolean) => {
    const ledger = new LedgerRepository(db, variant === 'alone' ? false : DEFAULT_HOLD_BATCHING);
    const tally = record ? tallies[variant] : { latencies: [] as number[], errors: 0, seconds: 0, cpu: 0, statements: 0 };
    const cpu0 = await backendCpu(db, applicationName);
    const start = performance.now();
    const stopAt = start + ms;
    let last = start;
    const loop = async () => {
      while (performance.now() < stopAt && tally.latencies.length < maxOps) {
        const taskId = newId('img');
        const t0 = performance.now();
        try {
          const { outcome } = await ledger.holdAndInsertTask(
            { holdId: newId('hold'), accountId: customer.accountId, apiKeyId: customer.apiKeyId, taskId, amount: 1000 },
            { table: 'imageTasks', row: imageRow(customer, taskId) },
            undefined,
            'unflushed',
          );
          if (outcome !== 'ok') throw new Error(`hold outcome ${outcome}`);
          last = performance.now();
          tally.latencies.push(last - t0);
        } catch {
          last = performance.now();
          tally.errors++;
        }
      }
    };
    await Promise.all(Array.from({ length: concurrency }, loop));
    tally.seconds += (last - start) / 1000;
    const cpu1 = await backendCpu(db, applicationName);
    for (const [pid, s] of cpu1) tally.cpu += s - (cpu0.get(pid) ?? s);
    const stats = ledger.holdBatchStats();
    tally.statements += variant === 'alone' ? tally.latencies.length : stats.batches + stats.singles;
  };
  await run('alone', 500, false);
  await run('group commit', 500, false);
  for (const variant of ['alone', 'group commit', 'group commit', 'alone'] as const) await run(variant, durationMs / 2, true);
  const result = (t: (typeof tallies)['alone']): GroupCommitResult => ({
    summary: summarize(t.latencies, t.seconds, t.errors),
    pgCpuMs: (1000 * t.cpu) / Math.max(1, t.latencies.length),
    holdsPerStatement: t.latencies.length / Math.max(1, t.statements),
  });
  return { alone: result(tallies.alone), 'group commit': result(tallies['group commit']) };
}

/** The row ImageService inserts for a synchronous text-to-image request. */
function imageRow(c: Customer, taskId: string) {
  return {
    id: taskId,
    accountId: c.accountId,
    apiKeyId: c.apiKeyId,
    groupId: c.groupId,
    operation: 'generation',
    model: 'local-image-1',
    prompt: 'a red fox running through snow',
    params: JSON.stringify({ size: '1024x1024', outputFormat: 'png', responseFormat: 'b64_json' }),
    inputFileIds: [],
    maskFileId: null,
    n: 1,
    unitPrice: 1000,
    quotedCredits: 1000,
    runAsync: false,
    attempt: 1,
    leaseOwner: 'bench',
    leaseExpiresAt: new Date(Date.now() + 3600_000),
    memberId: null,
    memberSlots: 1,
  };
}
