/**
 * All Kysely code for video tasks. Leasing (claim, heartbeat, reschedule, fenced updates) is the
 * shared LeasedTasks helper; the terminal transition (`finish`) is one statement that also settles
 * the hold and queues the webhook.
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, VideoTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { columnsOf, fieldList, runPrepared } from '../db/prepared.ts';
import { afterExists, pageConditions, pageOrder, type AccountPage } from './account-pages.ts';
import { LeasedTasks, type Fence, type HoldSettlement } from './leased-tasks.ts';
import type { VideoDelivery } from './webhook.repository.ts';

export type VideoTaskRow = Selectable<VideoTasks>;

/** A task as its lookups show it: with when its video is deleted (null: no stored video). */
export type LookedUpVideoTaskRow = VideoTaskRow & { mediaExpiresAt: Date | null };

/**
 * What a poll reads of a task, and so all its lookup shape may read (services/video/video-mappers.ts,
 * `toVideoTask` takes these fields): the shape's fields, its owner and its stored video. A whole row is 45 columns, and
 * node-postgres spends per column of every result (its parsers, the row object); the poll is the
 * request a client repeats most.
 */
const POLLED_FIELDS = [
  'id', 'accountId', 'status', 'model', 'durationSeconds', 'aspectRatio', 'resolution', 'generateAudio', 'billingKind', 'billingMode',
  'unitPrice', 'quotedCredits', 'actualCredits', 'inputMode', 'inputFileIds', 'referenceVideos', 'referenceAudios', 'createdAt',
  'completedAt', 'outputFileId', 'errorCode', 'errorMessage',
] as const satisfies readonly (keyof VideoTaskRow)[];

export type PolledVideoTaskRow = Pick<VideoTaskRow, (typeof POLLED_FIELDS)[number]> & { mediaExpiresAt: Date | null };

const POLLED_COLUMNS = fieldList(POLLED_FIELDS);

const mediaExpiresAt = sql<Date | null>`(select f.expires_at from files f where f.id = video_tasks.output_file_id)`.as('mediaExpiresAt');

/** Statuses of a video task still being worked on. */
export const ACTIVE_VIDEO_STATUSES = ['queued', 'in_progress'] as const;

/** What finishing a video task writes (VideoTaskRepository.finish). */
export interface FinishedFields {
  status: 'completed' | 'failed';
  outputFileId: string | null;
  actualCredits: number;
  errorCode: string | null;
  errorMessage: string | null;
  completedAt: Date;
}

/** A member took the job (its id is known: setUpstreamJob): the task runs from here, `queued` until then. */
const STARTED = { status: 'in_progress', startedAt: sql<Date>`coalesce(started_at, now())` } as const;

export class VideoTaskRepository {
  readonly leases: LeasedTasks<'videoTasks'>;

  constructor(private readonly db: Kysely<DB>) {
    this.leases = new LeasedTasks(db, {
      table: 'videoTasks',
      sqlTable: 'video_tasks',
      active: ACTIVE_VIDEO_STATUSES,
      recordsErrors: true,
    });
  }

  /** The poll's one statement (GET /v1/videos/{id}): a named prepared statement, its columns listed (db/prepared.ts). */
  async findForAccount(id: string, accountId: string): Promise<PolledVideoTaskRow | undefined> {
    const [row] = await runPrepared(
      sql<PolledVideoTaskRow>`select ${POLLED_COLUMNS}, (select f.expires_at from files f where f.id = video_tasks.output_file_id) as media_expires_at from video_tasks where id = ${id} and account_id = ${accountId}`,
      this.db,
    );
    return row;
  }

  /** One keyset page (`page.limit` rows) of the account's tasks, optionally of some statuses and one model. */
  listForAccount(page: AccountPage, filter: { status?: readonly string[]; model?: string }): Promise<LookedUpVideoTaskRow[]> {
    let query = this.db.selectFrom('videoTasks').selectAll('videoTasks').select(mediaExpiresAt).where(pageConditions('video_tasks', page));
    if (filter.status) query = query.where('status', 'in', filter.status);
    if (filter.model !== undefined) query = query.where('model', '=', filter.model);
    return query.orderBy(pageOrder('video_tasks', page)).limit(page.limit).execute();
  }

  /** Whether `id` is a task of the account (an `after` that matched nothing). */
  isAccountTask(id: string, accountId: string): Promise<boolean> {
    return afterExists(this.db, 'video_tasks', id, accountId);
  }

  find(id: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findByClientRequestId(accountId: string, clientRequestId: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('accountId', '=', accountId).where('clientRequestId', '=', clientRequestId).executeTakeFirst();
  }

  /**
   * Names the member about to receive the job (its slot, from now to a terminal state) and marks the
   * submit as started. The task stays `queued` until the upstream answers with its job
   * (`setUpstreamJob`): a submit refused or unreachable (`clearSubmitting`), all members full or
   * cooling down, leave it `queued` however often it is claimed, never `in_progress` with nothing
   * running anywhere.
   */
  async markSubmitting(fence: Fence, memberId: string, trx: Executor): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, submitStartedAt: sql`now()`, unansweredSubmits: 1 }, trx)) !== undefined;
  }

  /**
   * Counts one more submit about to be sent without an answer yet (a resubmit: `unanswered_submits`,
   * its migration says why), before it is sent: a process that dies while it is on its way leaves it
   * counted.
   */
  async countResubmit(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { unansweredSubmits: sql`unanswered_submits + 1` }, this.db)) !== undefined;
  }

  /** A resubmit's answer came and said the job was not taken: it started nothing upstream. */
  async uncountResubmit(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { unansweredSubmits: sql`greatest(unanswered_submits - 1, 0)` }, this.db)) !== undefined;
  }

  /**
   * The submit failed with an answer (the upstream did not take the job): the member's slot is free
   * again. Never after a submit that may have been accepted there (the resubmit keeps the mark while
   * the member exists: VideoRunner.resubmit), or the next attempt would route to another member.
   */
  async clearSubmitting(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { memberId: null, submitStartedAt: null, unansweredSubmits: 0 }, this.db)) !== undefined;
  }

  /** Saves the upstream job id before any polling (the commit point), so a retried step resumes instead of resubmitting. */
  async setUpstreamJob(fence: Fence, memberId: string, upstreamJobId: string): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, upstreamJobId, ...STARTED }, this.db)) !== undefined;
  }

  /**
   * Records that the upstream job is done and where its output is, so the task is never polled
   * again. False when the fence no longer holds.
   */
  async recordUpstreamOutput(fence: Fence, output: Readonly<Record<string, string>>): Promise<boolean> {
    return (await this.leases.update(fence, { upstreamOutput: JSON.stringify(output), upstreamDoneAt: sql`now()` }, this.db)) !== undefined;
  }

  /**
   * Deletes the rows of the output files an earlier attempt stored and never published, in one
   * statement that holds only while the fence does and the task is unfinished: a file stored by a
   * worker that has since claimed the task is never seen by it (that claim came first). Returns the
   * deleted files' storage keys, or undefined when the fence no longer holds.
   */
  async deleteUnpublishedOutputs(fence: Fence): Promise<string[] | undefined> {
    const { rows } = await sql<{ owned: boolean; keys: string[] }>`
      with t as (select id from video_tasks where id = ${fence.id} and attempt = ${fence.attempt} and status in ('queued', 'in_progress')),
      d as (delete from files f using t where f.task_id = t.id and f.purpose = 'video_output' returning f.storage_key)
      select exists (select 1 from t) as owned, coalesce(array_agg(d.storage_key), '{}') as keys from d`.execute(this.db);
    return rows[0]!.owned ? rows[0]!.keys : undefined;
  }

  /** Counts a failed download of the finished job (its own retry budget). False when the fence no longer holds. */
  async countDownloadFailure(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { downloadRetries: sql`download_retries + 1` }, this.db)) !== undefined;
  }

  /**
   * Moves the task (while the fence holds) to its terminal state `end` in one statement, together
   * with the settlement of its hold and, when it has one, the delivery of its webhook (the outbox);
   * see LeasedTasks.finish. Returns the finished row, or undefined when the fence no longer holds.
   */
  finish(fence: Fence, end: FinishedFields, settle: HoldSettlement, delivery: VideoDelivery | undefined): Promise<VideoTaskRow | undefined> {
    return this.leases.finish(fence, {
      set: sql`status = ${end.status}, output_file_id = ${end.outputFileId}, actual_credits = ${end.actualCredits},
               error_code = ${end.errorCode}, error_message = ${end.errorMessage}, completed_at = ${end.completedAt}`,
      settle,
      also:
        delivery === undefined
          ? []
          : [
              sql`w as (
                insert into webhook_deliveries (id, account_id, task_id, event_type, url, payload)
                select ${delivery.id}, t.account_id, t.id, ${delivery.eventType}, t.callback_url, ${delivery.payload}
                from t where t.callback_url is not null
                on conflict (task_id) do nothing
              )`,
            ],
    });
  }
}
