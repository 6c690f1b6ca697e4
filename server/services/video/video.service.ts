/**
 * Video capabilities, quotes, idempotent creation and lookup (product spec §2.5–§2.7, §4.6–§4.8).
 * Creation never waits for the video: it validates, places the credit hold and inserts the task
 * in one statement, and returns 202; the task engine does the rest.
 */
import type { Insertable } from 'kysely';
import type { components } from '../../../generated/api.d.ts';
import type { VideoTasks } from '../../../generated/db.d.ts';
import type { BillingMode } from '../../catalog/capabilities.ts';
import { accountSuspended, ApiError, apiKeyInactive, badRequest, conflict, inputFilesGone, notFound, paymentRequired, unavailable } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { ModelRepository, VideoCatalogRow } from '../../repositories/model.repository.ts';
import type { PolledVideoTaskRow, VideoTaskRepository, VideoTaskRow } from '../../repositories/video-task.repository.ts';
import type { ProviderRegistry } from '../../providers/registry.ts';
import { shapeOf } from '../../providers/types.ts';
import type { AuthContext, AuthService } from '../auth.service.ts';
import { inFlightCapsOf, inFlightRefusal } from '../limits/client-limits.ts';
import type { FileService } from '../file.service.ts';
import { newId } from '../../lib/ids.ts';
import type { QuoteTokens } from '../quote-token.ts';
import type { TaskNotifier } from '../tasks/task-notifier.ts';
import { toBillingRow, toCapability, toVideoTask, toVideoTaskCreated, quoteFor } from './video-mappers.ts';
import { checkAgainstModel, checkCallbackUrl, isCompositeModelId, mediaInputsOf, normalizeVideoRequest, requestFingerprint, withMediaIdentities, type NormalizedVideoRequest } from './video-request.ts';
import { accountPage, invalidAfter, listPage, type TaskListQuery } from '../account-lists.ts';
import type { InputStaging } from '../media/input-staging.ts';
import type { MediaInputs } from '../media/media-inputs.ts';

type Schemas = components['schemas'];

export interface VideoServiceOptions {
  maxMediaInputCount: number;
  maxMediaInputBytes: number;
  /** Callback and media URLs may point at private addresses (on-premises receivers). */
  allowPrivateTargets: boolean;
  /** A task older than this fails and is refunded. */
  maxLifetimeSeconds: number;
  /** Days inputs are kept after the task's lifetime (INPUT_RETENTION_DAYS; an account may have its own). */
  inputRetentionDays: number;
}

/**
 * How long a terminal task is kept at most: NOTIFY drops it at once when its row changes; this
 * bounds what a listener that lost its connection (and reconnects, dropping everything) can miss.
 */
const TERMINAL_KEEP_MS = 60_000;

export interface VideoServiceDeps {
  /**
   * How many tasks read in a terminal state (completed, failed) to keep and serve without a query
   * (0: none). Only where the cluster channel drops them when such a row changes
   * (20261221100000-terminal-task-notify): a terminal row changes only by retention or an operator.
   */
  keepTerminalTasks?: number;
  tasks: VideoTaskRepository;
  models: ModelRepository;
  ledger: LedgerRepository;
  files: FileService;
  media: MediaInputs;
  quotes: QuoteTokens;
  /** Reads a request's limits again before its hold (`AuthService.current`). */
  auth: Pick<AuthService, 'current'>;
  log: Logger;
  options: VideoServiceOptions;
  notifier: TaskNotifier;
  /** Which upstreams can express a request (checked at creation, before any charge). */
  providers: ProviderRegistry;
}

function isUniqueViolation(err: unknown, constraint: string): boolean {
  return (err as { code?: string; constraint?: string }).code === '23505' && (err as { constraint?: string }).constraint === constraint;
}

export class VideoService {
  /** Terminal tasks by id, oldest first (keepTerminalTasks), each until `until` (ms). */
  private readonly terminal = new Map<string, { row: PolledVideoTaskRow; until: number }>();
  /**
   * Counts the invalidations: a row read before one is not kept after it (the read may have seen
   * the row before its change, and putting it back would serve the old row for a minute).
   */
  private generation = 0;

  constructor(private readonly deps: VideoServiceDeps) {}

  /**
   * Drops the terminal tasks kept: NOTIFY mediagate_config said one of their rows changed, or this
   * instance changed one (a client deleted a task's output, so its next poll shows no video).
   */
  invalidateCaches(): void {
    this.generation++;
    this.terminal.clear();
  }

  private quoteRow(auth: AuthContext, model: string, price: { resolution: string; mode: BillingMode; unitPrice: number }) {
    const token = this.deps.quotes.issue({ k: auth.apiKeyId, m: model, r: price.resolution, b: price.mode, p: price.unitPrice });
    return toBillingRow(price, token);
  }

  async capabilities(auth: AuthContext): Promise<Schemas['VideoCapabilities']> {
    const rows = await this.deps.models.listVideoCatalog(auth.groupId);
    return {
      items: rows.map((row) => toCapability(row, row.prices.map((price) => this.quoteRow(auth, row.id, price)))),
      limits: { maxMediaInputCount: this.deps.options.maxMediaInputCount, maxMediaInputBytes: this.deps.options.maxMediaInputBytes },
    };
  }

  /**
   * Creates the task, or returns the original one for an idempotent retry. `staging` holds the data
   * URLs the body reader already stored; inputs named by file id or URL are resolved here.
   */
  async create(auth: AuthContext, body: Schemas['VideoCreateRequest'], staging: InputStaging): Promise<Schemas['VideoTaskCreated']> {
    const req = normalizeVideoRequest(withMediaIdentities(body, (v) => staging.identity(v)));
    checkCallbackUrl(req.callbackUrl, this.deps.options.allowPrivateTargets);
    const fingerprint = requestFingerprint(req);

    // Idempotency first: a retry of the same request gets the original task and billing, whatever
    // changed since; another request under the same client_request_id is a conflict.
    const existing = await this.deps.tasks.findByClientRequestId(auth.accountId, req.clientRequestId);
    if (existing) return this.replay(existing, fingerprint);

    const model = await this.resolveModel(auth, req.model);
    const checked = checkAgainstModel(req, model.capabilities);
    this.checkUpstreamCanExpress(model, req, checked.generateAudio);
    const price = model.prices.find((p) => p.resolution === req.resolution);
    if (!price) throw new ApiError(503, 'no_reachable_member', `Model '${model.id}' has no price for resolution '${req.resolution}'; ask the operator to set one.`);
    this.checkQuote(auth, model.id, price, req.quoteToken);

    // Every input is resolved and checked before anything is charged; files the task does not end
    // up adopting are removed when the request is over.
    const { maxMediaInputCount: maxCount, maxMediaInputBytes: maxBytes, allowPrivateTargets: allowPrivate } = this.deps.options;
    const inputs = await this.deps.media.resolveAll(staging, mediaInputsOf(req, { maxCount, allowPrivate }), { maxBytes, maxItemBytes: maxBytes });
    const inputFileIds = inputs.map((i) => i.file.id);
    const taskId = newId('vid');

    const quoted = quoteFor(price.mode, price.unitPrice, req.durationSeconds);
    const row: Insertable<VideoTasks> = {
      id: taskId,
      accountId: auth.accountId,
      apiKeyId: auth.apiKeyId,
      groupId: auth.groupId,
      clientRequestId: req.clientRequestId,
      model: model.id,
      prompt: req.prompt,
      negativePrompt: req.negativePrompt ?? null,
      durationSeconds: req.durationSeconds,
      aspectRatio: req.aspectRatio,
      resolution: req.resolution,
      generateAudio: checked.generateAudio,
      inputMode: checked.inputMode,
      inputFileIds,
      referenceVideos: req.referenceVideos,
      referenceAudios: req.referenceAudios,
      callbackUrl: req.callbackUrl ?? null,
      billingKind: 'snapshot',
      billingMode: price.mode,
      unitPrice: price.unitPrice,
      quotedCredits: quoted,
      deadlineAt: new Date(Date.now() + this.deps.options.maxLifetimeSeconds * 1000),
      requestFingerprint: fingerprint,
    };
    // The caps on generations in flight as they are now (the body may have streamed for minutes).
    const limited = await this.deps.auth.current(auth);
    const inFlightCaps = inFlightCapsOf(limited);
    let outcome;
    try {
      ({ outcome } = await this.deps.ledger.holdAndInsertTask(
        { holdId: newId('hold'), accountId: auth.accountId, apiKeyId: auth.apiKeyId, taskId, amount: quoted, inFlightCaps },
        { table: 'videoTasks', row },
        { fileIds: inputFileIds, pinSeconds: this.deps.options.maxLifetimeSeconds + 86_400, retentionDays: this.deps.options.inputRetentionDays },
      ));
    } catch (err) {
      if (isUniqueViolation(err, 'video_tasks_client_request_id_key')) {
        // A concurrent identical request won the race; nothing of ours was written.
        const winner = await this.deps.tasks.findByClientRequestId(auth.accountId, req.clientRequestId);
        if (winner) return this.replay(winner, fingerprint);
      }
      throw err;
    }
    // Deactivated or suspended since the request was authenticated (its body may have streamed for
    // minutes): what authentication would answer now, before any replay of a twin.
    if (outcome === 'api_key_inactive') throw apiKeyInactive();
    if (outcome === 'account_suspended') throw accountSuspended();
    if (outcome !== 'ok') {
      // A concurrent request under the same client_request_id may have been let in first: this
      // one then met the quota, balance or cap its twin used, not a refusal of its own.
      const winner = await this.deps.tasks.findByClientRequestId(auth.accountId, req.clientRequestId);
      if (winner) return this.replay(winner, fingerprint);
    }
    if (outcome === 'key_quota_exceeded') {
      throw paymentRequired('key_quota_exceeded', `This API key's credit limit cannot cover this video (${quoted / 1e6} credits).`);
    }
    if (outcome === 'insufficient_balance') {
      throw paymentRequired('insufficient_balance', `The account balance cannot cover this video (${quoted / 1e6} credits).`);
    }
    if (outcome === 'key_too_many_in_flight' || outcome === 'account_too_many_in_flight') throw inFlightRefusal(outcome, limited, inputFileIds.length > 0);
    if (outcome === 'input_files_gone') throw inputFilesGone();
    this.deps.log.info({ taskId, model: model.id, quotedMicroCredits: quoted, apiKeyId: auth.apiKeyId }, 'video task created');
    this.deps.notifier.notify('video');
    // Everything the create shape shows was just written; no need to read the row back.
    return toVideoTaskCreated({
      id: taskId,
      status: 'queued',
      model: model.id,
      durationSeconds: req.durationSeconds,
      aspectRatio: req.aspectRatio,
      resolution: req.resolution,
      generateAudio: checked.generateAudio,
      billingKind: 'snapshot',
      billingMode: price.mode,
      unitPrice: price.unitPrice,
      quotedCredits: quoted,
      actualCredits: 0,
    });
  }

  async get(auth: AuthContext, id: string): Promise<Schemas['VideoTask']> {
    // A terminal task kept here is served without a query, to its owner only; the signed URL is
    // made afresh and media expiry is judged now, as for a row just read.
    const entry = this.terminal.get(id);
    const kept = entry && entry.until > Date.now() ? entry.row : undefined;
    const generation = this.generation;
    const row = kept && kept.accountId === auth.accountId ? kept : await this.deps.tasks.findForAccount(id, auth.accountId);
    // Another account's task and an unknown id are indistinguishable.
    if (!row) throw notFound('task_not_found', `No video task '${id}' exists for this account.`);
    if (row !== kept && (row.status === 'completed' || row.status === 'failed') && generation === this.generation) this.keepTerminal(row);
    return toVideoTask(row, await this.videoUrl(row));
  }

  private keepTerminal(row: PolledVideoTaskRow): void {
    const max = this.deps.keepTerminalTasks ?? 0;
    if (max <= 0) return;
    if (this.terminal.size >= max) this.terminal.delete(this.terminal.keys().next().value!);
    this.terminal.delete(row.id);
    this.terminal.set(row.id, { row, until: Date.now() + TERMINAL_KEEP_MS });
  }

  /**
   * One page of the account's tasks, each as `get` shows it (GET /v1/videos). An `after` that
   * matched nothing and names no task of the account is 400 invalid_cursor.
   */
  async list(auth: AuthContext, query: TaskListQuery<Schemas['VideoTask']['status']>): Promise<Schemas['VideoTaskList']> {
    const { page, size } = accountPage(auth.accountId, query);
    const rows = await this.deps.tasks.listForAccount(page, { status: query.status, model: query.model });
    if (rows.length === 0 && page.after !== undefined && !(await this.deps.tasks.isAccountTask(page.after, auth.accountId))) throw invalidAfter('video task');
    return listPage(rows, size, async (row) => toVideoTask(row, await this.videoUrl(row)));
  }

  /** The original task for a retry of the same request; 409 for a different request under its client_request_id. */
  private replay(existing: VideoTaskRow, fingerprint: string): Schemas['VideoTaskCreated'] {
    if (existing.requestFingerprint !== null && existing.requestFingerprint !== fingerprint) {
      throw conflict(
        'idempotency_conflict',
        `client_request_id '${existing.clientRequestId}' was already used for a different request (task ${existing.id}); send a new client_request_id for a new task.`,
        {},
        'client_request_id',
      );
    }
    return toVideoTaskCreated(existing);
  }

  /** A fresh URL of a completed task's video; none once the video passed its retention (the sweeper deletes it within a minute). */
  private async videoUrl(row: Pick<PolledVideoTaskRow, 'status' | 'outputFileId' | 'mediaExpiresAt'>): Promise<string | undefined> {
    if (row.status !== 'completed' || !row.outputFileId || (row.mediaExpiresAt && row.mediaExpiresAt.getTime() <= Date.now())) return undefined;
    return this.deps.files.downloadUrl(row.outputFileId, 'video_output', 0, row.mediaExpiresAt);
  }

  /**
   * Refuses (before any charge) a request that no upstream serving the model can express. The task
   * is then routed to a member whose upstream can (VideoRunner.submit), by the same rule: the same
   * `shapeOf`, each member judged by its provider kind and its own upstream model.
   */
  private checkUpstreamCanExpress(model: VideoCatalogRow, req: NormalizedVideoRequest, generateAudio: boolean): void {
    const shape = shapeOf({ ...req, generateAudio });
    const reasons = model.providers.flatMap(({ kind, models }) => models.map((upstream) => this.deps.providers.video(kind)?.check?.(shape, upstream)));
    if (reasons.length === 0 || reasons.some((r) => r === undefined)) return;
    throw badRequest('unsupported_by_upstream', `Model '${model.id}' runs on an upstream that accepts ${reasons[0]}; change the request.`);
  }

  /**
   * The model as the key sees it, never parsed from a composite id. The same order as images: the
   * switch (the query finds nothing while it is off), then a model the group lists but no enabled
   * member can serve (503 no_reachable_member), then 404.
   */
  private async resolveModel(auth: AuthContext, modelId: string): Promise<VideoCatalogRow> {
    const model = await this.deps.models.findVideoModel(auth.groupId, modelId);
    if (model) {
      if (!model.reachable) throw unavailable('no_reachable_member', `No enabled backend member serves model '${modelId}' for this key.`);
      return model;
    }
    if (!(await this.deps.models.isSwitchedOn('video_generation'))) {
      throw unavailable('capability_disabled', 'Video generation is switched off by the operator.');
    }
    if (isCompositeModelId(modelId, await this.deps.models.videoModelIds(auth.groupId))) {
      throw badRequest(
        'composite_model_id',
        `'${modelId}' is not a model id: duration, aspect ratio and resolution are separate fields, never part of the model id.`,
        'model',
      );
    }
    if (await this.deps.models.visibleAs(auth.groupId, modelId, 'image')) {
      throw new ApiError(404, 'model_not_found', `'${modelId}' is an image model, not a video model: make images with POST /v1/images/generations (or /v1/images/edits).`, 'model');
    }
    throw new ApiError(404, 'model_not_found', `Video model '${modelId}' does not exist or is not available to this key.`, 'model');
  }

  private checkQuote(auth: AuthContext, model: string, price: { resolution: string; mode: BillingMode; unitPrice: number }, token: string | undefined): void {
    if (token === undefined) return;
    const check = this.deps.quotes.check(token, { k: auth.apiKeyId, m: model, r: price.resolution, b: price.mode, p: price.unitPrice });
    if (check.ok) return;
    switch (check.reason) {
      case 'invalid':
        throw badRequest('quote_invalid', 'quote_token is malformed or not signed by this service.', 'quote_token');
      case 'mismatch':
        throw badRequest('quote_mismatch', 'quote_token was issued for another key, model or resolution.', 'quote_token');
      case 'stale':
      case 'expired':
        throw conflict(
          check.reason === 'stale' ? 'quote_stale' : 'quote_expired',
          check.reason === 'stale'
            ? 'The quoted price changed; confirm currentQuote and retry with its quoteToken.'
            : 'The quote expired; confirm currentQuote and retry with its quoteToken.',
          { currentQuote: this.quoteRow(auth, model, price) },
          'quote_token',
        );
    }
  }
}
