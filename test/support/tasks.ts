/**
 * Task helpers several test files share: a task's credit hold, an account's credit state, and
 * waiting for a task (through the API or in the database) to reach a state.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { TestServer } from './http-harness.ts';

/** The hold of a task: amount, status and captured micro-credits. */
export function holdOf(db: Kysely<DB>, taskId: string) {
  return db.selectFrom('creditHolds').select(['amount', 'status', 'captured']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
}

/** Balance, key usage, holds and video task count of an account and one of its keys. */
export async function accountState(db: Kysely<DB>, accountId: string, apiKeyId: string) {
  const account = await db.selectFrom('accounts').select(['balance', 'totalSpent']).where('id', '=', accountId).executeTakeFirstOrThrow();
  const key = await db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', apiKeyId).executeTakeFirstOrThrow();
  const holds = await db.selectFrom('creditHolds').select(['amount', 'status']).where('accountId', '=', accountId).execute();
  const tasks = await db.selectFrom('videoTasks').select('id').where('accountId', '=', accountId).execute();
  return { balance: account.balance, creditsUsed: key.creditsUsed, holds, tasks: tasks.length };
}

/** Polls the image task row until `predicate` holds (5 s). */
export async function waitImageTask(db: Kysely<DB>, id: string, predicate: (row: { status: string }) => boolean) {
  for (let i = 0; i < 100; i++) {
    const row = await db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    if (predicate(row)) return row;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`image task ${id} never reached the expected state`);
}

/** Polls GET /v1/videos/{id} until completed or failed; returns the task and every status seen. */
export async function waitVideoFinished(server: TestServer, key: string, id: string, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  const seen = new Set<string>();
  for (;;) {
    const { data } = await server.client(key).GET('/v1/videos/{id}', { params: { path: { id } } });
    seen.add(data!.status);
    if (data!.status === 'completed' || data!.status === 'failed') return { task: data!, seen };
    if (Date.now() > deadline) throw new Error(`task ${id} still ${data!.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
