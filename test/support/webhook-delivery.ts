/**
 * A finished (failed) video task with a pending `video.failed` delivery of its webhook to `url`,
 * inserted directly: what the webhook repository and runner tests start from.
 */
import { randomUUID } from 'node:crypto';
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { newId } from '../../server/lib/ids.ts';
import { createCustomer } from './factories.ts';

/** The delivery's id; of a new customer's account unless `customer` names one. */
export async function insertPendingDelivery(db: Kysely<DB>, url: string, customer?: { accountId: string; apiKeyId: string; groupId: string }): Promise<string> {
  const c = customer ?? (await createCustomer(db));
  const taskId = newId('vid');
  await db
    .insertInto('videoTasks')
    .values({
      id: taskId,
      accountId: c.accountId,
      apiKeyId: c.apiKeyId,
      groupId: c.groupId,
      clientRequestId: randomUUID(),
      model: 'local-video-1',
      prompt: 'a lighthouse',
      durationSeconds: 4,
      aspectRatio: '16:9',
      resolution: '720p',
      generateAudio: false,
      inputMode: 'text',
      deadlineAt: new Date(Date.now() + 3600_000),
      status: 'failed',
      completedAt: new Date(),
      errorMessage: 'The upstream rejected the prompt.',
    })
    .execute();
  const id = newId('msg');
  await db.insertInto('webhookDeliveries').values({ id, accountId: c.accountId, taskId, eventType: 'video.failed', url, payload: '{}' }).execute();
  return id;
}
