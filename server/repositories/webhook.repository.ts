/**
 * Webhook secrets, the delivery outbox and its attempts (see the webhooks migration). Deliveries
 * are leased rows: the shared LeasedTasks helper claims and reschedules them; the writes here that
 * end an attempt are fenced by the claimed attempt like every other leased write.
 */
import { sql, type Kysely, type Selectable } from 'kysely';
import type { DB, WebhookAttempts, WebhookDeliveries, WebhookSecrets } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { LeasedTasks, type Fence } from './leased-tasks.ts';

export type WebhookDeliveryRow = Selectable<WebhookDeliveries>;
export type WebhookAttemptRow = Selectable<WebhookAttempts>;
export type WebhookSecretRow = Selectable<WebhookSecrets>;
export type WebhookEventType = 'video.completed' | 'video.failed';

/** A webhook delivery as the outbox prepares it; the task's finishing statement inserts it (VideoTaskRepository.finish). */
export interface VideoDelivery {
  id: string;
  eventType: WebhookEventType;
  /** The frozen body. */
  payload: string;
}
/** pending: to be sent (again); delivered: a 2xx; gone: the receiver answered 410; failed: the schedule ran out. */
export type WebhookDeliveryStatus = 'pending' | 'delivered' | 'gone' | 'failed';

/**
 * The longest error text a delivery keeps (an attempt's `error`, the delivery's `last_error`): the
 * admin views' limit (AdminWebhookDelivery), which a longer text would fail with a 500.
 */
export const MAX_ERROR_LENGTH = 1000;

/** `error` cut to MAX_ERROR_LENGTH: as it is recorded, and as it is shown (rows an older version recorded longer). */
export const capped = (error: string | null): string | null => (error !== null && error.length > MAX_ERROR_LENGTH ? `${error.slice(0, MAX_ERROR_LENGTH - 1)}…` : error);

export interface AttemptRecord {
  statusCode: number | null;
  errorClass: string | null;
  error: string | null;
  latencyMs: number;
  nextRetryAt: Date | null;
}

export class WebhookRepository {
  readonly leases: LeasedTasks<'webhookDeliveries'>;

  constructor(private readonly db: Kysely<DB>) {
    // A failed attempt counts itself toward `retries` as it is recorded (recordAttempt): the
    // runner's hand-back after it (`later`) keeps the count.
    this.leases = new LeasedTasks(db, { table: 'webhookDeliveries', sqlTable: 'webhook_deliveries', active: ['pending'], stepsCountRetries: true });
  }

  // --- secrets

  findSecret(accountId: string): Promise<WebhookSecretRow | undefined> {
    return this.db.selectFrom('webhookSecrets').selectAll().where('accountId', '=', accountId).executeTakeFirst();
  }

  /** Stores a first secret unless one exists; returns the account's secret either way. */
  async createSecret(accountId: string, ciphertext: Buffer): Promise<WebhookSecretRow> {
    await this.db.insertInto('webhookSecrets').values({ accountId, secretCiphertext: ciphertext }).onConflict((oc) => oc.column('accountId').doNothing()).execute();
    return this.db.selectFrom('webhookSecrets').selectAll().where('accountId', '=', accountId).executeTakeFirstOrThrow();
  }

  /** Makes `ciphertext` the current secret; the old one keeps signing for `overlapSeconds`. */
  async rotateSecret(accountId: string, ciphertext: Buffer, overlapSeconds: number): Promise<WebhookSecretRow> {
    return this.db
      .insertInto('webhookSecrets')
      .values({ accountId, secretCiphertext: ciphertext })
      .onConflict((oc) =>
        oc.column('accountId').doUpdateSet({
          previousCiphertext: sql`webhook_secrets.secret_ciphertext`,
          previousExpiresAt: sql`now() + ${overlapSeconds} * interval '1 second'`,
          secretCiphertext: ciphertext,
          rotatedAt: sql`now()`,
        }),
      )
      .returningAll()
      .executeTakeFirstOrThrow();
  }

  // --- deliveries

  /** The outbox write, inside the transaction that finished the task. */
  find(id: string): Promise<WebhookDeliveryRow | undefined> {
    return this.db.selectFrom('webhookDeliveries').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findForTask(taskId: string): Promise<WebhookDeliveryRow | undefined> {
    return this.db.selectFrom('webhookDeliveries').selectAll().where('taskId', '=', taskId).executeTakeFirst();
  }

  attemptsOf(deliveryId: string): Promise<WebhookAttemptRow[]> {
    return this.db.selectFrom('webhookAttempts').selectAll().where('deliveryId', '=', deliveryId).orderBy('id').execute();
  }

  /**
   * Records an attempt and, when it ended the delivery (`final`), its final status; inside one
   * transaction, fenced, so a worker that lost its lease records nothing. False: the fence no longer holds.
   * An attempt to be retried counts itself in `retries` and moves the row's next run to its
   * `nextRetryAt` here, with its record (the engine's reschedule only releases the lease after it,
   * keeping the count: `stepsCountRetries`): a worker that dies before that reschedule, or a reschedule that fails,
   * leaves the row due then, not at its lease's end, and its next attempt on the next delay of the schedule.
   */
  async recordAttempt(fence: Fence, attempt: AttemptRecord, final: { status: Exclude<WebhookDeliveryStatus, 'pending'> } | undefined, trx: Executor): Promise<boolean> {
    const error = capped(attempt.error);
    const updated = await this.leases.update(
      fence,
      {
        lastStatusCode: attempt.statusCode,
        lastError: error,
        updatedAt: sql`now()`,
        ...(attempt.nextRetryAt && { nextRunAt: attempt.nextRetryAt, retries: sql`retries + 1` }),
        ...(final && { status: final.status, leaseOwner: null, leaseExpiresAt: null, ...(final.status === 'delivered' && { deliveredAt: sql`now()` }) }),
      },
      trx,
    );
    if (!updated) return false;
    await trx.insertInto('webhookAttempts').values({ deliveryId: fence.id, ...attempt, error }).execute();
    return true;
  }

  /** Gives up a delivery the engine could not run (not an attempt: nothing was sent). */
  async markFailed(fence: Fence, error: string): Promise<boolean> {
    return (await this.leases.update(fence, { status: 'failed', lastError: capped(error), leaseOwner: null, leaseExpiresAt: null, updatedAt: sql`now()` }, this.db)) !== undefined;
  }

  /**
   * Records a try that sent nothing (the delivery could not be made ready to send) as recordAttempt
   * records an attempt, fenced and in one statement, but with no attempt row: its `error` as the
   * delivery's last error, and its next retry counted in `retries` (or, `nextRetryAt` null: the
   * schedule ran out, `failed`). The table has no `last_error_at` for the engine's reschedule to
   * write (`recordsErrors`), hence this write of its own. False: the fence no longer holds.
   */
  async recordUnsent(fence: Fence, error: string, nextRetryAt: Date | null): Promise<boolean> {
    const updated = await this.leases.update(
      fence,
      {
        lastStatusCode: null,
        lastError: capped(error),
        updatedAt: sql`now()`,
        ...(nextRetryAt ? { nextRunAt: nextRetryAt, retries: sql`retries + 1` } : { status: 'failed', leaseOwner: null, leaseExpiresAt: null }),
      },
      this.db,
    );
    return updated !== undefined;
  }

  /**
   * Sends a delivery again now (an operator's redelivery), with the same id and body: a finished one
   * becomes pending with a fresh retry schedule, and what its last run ended with (`delivered_at`,
   * `last_error`, `last_status_code`) is cleared, so that the row tells the new run's outcome and
   * is listed by it (its attempts keep the history); a pending one waiting for its next retry
   * becomes due at once, its run and last error kept. One being sent right now (leased) is left to
   * its worker. Wakes every instance's workers (the notification is sent when the transaction
   * commits). Undefined: the task has no delivery, or it is being sent.
   */
  async redeliver(taskId: string, trx: Executor): Promise<WebhookDeliveryRow | undefined> {
    const row = await trx
      .updateTable('webhookDeliveries')
      .set({
        status: 'pending',
        nextRunAt: sql`now()`,
        retries: sql`case when status = 'pending' then retries else 0 end`,
        lastError: sql`case when status = 'pending' then last_error end`,
        lastStatusCode: sql`case when status = 'pending' then last_status_code end`,
        // A pending row is not delivered: one redelivered before this was cleared may still say so.
        deliveredAt: null,
        leaseOwner: null,
        leaseExpiresAt: null,
        updatedAt: sql`now()`,
      })
      .where('taskId', '=', taskId)
      .where((eb) => eb.or([eb('status', '!=', 'pending'), eb('leaseOwner', 'is', null), eb('leaseExpiresAt', '<', sql<Date>`now()`)]))
      .returningAll()
      .executeTakeFirst();
    if (row) await sql`select pg_notify('mediagate_tasks', 'webhook')`.execute(trx);
    return row;
  }
}

