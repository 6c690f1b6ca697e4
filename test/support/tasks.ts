/**
 * Task helpers several test files share: a task's credit hold, an account's credit state,
 * waiting for a task (through the API or in the database) to reach a state, and `until`.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { TestServer } from './http-harness.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';
import { createAccount, createApiKey, createGroup, createMember } from './factories.ts';

/** The hold of a task: amount, status and captured micro-credits. */
export function holdOf(db: Kysely<DB>, taskId: string) {
  return db.selectFrom('creditHolds').select(['amount', 'status', 'captured']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
}

/** Balance, key usage, holds and video task count of an account and one of its keys. */
export async function accountState(db: Kysely<DB>, accountId: string, apiKeyId: string) {
  const account = await db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
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

/**
 * Polls `what` until it returns a value other than undefined or false, and returns it; throws
 * naming `description` after `timeoutMs`.
 */
export async function until<T>(what: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 15_000, description = 'the condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await what();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${description}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Waits until every video task of `ids` is completed or failed (in the database); returns their rows. */
export async function waitVideoTasksFinished(db: Kysely<DB>, ids: string[], timeoutMs: number) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rows = await db.selectFrom('videoTasks').select(['id', 'status', 'attempt', 'upstreamJobId']).where('id', 'in', ids).execute();
    if (rows.every((r) => r.status === 'completed' || r.status === 'failed')) return rows;
    if (Date.now() > deadline) throw new Error(`${rows.filter((r) => r.status !== 'completed' && r.status !== 'failed').length} of ${ids.length} tasks unfinished`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A key of a new account (100 credits) whose group has two members, `a` and `b`, serving `local-video-1`. */
export async function twoMemberVideoKey(db: Kysely<DB>) {
  const account = await createAccount(db, { balance: 100 });
  const group = await createGroup(db);
  for (const name of ['a', 'b']) await createMember(db, group.id, { name, models: ['local-video-1'] });
  return createApiKey(db, { accountId: account.id, groupId: group.id });
}

/** Creates a 2 s `local-video-1` task with `prompt` (which scripted stand-in providers read); its id. */
export async function createLocalVideo(server: TestServer, key: string, prompt: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `${prompt}-${Date.now()}-${Math.random()}`, prompt, model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
  });
  if (res.status !== 202) throw new Error(`creating a video answered ${res.status}: ${await res.text()}`);
  return ((await res.json()) as { id: string }).id;
}
