/**
 * Video tasks for the task engine: `queued → in_progress → completed | failed`. The upstream job id
 * is saved before polling, so a resumed attempt polls the same job instead of resubmitting.
 * Completion stores the output and then, in one transaction, marks the task completed (fenced by
 * the attempt) and captures the hold; failure marks it failed and releases the hold.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Logger } from '../logger.ts';
import type { VideoJobRequest, VideoProvider } from '../providers/video-provider.ts';
import type { LedgerRepository } from '../repositories/ledger.repository.ts';
import type { RoutingRepository } from '../repositories/routing.repository.ts';
import type { VideoTaskRepository, VideoTaskRow } from '../repositories/video-task.repository.ts';
import type { FileService } from '../services/file.service.ts';
import { pickMember } from '../services/member-router.ts';
import { LeaseLost, sleep, type Fence, type TaskKind } from './task-engine.ts';

export interface VideoTaskKindDeps {
  db: Kysely<DB>;
  tasks: VideoTaskRepository;
  ledger: LedgerRepository;
  routing: RoutingRepository;
  files: FileService;
  providers: Map<string, VideoProvider>;
  /** Attempts that end in a transient error before the task fails for good. */
  maxAttempts?: number;
}

const fenceOf = (task: VideoTaskRow): Fence => ({ id: task.id, attempt: task.attempt });

export class VideoTaskKind implements TaskKind<VideoTaskRow> {
  readonly name = 'video';

  constructor(private readonly deps: VideoTaskKindDeps) {}

  claimDue(workerId: string, limit: number, leaseMs: number) {
    return this.deps.tasks.claimDue(workerId, limit, leaseMs);
  }

  heartbeat(fence: Fence, workerId: string, leaseMs: number) {
    return this.deps.tasks.heartbeat(fence, workerId, leaseMs);
  }

  async run(task: VideoTaskRow, signal: AbortSignal, log: Logger): Promise<void> {
    const fence = fenceOf(task);
    const expired = () => task.deadlineAt.getTime() <= Date.now();
    if (expired()) return this.fail(fence, 'timeout', 'The task exceeded its maximum lifetime and was refunded.', log);

    const member = task.memberId
      ? await this.deps.routing.find(task.memberId)
      : pickMember(await this.deps.routing.candidates(task.groupId, task.model), (p) => this.deps.providers.has(p));
    const provider = member && this.deps.providers.get(member.provider);
    if (!member || !provider) {
      return this.fail(fence, 'no_reachable_member', `No enabled backend member can run model '${task.model}'; the credits were refunded.`, log);
    }
    const job = await this.jobRequest(task);
    let jobId = task.upstreamJobId;
    if (!jobId) {
      jobId = await provider.submit(job, signal);
      if (!(await this.deps.tasks.setUpstreamJob(fence, member.id, jobId))) throw new LeaseLost('lease lost before the job id was saved');
      log.info({ memberId: member.id, upstreamJobId: jobId }, 'video job submitted');
    }
    for (;;) {
      if (expired()) return this.fail(fence, 'timeout', 'The task exceeded its maximum lifetime and was refunded.', log);
      const result = await provider.poll(jobId, job, signal);
      if (signal.aborted) throw signal.reason;
      if (result.status === 'running') {
        await sleep(provider.pollIntervalMs, signal);
        continue;
      }
      if (result.status === 'failed') return this.fail(fence, 'upstream_error', result.message, log);
      return this.complete(task, result.output, log);
    }
  }

  async onError(task: VideoTaskRow, err: unknown, log: Logger): Promise<void> {
    if (task.attempt >= (this.deps.maxAttempts ?? 5)) {
      log.error({ err }, 'video task failed after its last attempt');
      await this.fail(fenceOf(task), 'upstream_error', 'Video generation failed repeatedly; the credits were refunded.', log);
      return;
    }
    const delay = Math.min(60_000, 1000 * 2 ** (task.attempt - 1));
    log.warn({ err, retryInMs: delay }, 'video task attempt failed; retrying');
    await this.deps.tasks.retryLater(fenceOf(task), delay);
  }

  private async jobRequest(task: VideoTaskRow): Promise<VideoJobRequest> {
    const inputs = await Promise.all(task.inputFileIds.map((id) => this.deps.files.readAll(id)));
    const job: VideoJobRequest = {
      taskId: task.id,
      model: task.model,
      prompt: task.prompt,
      negativePrompt: task.negativePrompt,
      durationSeconds: task.durationSeconds,
      aspectRatio: task.aspectRatio,
      resolution: task.resolution,
      generateAudio: task.generateAudio,
      referenceImages: [],
      referenceVideos: task.referenceVideos,
      referenceAudios: task.referenceAudios,
    };
    if (task.inputMode === 'reference_images') job.referenceImages = inputs;
    else {
      if (inputs[0]) job.firstFrame = inputs[0];
      if (inputs[1]) job.lastFrame = inputs[1];
    }
    return job;
  }

  /** Publishes the output, then completes the task and captures the hold in one transaction. */
  private async complete(task: VideoTaskRow, output: { path: string; contentType: string }, log: Logger): Promise<void> {
    const file = await this.deps.files.save({ accountId: task.accountId, purpose: 'video_output', contentType: output.contentType, taskId: task.id }, { path: output.path });
    const captured = task.quotedCredits ?? 0;
    const done = await this.deps.db.transaction().execute(async (trx) => {
      if (!(await this.deps.tasks.markCompleted(fenceOf(task), file.id, captured, trx))) return false;
      const hold = await this.deps.ledger.findHoldByTask(task.id, trx);
      if (hold && !(await this.deps.ledger.settle(hold.id, captured, trx))) throw new Error(`hold of task ${task.id} was already settled`);
      return true;
    });
    if (!done) {
      log.warn('task was taken over before it completed here; discarding this output');
      await this.deps.files.discard(file);
      return;
    }
    log.info({ fileId: file.id, capturedMicroCredits: captured }, 'video task completed');
  }

  /** Fails the task and releases its hold, fenced by the attempt. */
  private async fail(fence: Fence, code: string, message: string, log: Logger): Promise<void> {
    const done = await this.deps.db.transaction().execute(async (trx) => {
      if (!(await this.deps.tasks.markFailed(fence.id, fence.attempt, code, message, trx))) return false;
      const hold = await this.deps.ledger.findHoldByTask(fence.id, trx);
      if (hold) await this.deps.ledger.settle(hold.id, 0, trx);
      return true;
    });
    if (done) log.info({ code, message }, 'video task failed; credits released');
  }
}
