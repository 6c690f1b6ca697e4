/**
 * The durable video task engine (design §6). Every server process runs one. It claims due tasks
 * with short `FOR UPDATE SKIP LOCKED` transactions that set a lease, renews the lease by heartbeat
 * while it works, and fences every write with the attempt number. The upstream job id is saved
 * before polling. Completion stores the output and then, in one transaction, marks the task
 * completed and captures the hold; failure marks it failed and releases the hold. A crashed worker's
 * tasks are claimed again once their lease expires, so nothing is lost and nothing is charged twice.
 */
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Logger } from '../logger.ts';
import type { LedgerRepository } from '../repositories/ledger.repository.ts';
import type { RoutingRepository } from '../repositories/routing.repository.ts';
import type { Fence, VideoTaskRepository, VideoTaskRow } from '../repositories/video-task.repository.ts';
import type { FileService } from '../services/file.service.ts';
import { pickMember } from '../services/member-router.ts';
import type { VideoJobRequest, VideoProvider } from '../providers/video-provider.ts';

export interface VideoTaskEngineOptions {
  leaseMs: number;
  pollMs: number;
  concurrency: number;
  /** Attempts that end in a transient error before the task fails for good. */
  maxAttempts?: number;
}

export interface VideoTaskEngineDeps {
  db: Kysely<DB>;
  tasks: VideoTaskRepository;
  ledger: LedgerRepository;
  routing: RoutingRepository;
  files: FileService;
  providers: Map<string, VideoProvider>;
  log: Logger;
  options: VideoTaskEngineOptions;
}

class LeaseLost extends Error {}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });

export class VideoTaskEngine {
  readonly workerId = `w_${process.pid}_${randomBytes(4).toString('hex')}`;
  private readonly running = new Map<string, Promise<void>>();
  private readonly stopping = new AbortController();
  private wakeUp: (() => void) | undefined;
  private loopDone: Promise<void> | undefined;

  constructor(private readonly deps: VideoTaskEngineDeps) {}

  start(): void {
    if (this.deps.options.concurrency <= 0) return;
    this.loopDone = this.loop();
  }

  /** Claims work now instead of at the next poll (called after a task is created here). */
  wake(): void {
    this.wakeUp?.();
  }

  /** Stops claiming and aborts running work; unfinished tasks are picked up again after their lease. */
  async stop(): Promise<void> {
    this.stopping.abort();
    this.wake();
    await this.loopDone;
    await Promise.allSettled(this.running.values());
  }

  private async loop(): Promise<void> {
    const { concurrency, pollMs, leaseMs } = this.deps.options;
    while (!this.stopping.signal.aborted) {
      const free = concurrency - this.running.size;
      let claimed: VideoTaskRow[] = [];
      if (free > 0) {
        try {
          claimed = await this.deps.tasks.claimDue(this.workerId, free, leaseMs);
        } catch (err) {
          this.deps.log.error({ err }, 'task engine: claim failed');
        }
      }
      for (const task of claimed) {
        const run = this.run(task).finally(() => {
          this.running.delete(task.id);
          this.wake();
        });
        this.running.set(task.id, run);
      }
      if (claimed.length === 0 || this.running.size >= concurrency) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, pollMs);
          this.wakeUp = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wakeUp = undefined;
      }
    }
  }

  private async run(task: VideoTaskRow): Promise<void> {
    const fence: Fence = { id: task.id, attempt: task.attempt };
    const log = this.deps.log.child({ taskId: task.id, attempt: task.attempt });
    const work = new AbortController();
    const onStop = () => work.abort(new Error('worker stopping'));
    this.stopping.signal.addEventListener('abort', onStop, { once: true });
    const heartbeat = setInterval(() => {
      this.deps.tasks
        .heartbeat(fence, this.workerId, this.deps.options.leaseMs)
        .then((ok) => {
          if (!ok) work.abort(new LeaseLost('lease lost'));
        })
        .catch((err: unknown) => log.warn({ err }, 'heartbeat failed'));
    }, Math.max(100, Math.floor(this.deps.options.leaseMs / 3)));
    try {
      if (task.deadlineAt.getTime() <= Date.now()) {
        await this.fail(fence, 'timeout', 'The task exceeded its maximum lifetime and was refunded.', log);
        return;
      }
      await this.process(task, fence, work.signal, log);
    } catch (err) {
      if (work.signal.aborted) {
        log.info({ reason: String(work.signal.reason) }, 'task attempt stopped; it will resume after its lease expires');
        return;
      }
      const maxAttempts = this.deps.options.maxAttempts ?? 5;
      if (task.attempt >= maxAttempts) {
        log.error({ err }, 'task failed after its last attempt');
        await this.fail(fence, 'upstream_error', 'Video generation failed repeatedly; the credits were refunded.', log);
      } else {
        const delay = Math.min(60_000, 1000 * 2 ** (task.attempt - 1));
        log.warn({ err, retryInMs: delay }, 'task attempt failed; retrying');
        await this.deps.tasks.retryLater(fence, delay);
      }
    } finally {
      clearInterval(heartbeat);
      this.stopping.signal.removeEventListener('abort', onStop);
    }
  }

  private async process(task: VideoTaskRow, fence: Fence, signal: AbortSignal, log: Logger): Promise<void> {
    const member = task.memberId
      ? await this.deps.routing.find(task.memberId)
      : pickMember(await this.deps.routing.candidates(task.groupId, task.model), (p) => this.deps.providers.has(p));
    const provider = member && this.deps.providers.get(member.provider);
    if (!member || !provider) {
      await this.fail(fence, 'no_reachable_member', `No enabled backend member can run model '${task.model}'; the credits were refunded.`, log);
      return;
    }
    const job = await this.jobRequest(task);
    let jobId = task.upstreamJobId;
    if (!jobId) {
      jobId = await provider.submit(job, signal);
      if (!(await this.deps.tasks.setUpstreamJob(fence, member.id, jobId))) throw new LeaseLost('lease lost before the job id was saved');
      log.info({ memberId: member.id, upstreamJobId: jobId }, 'video job submitted');
    }
    for (;;) {
      if (task.deadlineAt.getTime() <= Date.now()) {
        await this.fail(fence, 'timeout', 'The task exceeded its maximum lifetime and was refunded.', log);
        return;
      }
      const result = await provider.poll(jobId, job, signal);
      if (signal.aborted) throw signal.reason;
      if (result.status === 'running') {
        await sleep(provider.pollIntervalMs, signal);
        continue;
      }
      if (result.status === 'failed') {
        await this.fail(fence, 'upstream_error', result.message, log);
        return;
      }
      await this.complete(task, fence, result.output, log);
      return;
    }
  }

  private async jobRequest(task: VideoTaskRow): Promise<VideoJobRequest> {
    const inputs = await Promise.all(task.inputFileIds.map((id) => this.readFile(id)));
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
    };
    if (task.inputMode === 'reference_images') job.referenceImages = inputs;
    else {
      if (inputs[0]) job.firstFrame = inputs[0];
      if (inputs[1]) job.lastFrame = inputs[1];
    }
    return job;
  }

  private async readFile(id: string): Promise<Buffer> {
    const file = await this.deps.files.find(id);
    if (!file) throw new Error(`input file ${id} is missing`);
    const chunks: Buffer[] = [];
    for await (const chunk of this.deps.files.read(file)) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /** Publishes the output, then completes the task and captures the hold in one transaction. */
  private async complete(task: VideoTaskRow, fence: Fence, output: { path: string; contentType: string }, log: Logger): Promise<void> {
    const file = await this.deps.files.save({ accountId: task.accountId, purpose: 'video_output', contentType: output.contentType, taskId: task.id }, { path: output.path });
    const captured = task.quotedCredits ?? 0;
    const done = await this.deps.db.transaction().execute(async (trx) => {
      if (!(await this.deps.tasks.markCompleted(fence, file.id, captured, trx))) return false;
      const hold = await this.deps.ledger.findHoldByTask(task.id, trx);
      if (hold && !(await this.deps.ledger.settle(hold.id, captured, trx))) throw new Error(`hold of task ${task.id} was already settled`);
      return true;
    });
    if (!done) {
      log.warn('task was taken over before it completed here; discarding this output');
      await rm(output.path, { force: true });
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
