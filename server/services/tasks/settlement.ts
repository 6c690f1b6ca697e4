/**
 * Settlement: the one place where tasks reach their terminal states and their credit holds are
 * settled (design §5, §6). Each transition is ONE statement (LeasedTasks.finish): the fenced task
 * update first, then the hold (ledger.repository.ts documents the lock order: task → hold → key →
 * account), so a worker whose lease was taken over changes nothing, a hold is captured or released
 * exactly once together with the state its task ends in, and one account's row stays locked only
 * while the statement runs (thousands of tasks a minute on one account do not queue behind each
 * other's commits). Only the operator's settlement of a needs_attention task is a transaction.
 *
 *   video  completed        capture the quote            (completeVideo)
 *          failed           release everything           (failVideo)
 *          (both)           queue the callback_url webhook in the same statement (the outbox)
 *   image  completed        capture delivered × price    (completeImage)
 *          failed           release everything           (failImage)
 *          needs_attention  keep the hold for an operator (imageNeedsAttention)
 *          stream cut       failed and released when no image was recorded, else needs_attention
 *                           (imageStreamInterrupted)
 *          operator settle  capture all, or the delivered (settleImageByOperator)
 */
import { sql, type Transaction } from 'kysely';
import type { DB } from '../../../generated/db.d.ts';
import type { Transactor } from '../../db/transaction.ts';
import type { Logger } from '../../logger.ts';
import type { FileRow } from '../../repositories/file.repository.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../../repositories/image-task.repository.ts';
import { fenceOf, type Fence } from '../../repositories/leased-tasks.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { AttemptRecord } from '../../repositories/task-attempt.repository.ts';
import type { FinishedFields, VideoTaskRepository, VideoTaskRow } from '../../repositories/video-task.repository.ts';
import type { WebhookOutbox } from '../webhooks/webhook-outbox.ts';

export interface SettlementDeps {
  tx: Transactor;
  ledger: LedgerRepository;
  videoTasks: VideoTaskRepository;
  imageTasks: ImageTaskRepository;
  outbox: WebhookOutbox;
  log: Logger;
}

export class Settlement {
  constructor(private readonly deps: SettlementDeps) {}

  /** Completes a video task with its stored output and captures the quote. Undefined: the fence no longer holds. */
  async completeVideo(task: VideoTaskRow, output: Pick<FileRow, 'id' | 'expiresAt'>): Promise<VideoTaskRow | undefined> {
    const outputFileId = output.id;
    const row = await this.finishVideo(task, { status: 'completed', outputFileId, actualCredits: task.quotedCredits ?? 0, errorCode: null, errorMessage: null }, output.expiresAt);
    if (row) this.deps.log.info({ taskId: row.id, fileId: outputFileId, capturedMicroCredits: row.actualCredits }, 'video task completed');
    return row;
  }

  /** Fails a video task and releases its hold. */
  async failVideo(task: VideoTaskRow, code: string, message: string): Promise<VideoTaskRow | undefined> {
    const row = await this.finishVideo(task, { status: 'failed', outputFileId: null, actualCredits: 0, errorCode: code, errorMessage: message });
    if (row) this.deps.log.info({ taskId: row.id, code, message }, 'video task failed; credits released');
    return row;
  }

  /**
   * The task's terminal state, the settlement of its hold and its webhook in one statement
   * (VideoTaskRepository.finish). The webhook body is the row as that statement leaves it: the
   * claimed row with the fields the statement sets (billing fields never change after creation)
   * and the expiry of the stored video.
   */
  private finishVideo(task: VideoTaskRow, end: Omit<FinishedFields, 'completedAt'>, mediaExpiresAt: Date | null = null): Promise<VideoTaskRow | undefined> {
    const fields: FinishedFields = { ...end, completedAt: new Date() };
    const after = { ...task, ...fields, leaseOwner: null, leaseExpiresAt: null, mediaExpiresAt };
    return this.deps.videoTasks.finish(fenceOf(task), fields, (hold) => this.deps.ledger.settlement(hold, end.actualCredits), this.deps.outbox.deliveryFor(after));
  }

  /**
   * Completes an image task with the images it delivered (`unrecorded`: the rows of those files not
   * written yet); captures delivered × unit price, releases the rest. One statement, which also
   * records the task's calls upstream (`attempts`). Returns the micro-credits captured, or undefined
   * when the task was no longer this attempt's (taken over).
   */
  async completeImage(
    task: ImageTaskRow,
    /** `delivered`: images charged, when more than `files` (an answer carried an image whose stored copy failed). */
    result: { files: readonly FileRow[]; unrecorded: readonly FileRow[]; revisedPrompt: string | null; delivered?: number },
    attempts: readonly AttemptRecord[] = [],
  ): Promise<number | undefined> {
    const fileIds = result.files.map((f) => f.id);
    const delivered = Math.max(result.delivered ?? 0, fileIds.length);
    const capture = delivered * task.unitPrice;
    const completion = { fence: fenceOf(task), fileIds, actualCredits: capture, revisedPrompt: result.revisedPrompt, unrecorded: result.unrecorded, attempts, delivered };
    const settle = (hold: Parameters<LedgerRepository['settlement']>[0]) => this.deps.ledger.settlement(hold, capture);
    // Every image delivered and stored: the whole hold is captured, and completions arriving together share a statement.
    const done = await (capture > 0 && capture === task.quotedCredits && delivered === fileIds.length
      ? this.deps.imageTasks.completeWhole(completion, settle)
      : this.deps.imageTasks.complete(completion.fence, completion, settle, attempts));
    // A synchronous task's completion is on its request's line (http/images.handlers.ts).
    if (done && task.runAsync) this.deps.log.info({ taskId: task.id, delivered, n: task.n, capturedMicroCredits: capture }, 'image task completed');
    return done ? capture : undefined;
  }

  /** Fails an image task and releases its hold. One statement (with the task's `attempts`). */
  async failImage(fence: Fence, code: string, message: string, attempts: readonly AttemptRecord[] = []): Promise<ImageTaskRow | undefined> {
    const row = await this.deps.imageTasks.fail(fence, code, message, (hold) => this.deps.ledger.settlement(hold, 0), attempts);
    // As a completion: a synchronous task's failure is on its request's line (its status and, once it
    // settled, delivered 0) or on the line its caller writes when the request is gone.
    if (row?.runAsync) this.deps.log.info({ taskId: row.id, code }, 'image task failed; credits released');
    else if (row) this.deps.log.debug({ taskId: row.id, code }, 'image task failed; credits released');
    return row;
  }

  /**
   * The outcome is unknown (images produced but not stored): the hold stays until an operator
   * settles. `delivered`: how many of the stored `files` the client has received (a stream's; a
   * JSON answer and a background task hand out nothing before they complete), which a refund
   * still captures.
   */
  async imageNeedsAttention(
    fence: Fence,
    message: string,
    stored: { files: readonly FileRow[]; unrecorded: readonly FileRow[]; delivered: number },
    attempts: readonly AttemptRecord[] = [],
  ): Promise<ImageTaskRow | undefined> {
    const row = await this.deps.imageTasks.needsAttention(fence, message, { fileIds: stored.files.map((f) => f.id), unrecorded: stored.unrecorded, delivered: stored.delivered }, attempts);
    if (row) this.deps.log.error({ taskId: row.id, delivered: row.delivered }, 'image task needs attention: its credits stay held until an operator settles it');
    return row;
  }

  /**
   * A streamed synchronous image whose process stopped (ImageTaskRepository.interruptedStream, one
   * statement): with no image recorded (none was sent), failed and released; otherwise
   * needs_attention, its hold kept for an operator.
   */
  async imageStreamInterrupted(fence: Fence): Promise<ImageTaskRow | undefined> {
    const row = await this.deps.imageTasks.interruptedStream(
      fence,
      {
        kept: 'The request was interrupted while its images were being streamed; some may have been delivered, so an operator will settle this task.',
        released: 'The request was interrupted before any image was delivered; nothing was charged and the credits were released.',
      },
      (hold) => this.deps.ledger.settlement(hold, 0),
    );
    if (row?.status === 'failed') this.deps.log.warn({ taskId: row.id }, 'interrupted image stream delivered no image: failed and released');
    else if (row) this.deps.log.error({ taskId: row.id, recorded: row.delivered }, 'interrupted image stream: its credits stay held until an operator settles it');
    return row;
  }

  /**
   * An operator settles a needs_attention image task. `completed`: the whole hold is captured (the
   * operator confirms the outcome); `refunded`: only the images delivered before the failure are (a
   * client is charged for what it received; a goodwill refund beyond that is a `grant`). The reason
   * goes on the task and on the ledger's capture and release entries.
   */
  async settleImageByOperator(task: ImageTaskRow, outcome: 'completed' | 'refunded', reason: string): Promise<ImageTaskRow | undefined> {
    // What is captured is read from the row as the settling statement locks it, not from `task`.
    const row = await this.deps.tx.run(async (trx) => {
      const settled = await this.deps.imageTasks.settleByOperator(task.id, outcome, reason, trx);
      if (settled) await this.settleHold(trx, settled.id, settled.quotedCredits, settled.actualCredits, reason);
      return settled;
    });
    if (row) this.deps.log.info({ taskId: row.id, outcome, reason, capturedMicroCredits: row.actualCredits }, 'image task settled by operator');
    return row;
  }

  /** Settles the hold of a task that has one (quoted > 0); a hold that is missing or already settled is a bug: roll back. */
  private async settleHold(trx: Transaction<DB>, taskId: string, quoted: number, capture: number, reason?: string): Promise<void> {
    if (quoted === 0) return; // a free task has no hold
    if (!(await this.deps.ledger.settleForTask(taskId, capture, trx, reason))) throw new Error(`the hold of task ${taskId} is missing or was already settled`);
  }
}
