/**
 * The workers of a process: one task engine per task runner, woken by the task notifier, which
 * hears about new tasks from this process and (through the cluster listener, db/cluster-listener.ts)
 * from every other instance.
 *
 * Video engines run up to UPSTREAM_CONCURRENCY short steps at once (each at most one upstream
 * call), however many jobs are in flight upstream; image engines run WORKER_CONCURRENCY
 * background image tasks at once, and the webhook engine WEBHOOK_CONCURRENCY deliveries.
 * WORKER_CONCURRENCY=0 runs no workers at all. The media sweeper (services/media/media-sweeper.ts)
 * runs every minute, on one instance at a time. The task sweeper (services/tasks/task-sweeper.ts:
 * overdue tasks no worker claims, holds of ended tasks) runs every 30 seconds on one instance at a
 * time, in every process with workers, even one whose engines run nothing (WORKER_CONCURRENCY=0).
 */
import type { Runtime } from '../context.ts';
import type { LeasedRow, TaskRunner } from '../services/tasks/task-runner.ts';
import { TaskEngine } from './task-engine.ts';

const MEDIA_SWEEP_MS = 60_000;
const TASK_SWEEP_MS = 30_000;

export interface Workers {
  start(): void;
  stop(): Promise<void>;
}

export function createWorkers(runtime: Runtime): Workers {
  const { config, log, notifier, runners, metrics } = runtime;
  const engineOf = <Row extends LeasedRow>(runner: TaskRunner<Row>, concurrency: number) =>
    new TaskEngine(runner, log.child({ component: `${runner.name}-task-engine` }), {
      leaseMs: config.taskLeaseMs,
      pollMs: config.taskPollMs,
      concurrency: config.workerConcurrency === 0 ? 0 : concurrency,
      onStep: (outcome) => metrics.taskSteps.inc({ kind: runner.name, outcome }),
    });
  const engines = {
    video: engineOf(runners.video, config.upstreamConcurrency),
    image: engineOf(runners.image, config.workerConcurrency),
    webhook: engineOf(runners.webhook, config.webhookConcurrency),
  };
  let unsubscribe: (() => void) | undefined;
  let sweeper: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> = Promise.resolve();
  let taskSweeper: NodeJS.Timeout | undefined;
  let taskSweeping: Promise<void> = Promise.resolve();
  /** One sweep run, its failure logged (the next tick tries again); a tick during a run joins it (the sweepers' run()). */
  const sweepOnce = (run: () => Promise<unknown>, what: string) =>
    run().then(
      () => undefined,
      (err: unknown) => log.warn({ err }, `${what} sweep failed; retrying at the next one`),
    );
  const sweepTasks = () => void (taskSweeping = sweepOnce(() => runtime.taskSweeper.run(), 'task'));
  const sweep = () => void (sweeping = sweepOnce(() => runtime.mediaSweeper.run(), 'media'));
  return {
    start() {
      unsubscribe = notifier.subscribe((kind) => engines[kind].wake());
      for (const engine of Object.values(engines)) engine.start();
      taskSweeper = setInterval(sweepTasks, TASK_SWEEP_MS);
      taskSweeper.unref();
      if (config.workerConcurrency > 0) {
        sweep();
        sweeper = setInterval(sweep, MEDIA_SWEEP_MS);
        sweeper.unref();
      }
    },
    async stop() {
      clearInterval(sweeper);
      clearInterval(taskSweeper);
      // Everything is told to stop before anything is awaited: engines waiting on a sweep run (a
      // media store that does not answer, a slow statement) would go on claiming and starting work
      // that the stop then cuts short, until the forced exit.
      runtime.taskSweeper.stop();
      runtime.mediaSweeper.stop();
      unsubscribe?.();
      const enginesStopped = Object.values(engines).map((e) => e.stop());
      // Steps are aborted, except a video submit in flight (the engine waits for its answer and its
      // saved job id: TaskEngine.stop, at most its upstream timeout, UPSTREAM_TIMEOUT_MS, 60 s a
      // call) and a background image's upstream call that recorded no job (its images are settled:
      // UpstreamCallDrain). The process gives its whole stop SHUTDOWN_GRACE_MS + 5 s (main.ts; 15 s
      // by default), less than that: a call still unanswered then is cut by the forced exit (logged,
      // exit 1) as a crash would cut it, and its task calls again after its lease
      // (VideoRunner.resubmit; an image task counts it as a retry). Where
      // upstreams answer submits slowly, SHUTDOWN_GRACE_MS above 60 s lets every one end. A sweep
      // run ends at its next file or batch (MediaSweeper.stop, TaskSweeper.stop).
      await Promise.all([sweeping, taskSweeping, ...enginesStopped]);
    },
  };
}
