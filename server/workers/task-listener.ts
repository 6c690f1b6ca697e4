/**
 * Cross-instance wake-ups (design §6): a dedicated PostgreSQL connection LISTENs on
 * `mediagate_tasks`, where inserting a task no process holds yet sends its kind (a trigger, see
 * the task-wakeups migration), and wakes this process's engines at once. When the connection
 * drops it reconnects with backoff and wakes the engines once (a notification may have been
 * missed); the engines' periodic claim covers the gap either way.
 */
import pg from 'pg';
import type { Logger } from '../logger.ts';
import type { TaskKindName, TaskNotifier } from '../services/tasks/task-notifier.ts';

export const TASK_CHANNEL = 'mediagate_tasks';
const KINDS: readonly TaskKindName[] = ['video', 'image', 'webhook'];

export interface TaskListener {
  stop(): Promise<void>;
}

export function listenForTasks(databaseUrl: string, notifier: TaskNotifier, log: Logger): TaskListener {
  let client: pg.Client | undefined;
  let stopped = false;
  let retryMs = 500;
  let timer: NodeJS.Timeout | undefined;

  const connect = async () => {
    const c = new pg.Client({ connectionString: databaseUrl, application_name: 'mediagate-task-listener' });
    client = c;
    c.on('notification', (msg) => {
      if (KINDS.includes(msg.payload as TaskKindName)) notifier.notify(msg.payload as TaskKindName);
    });
    c.on('error', (err) => {
      if (!stopped) log.warn({ err }, 'task listener connection failed; new tasks are found by the periodic claim until it reconnects');
    });
    c.on('end', () => {
      if (client !== c) return;
      client = undefined;
      schedule();
    });
    try {
      await c.connect();
      await c.query(`listen ${TASK_CHANNEL}`);
      retryMs = 500;
      for (const kind of KINDS) notifier.notify(kind);
    } catch (err) {
      if (!stopped) log.warn({ err, retryInMs: retryMs }, 'task listener could not connect');
      if (client === c) client = undefined;
      schedule();
      await c.end().catch(() => undefined);
    }
  };
  const schedule = () => {
    if (stopped || timer) return;
    timer = setTimeout(() => {
      timer = undefined;
      void connect();
    }, retryMs);
    retryMs = Math.min(retryMs * 2, 30_000);
  };

  void connect();
  return {
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await client?.end().catch(() => undefined);
    },
  };
}
