/** The workers of a process: one task engine per task runner, woken by the task notifier. */
import type { Runtime } from '../context.ts';
import type { LeasedRow, TaskRunner } from '../services/tasks/task-runner.ts';
import { TaskEngine } from './task-engine.ts';

export interface Workers {
  start(): void;
  stop(): Promise<void>;
}

export function createWorkers(runtime: Runtime): Workers {
  const { config, log, notifier, runners } = runtime;
  const engineOf = <Row extends LeasedRow>(runner: TaskRunner<Row>) =>
    new TaskEngine(runner, log.child({ component: `${runner.name}-task-engine` }), {
      leaseMs: config.taskLeaseMs,
      pollMs: config.taskPollMs,
      concurrency: config.workerConcurrency,
    });
  const engines = { video: engineOf(runners.video), image: engineOf(runners.image) };
  let unsubscribe: (() => void) | undefined;
  return {
    start() {
      unsubscribe = notifier.subscribe((kind) => engines[kind].wake());
      for (const engine of Object.values(engines)) engine.start();
    },
    async stop() {
      unsubscribe?.();
      await Promise.all(Object.values(engines).map((e) => e.stop()));
    },
  };
}
