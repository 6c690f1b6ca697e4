/**
 * The task sweeper (issue 32), on one instance at a time (a lease in the sweepers table), every
 * 30 seconds, whether or not any engine runs:
 *
 *   deadlines  an unfinished video task past its deadline that no worker holds is claimed (a fenced
 *              claim, as an engine's) and failed and refunded, its upstream job cancelled where the
 *              adapter can (VideoRunner.expire: the same end a worker gives it); an image task still
 *              `processing` TASK_MAX_LIFETIME_SECONDS after its creation, likewise (failed, released;
 *              a synchronous one as a worker ends it, ImageRunner.endInterrupted: a streamed one
 *              may have delivered images, so it goes to `needs_attention`);
 *   holds      a hold still `held` whose task has ended is settled: the task's actual credits
 *              captured when it completed, all released when it failed (every end settles its hold
 *              in the same statement; this mends what an older version or a manual edit left).
 *
 * A task an engine holds (a live lease) is left to it; `needs_attention` tasks wait for an operator.
 */
import { randomBytes } from 'node:crypto';
import type { Executor } from '../../db/database.ts';
import type { Logger } from '../../logger.ts';
import { fenceOf } from '../../repositories/leased-tasks.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { SweeperRepository } from '../../repositories/sweeper.repository.ts';
import type { TaskSweepRepository } from '../../repositories/task-sweep.repository.ts';
import type { ImageRunner } from '../image/image-runner.ts';
import { CANCEL_TOTAL_MS, type VideoRunner } from '../video/video-runner.ts';
import type { Settlement } from './settlement.ts';

const NAME = 'tasks';
/** Longer than a run can take: a run that dies lets another instance take over after it. */
const LEASE_MS = 5 * 60_000;
/** The lease of a claimed task: long enough to fail it and cancel its upstream job. */
const TASK_LEASE_MS = 60_000;
/**
 * Overdue tasks claimed at once: each may wait for its upstream job's cancel (CANCEL_TOTAL_MS at
 * most, one task after another), so a claim is no larger than its lease can see through.
 */
const CLAIM = Math.max(1, Math.floor(TASK_LEASE_MS / CANCEL_TOTAL_MS) - 1);
/** A run claims overdue tasks for this long at most, so that it ends within its own lease. */
const CLAIMING_MS = LEASE_MS - TASK_LEASE_MS;
/** Stranded holds read at once, and batches of them a run works through at most (the rest waits for the next run). */
const BATCH = 50;
const MAX_BATCHES = 20;

export interface TaskSweepReport {
  /** Video tasks failed and refunded past their deadline. */
  videos: number;
  /** Image tasks failed and released past their lifetime. */
  images: number;
  /** Holds of ended tasks settled. */
  holds: number;
}

export interface TaskSweeperDeps {
  repo: TaskSweepRepository;
  sweepers: SweeperRepository;
  ledger: LedgerRepository;
  settlement: Settlement;
  videoRunner: VideoRunner;
  imageRunner: Pick<ImageRunner, 'endInterrupted' | 'cancelRecorded'>;
  db: Executor;
  log: Logger;
  taskMaxLifetimeSeconds: number;
}

export class TaskSweeper {
  private readonly owner = `task_sweeper_${process.pid}_${randomBytes(4).toString('hex')}`;
  /** The run in progress's: stop() cuts its upstream calls short. */
  private abort = new AbortController();
  /** The run of this process in progress, which a run() meanwhile joins. */
  private inFlight: Promise<TaskSweepReport | undefined> | undefined;

  constructor(private readonly deps: TaskSweeperDeps) {}

  /**
   * One run, when no other instance is running one; undefined when another holds the lease or stop()
   * came first. While a run of this process is in progress, the call joins it rather than starting
   * a second one beside it (the sweepers lease is renewed for its own owner, so it would not keep
   * that out), and answers its report: a stopping process that waits for its latest call waits
   * for the run in progress.
   */
  run(): Promise<TaskSweepReport | undefined> {
    this.inFlight ??= this.runOnce().finally(() => (this.inFlight = undefined));
    return this.inFlight;
  }

  private async runOnce(): Promise<TaskSweepReport | undefined> {
    // Made before the lease is taken: a stop() while that statement runs aborts this run's controller,
    // not one this run would replace afterwards and then go ahead with (claims, upstream cancels)
    // while the stopping process waits for it.
    const abort = new AbortController();
    this.abort = abort;
    const taken = await this.deps.sweepers.take(NAME, this.owner, LEASE_MS);
    if (!taken) return undefined;
    if (abort.signal.aborted) {
      await this.deps.sweepers.save(NAME, this.owner, null, true);
      return undefined;
    }
    const claimUntil = Date.now() + CLAIMING_MS;
    const report: TaskSweepReport = { videos: 0, images: 0, holds: 0 };
    try {
      report.videos = await this.expireVideos(abort.signal, claimUntil);
      report.images = await this.expireImages(abort.signal, claimUntil);
      report.holds = await this.settleStrandedHolds(abort.signal);
    } finally {
      await this.deps.sweepers.save(NAME, this.owner, null, true);
    }
    if (report.videos + report.images + report.holds > 0) this.deps.log.info({ ...report }, 'task sweep ended overdue tasks or settled stranded holds');
    return report;
  }

  /** Stops the run in progress at its next upstream call or task (a stopping process); a later run starts afresh. */
  stop(): void {
    this.abort.abort();
  }

  /**
   * A task that cannot be ended now (its settlement failed) is logged and left: it is claimed again
   * once its lease runs out, and the rest of the run goes on. A stop leaves the tasks not yet ended
   * to their leases.
   */
  private async expireVideos(signal: AbortSignal, claimUntil: number): Promise<number> {
    let ended = 0;
    while (!signal.aborted && Date.now() < claimUntil) {
      const tasks = await this.deps.repo.claimOverdueVideos(this.owner, TASK_LEASE_MS, CLAIM);
      for (const task of tasks) {
        if (signal.aborted) break;
        const log = this.deps.log.child({ taskId: task.id });
        try {
          if (await this.deps.videoRunner.expire(task, signal, log)) {
            ended++;
            log.warn({ deadlineAt: task.deadlineAt.toISOString() }, 'video task past its deadline and unclaimed: failed and refunded by the task sweeper');
          }
        } catch (err) {
          if (signal.aborted) break;
          log.error({ err }, 'the task sweeper could not end a video task past its deadline; it is tried again after its lease');
        }
      }
      if (tasks.length < CLAIM) break;
    }
    return ended;
  }

  private async expireImages(signal: AbortSignal, claimUntil: number): Promise<number> {
    let ended = 0;
    while (!signal.aborted && Date.now() < claimUntil) {
      const tasks = await this.deps.repo.claimOverdueImages(this.owner, TASK_LEASE_MS, this.deps.taskMaxLifetimeSeconds, CLAIM);
      for (const task of tasks) {
        if (signal.aborted) break;
        const log = this.deps.log.child({ taskId: task.id });
        try {
          // A synchronous task's request is gone: it ends as an engine would end it (a streamed one
          // may have delivered images: it waits for an operator).
          if (!task.runAsync) {
            if (await this.deps.imageRunner.endInterrupted(task, log)) ended++;
          } else if (await this.deps.settlement.failImage(fenceOf(task), 'timeout', 'The task exceeded its maximum lifetime and was refunded.')) {
            ended++;
            log.warn('image task past its lifetime and unclaimed: failed and released by the task sweeper');
            // A job its last step recorded and left running (fal, Replicate) is nobody's now.
            await this.deps.imageRunner.cancelRecorded(task, signal, log);
          }
        } catch (err) {
          log.error({ err }, 'the task sweeper could not end an image task past its lifetime; it is tried again after its lease');
        }
      }
      if (tasks.length < CLAIM) break;
    }
    return ended;
  }

  private async settleStrandedHolds(signal: AbortSignal): Promise<number> {
    let settled = 0;
    for (let batch = 0; batch < MAX_BATCHES && !signal.aborted; batch++) {
      const holds = await this.deps.repo.strandedHolds(BATCH);
      let progressed = 0;
      for (const hold of holds) {
        if (await this.deps.ledger.settleForTask(hold.taskId, hold.capture, this.deps.db)) {
          settled++;
          progressed++;
          this.deps.log.warn({ taskId: hold.taskId, status: hold.status, capturedMicroCredits: hold.capture }, 'hold of an ended task was still held: settled by the task sweeper');
        }
      }
      if (holds.length < BATCH || progressed === 0) break;
    }
    return settled;
  }
}
