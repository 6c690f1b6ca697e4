/**
 * The workers of a process: one task engine per task runner, woken by the task notifier, which
 * hears about new tasks from this process and (through the cluster listener, db/cluster-listener.ts)
 * from every other instance.
 *
 * Video engines run up to UPSTREAM_CONCURRENCY short steps at once (each at most one upstream
 * call), however many jobs are in flight upstream; image engines run WORKER_CONCURRENCY
 * background image tasks at once, and the webhook engine WEBHOOK_CONCURRENCY deliveries.
 * WORKER_CONCURRENCY=0 runs no workers at all. The file sweeper removes expired files (uploads,
 * inputs of requests that died) every minute.
 */
import type { Runtime } from '../context.ts';
import type { LeasedRow, TaskRunner } from '../services/tasks/task-runner.ts';
import { TaskEngine } from './task-engine.ts';

const FILE_SWEEP_MS = 60_000;
const FILE_SWEEP_BATCH = 100;

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
  const sweep = () => {
    sweeping = (async () => {
      try {
        let removed = 0;
        for (let n = FILE_SWEEP_BATCH; n === FILE_SWEEP_BATCH; removed += n) n = await runtime.services.files.sweepExpired(FILE_SWEEP_BATCH);
        if (removed > 0) log.info({ removed }, 'removed expired files');
      } catch (err) {
        log.warn({ err }, 'file sweep failed; retrying at the next one');
      }
    })();
  };
  return {
    start() {
      unsubscribe = notifier.subscribe((kind) => engines[kind].wake());
      for (const engine of Object.values(engines)) engine.start();
      if (config.workerConcurrency > 0) {
        sweep();
        sweeper = setInterval(sweep, FILE_SWEEP_MS);
        sweeper.unref();
      }
    },
    async stop() {
      clearInterval(sweeper);
      await sweeping;
      unsubscribe?.();
      await Promise.all(Object.values(engines).map((e) => e.stop()));
    },
  };
}
