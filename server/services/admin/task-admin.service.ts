/**
 * Admin: every task (image and video) in one listing with filters, one task with its whole story
 * (quote, hold, ledger entries, upstream attempts, webhook, stored outputs with download URLs), and
 * the operator's settlement of needs_attention image tasks.
 */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, notFound } from '../../errors.ts';
import { toCredits } from '../../lib/money.ts';
import type { FileRepository, FileRow } from '../../repositories/file.repository.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../../repositories/image-task.repository.ts';
import type { OperatorListsRepository, TaskFilter, TaskSummaryRow } from '../../repositories/operator-lists.repository.ts';
import type { TaskAttemptRepository } from '../../repositories/task-attempt.repository.ts';
import type { VideoTaskRepository, VideoTaskRow } from '../../repositories/video-task.repository.ts';
import { linkFailure } from '../../storage/storage-error.ts';
import type { Settlement } from '../tasks/settlement.ts';
import { toAdminLedgerEntry } from './admin-mappers.ts';
import { decodeCreatedAtCursor, encodeCreatedAtCursor, pageSize } from './cursor.ts';
import type { WebhookAdminService } from './webhook-admin.service.ts';

type AdminTask = components['schemas']['AdminTask'];
type AdminTaskSummary = components['schemas']['AdminTaskSummary'];
type AdminTaskList = components['schemas']['AdminTaskList'];
type AdminTaskQuote = components['schemas']['AdminTaskQuote'];
type AdminTaskAttempt = components['schemas']['AdminTaskAttempt'];
type AdminProvider = components['schemas']['AdminProvider'];
type AdminTaskOutput = components['schemas']['AdminTaskOutput'];

/**
 * A fresh download URL of an output file: the runtime's `FileService.downloadUrl` (a Mediagate
 * signed URL, or a presigned store URL with MEDIA_URLS=presigned), as the client's lookup gets.
 */
export type OutputUrl = (fileId: string, purpose: 'image_output' | 'video_output') => Promise<string>;

/** GET /admin/v1/tasks query (validated by the contract). */
export interface TaskListQuery {
  limit?: number;
  cursor?: string;
  kind?: 'image' | 'video';
  status?: string[];
  account_id?: string;
  api_key_id?: string;
  model?: string;
  member_id?: string;
  provider?: string;
  created_after?: string;
  created_before?: string;
}

export interface TaskAdminDeps {
  imageTasks: ImageTaskRepository;
  videoTasks: VideoTaskRepository;
  lists: OperatorListsRepository;
  attempts: TaskAttemptRepository;
  webhooks: WebhookAdminService;
  settlement: Settlement | undefined;
  files: FileRepository;
  /** Signs the URLs of `outputs`; without it (a caller with no media store) a task with outputs cannot be shown. */
  outputUrl: OutputUrl | undefined;
  /** TASK_MAX_LIFETIME_SECONDS: an image task's deadline (video tasks carry theirs). */
  taskMaxLifetimeSeconds: number;
}

export class TaskAdminService {
  constructor(private readonly deps: TaskAdminDeps) {}

  /** One page of tasks of every account, newest first. */
  async list(query: TaskListQuery): Promise<AdminTaskList> {
    const size = pageSize(query.limit);
    const after = query.cursor !== undefined ? decodeCreatedAtCursor('tasks', query.cursor) : undefined;
    const filter: TaskFilter = {
      ...(query.kind !== undefined && { kind: query.kind }),
      ...(query.status !== undefined && { statuses: query.status }),
      ...(query.account_id !== undefined && { accountId: query.account_id }),
      ...(query.api_key_id !== undefined && { apiKeyId: query.api_key_id }),
      ...(query.model !== undefined && { model: query.model }),
      ...(query.member_id !== undefined && { memberId: query.member_id }),
      ...(query.provider !== undefined && { provider: query.provider }),
      ...(query.created_after !== undefined && { createdAfter: query.created_after }),
      ...(query.created_before !== undefined && { createdBefore: query.created_before }),
    };
    const rows = await this.deps.lists.tasks(filter, size + 1, after);
    const page = rows.slice(0, size);
    const last = page.at(-1);
    return {
      data: page.map(toSummary),
      next_cursor: rows.length > size && last ? encodeCreatedAtCursor('tasks', { createdAtMicros: last.createdAtMicros, id: last.id }) : null,
    };
  }

  async get(id: string): Promise<AdminTask> {
    const image = id.startsWith('img_') ? await this.deps.imageTasks.find(id) : undefined;
    if (image) return this.story('image', image);
    const video = id.startsWith('vid_') ? await this.deps.videoTasks.find(id) : undefined;
    if (video) return this.story('video', video);
    throw notFound('task_not_found', `No task '${id}'.`);
  }

  /** Operator settlement of a needs_attention image task (see Settlement.settleImageByOperator). */
  async settleImageTask(id: string, outcome: 'completed' | 'refunded', reason: string): Promise<AdminTask> {
    const row = await this.deps.imageTasks.find(id);
    if (!row) {
      // A video task exists but is never settled by hand (its engine settles it): 409, as the contract says.
      if (id.startsWith('vid_') && (await this.deps.videoTasks.find(id))) throw new ApiError(409, 'task_not_settleable', `Task '${id}' is a video task; only a needs_attention image task can be settled.`);
      throw notFound('task_not_found', `No task '${id}'.`);
    }
    if (!this.deps.settlement) throw new Error('settling a task needs the server runtime');
    const notSettleable = (status: string) => new ApiError(409, 'task_not_settleable', `Task '${id}' is ${status}; only a needs_attention image task can be settled.`);
    if (row.status !== 'needs_attention') throw notSettleable(row.status);
    // The answer's links are made before the settlement (it does not change the task's files): a
    // store that cannot make them fails the request (503 storage_unavailable) with nothing settled,
    // for the operator to retry, instead of a settlement done behind an error answer.
    const outputs = await this.outputs(await this.deps.files.findMany(row.resultFileIds));
    // Conditional on needs_attention still: a concurrent settle gets the 409.
    const settled = await this.deps.settlement.settleImageByOperator(row, outcome, reason);
    if (!settled) throw notSettleable('no longer needs_attention (it was settled meanwhile)');
    return this.story('image', settled, outputs);
  }

  /** The task with everything recorded about it (a handful of indexed reads); `outputs` when they are made already. */
  private async story(kind: 'image' | 'video', row: ImageTaskRow | VideoTaskRow, outputs?: AdminTaskOutput[]): Promise<AdminTask> {
    const outputIds = outputs ? [] : kind === 'video' ? [(row as VideoTaskRow).outputFileId].filter((id): id is string => id !== null) : (row as ImageTaskRow).resultFileIds;
    const [hold, ledger, attempts, provider, webhook, outputFiles] = await Promise.all([
      this.deps.lists.holdOfTask(row.id),
      this.deps.lists.ledgerOfTask(row.id),
      this.deps.attempts.forTask(row.id),
      row.memberId ? this.deps.lists.providerOf(row.memberId) : Promise.resolve(undefined),
      kind === 'video' ? this.deps.webhooks.deliveryOf(row.id) : Promise.resolve(null),
      this.deps.files.findMany(outputIds),
    ]);
    const summary = toSummary({
      ...row,
      kind,
      upstreamJobId: 'upstreamJobId' in row ? row.upstreamJobId : imageJobIdOf(row.upstreamJob),
      provider: provider ?? null,
      createdAtMicros: 0,
      holdAmount: hold?.amount ?? null,
      holdStatus: hold?.status ?? null,
      holdCaptured: hold?.captured ?? null,
    });
    const unfinished = row.status === 'queued' || row.status === 'in_progress' || row.status === 'processing';
    const deadline = kind === 'video' ? (row as VideoTaskRow).deadlineAt : new Date(row.createdAt.getTime() + this.deps.taskMaxLifetimeSeconds * 1000);
    return {
      ...summary,
      deadline_at: unfinished ? deadline.toISOString() : null,
      settled_reason: 'settledReason' in row ? row.settledReason : null,
      delivered_credits: kind === 'image' ? toCredits((row as ImageTaskRow).delivered * (row as ImageTaskRow).unitPrice) : null,
      quote: kind === 'video' ? videoQuote(row as VideoTaskRow) : imageQuote(row as ImageTaskRow),
      hold: hold
        ? {
            id: hold.id,
            status: hold.status as 'held' | 'captured' | 'released',
            amount: toCredits(hold.amount),
            captured: toCredits(hold.captured),
            released: toCredits(hold.status === 'held' ? 0 : hold.amount - hold.captured),
            created_at: hold.createdAt.toISOString(),
            settled_at: hold.settledAt ? hold.settledAt.toISOString() : null,
          }
        : null,
      ledger: ledger.map(toAdminLedgerEntry),
      attempts: attempts.map(
        (a): AdminTaskAttempt => ({
          step: a.step as AdminTaskAttempt['step'],
          member_id: a.memberId,
          provider: a.provider as AdminProvider | null,
          upstream_job_id: a.upstreamJobId,
          outcome: a.outcome,
          error: a.error,
          started_at: a.startedAt.toISOString(),
          duration_ms: a.durationMs,
        }),
      ),
      webhook,
      outputs: outputs ?? (await this.outputs(outputFiles)),
    };
  }

  /**
   * The outputs still stored, in the task's order, each with a fresh URL. A file past its
   * `expires_at` is left out as the client's lookup leaves it out (the media sweeper removes it
   * within a minute); one the account deleted has no row any more. A link the store cannot make
   * (a presigned URL whose credentials fail to load) is the store's failure, 503 storage_unavailable
   * as the client's image answers say it (ImageRunner), not a 500 of unknown cause.
   */
  private async outputs(files: readonly FileRow[]): Promise<AdminTaskOutput[]> {
    const now = Date.now();
    const kept = files.filter((f) => (f.purpose === 'image_output' || f.purpose === 'video_output') && !(f.expiresAt && f.expiresAt.getTime() <= now));
    if (kept.length === 0) return [];
    const sign = this.deps.outputUrl;
    if (!sign) throw new Error('showing the outputs of a task needs a media store to sign their URLs');
    return Promise.all(
      kept.map(
        async (f): Promise<AdminTaskOutput> => ({
          file_id: f.id,
          url: await sign(f.id, f.purpose as 'image_output' | 'video_output').catch((err: unknown) => {
            throw linkFailure(err, f.storageKey);
          }),
          content_type: f.contentType,
          bytes: f.bytes,
          width: f.width,
          height: f.height,
          expires_at: f.expiresAt ? f.expiresAt.toISOString() : null,
        }),
      ),
    );
  }
}

/** The id of the upstream job a background image task recorded (ImageEvents.submitted): a queue's id, or a Replicate prediction's. */
function imageJobIdOf(ref: unknown): string | null {
  const id = typeof ref === 'string' ? ref : (ref as { id?: unknown } | null)?.id;
  return typeof id === 'string' ? id.slice(0, 512) : null;
}

function toSummary(row: TaskSummaryRow): AdminTaskSummary {
  const held = row.holdAmount ?? 0;
  const captured = row.holdStatus === 'captured' ? (row.holdCaptured ?? 0) : 0;
  const released = row.holdStatus !== null && row.holdStatus !== 'held' ? held - captured : 0;
  const failing = row.status === 'failed' || row.status === 'needs_attention';
  return {
    id: row.id,
    kind: row.kind,
    status: row.status as AdminTaskSummary['status'],
    account_id: row.accountId,
    api_key_id: row.apiKeyId,
    model: row.model,
    member_id: row.memberId,
    provider: row.provider as AdminProvider | null,
    attempt: row.attempt,
    upstream_job_id: row.upstreamJobId,
    error: failing && row.errorMessage ? { code: row.errorCode, message: row.errorMessage } : null,
    last_error: row.lastError && row.lastErrorAt ? { message: row.lastError, at: row.lastErrorAt.toISOString() } : null,
    held_credits: toCredits(held),
    captured_credits: toCredits(captured),
    released_credits: toCredits(released),
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
    completed_at: row.completedAt ? row.completedAt.toISOString() : null,
  };
}

const credits = (micro: number | null) => (micro === null ? null : toCredits(micro));

function videoQuote(row: VideoTaskRow): AdminTaskQuote {
  const legacy = row.billingKind === 'legacy';
  const mode = legacy ? null : (row.billingMode as 'per_second' | 'per_item' | null);
  return {
    billing_kind: legacy ? 'legacy' : 'snapshot',
    mode,
    unit_price: legacy ? null : credits(row.unitPrice),
    units: mode === 'per_item' ? 1 : row.durationSeconds,
    quoted_credits: legacy ? null : credits(row.quotedCredits),
    actual_credits: toCredits(row.actualCredits),
  };
}

function imageQuote(row: ImageTaskRow): AdminTaskQuote {
  return {
    billing_kind: 'snapshot',
    mode: 'per_item',
    unit_price: toCredits(row.unitPrice),
    units: row.n,
    quoted_credits: toCredits(row.quotedCredits),
    actual_credits: toCredits(row.actualCredits),
  };
}
