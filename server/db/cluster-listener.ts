/**
 * What one instance tells the others (design §6, §8), over a dedicated PostgreSQL connection that
 * LISTENs on two channels:
 *
 *   mediagate_tasks    a task no process holds yet was inserted (a trigger sends its kind, see the
 *                      task-wakeups migration): this process's engines claim it at once;
 *   mediagate_config   what the caches of keys, models and pool candidates hold changed, by
 *                      whoever (the admin API or CLI, SQL, another instance recording a
 *                      member's cooldown; triggers, see the config-notify migration): this
 *                      process drops those caches at once instead of at their TTL.
 *
 * When the connection drops it reconnects with backoff and, once back, acts on both channels once
 * (a notification may have been missed); the engines' periodic claim and the caches' TTLs cover
 * the gap either way. A path that goes silent (a NAT or firewall forgetting the connection, a
 * failover) drops no connection: nothing arrives, no error either. A heartbeat query finds it, and
 * one without an answer in time ends the connection, which reconnects as above.
 */
import pg from 'pg';
import type { Logger } from '../logger.ts';
import type { TaskKindName } from '../services/tasks/task-notifier.ts';

export const TASK_CHANNEL = 'mediagate_tasks';
export const CONFIG_CHANNEL = 'mediagate_config';
const KINDS: readonly TaskKindName[] = ['video', 'image', 'webhook'];

export interface ClusterListener {
  stop(): Promise<void>;
}

export interface ClusterEvents {
  task(kind: TaskKindName): void;
  configChanged(): void;
}

/** Waits between reconnection attempts: 500 ms, doubling up to 5 s. */
const RECONNECT = { baseMs: 500, maxMs: 5000 };

export interface ClusterListenerOptions {
  /** Time between heartbeat queries on a listening connection (ms). */
  heartbeatMs?: number;
  /** How long a heartbeat query (and the connection's start: connect, LISTEN) may take before the connection is given up (ms). */
  heartbeatTimeoutMs?: number;
}

export function listenToCluster(databaseUrl: string, on: ClusterEvents, log: Logger, options: ClusterListenerOptions = {}): ClusterListener {
  const heartbeatMs = options.heartbeatMs ?? 15_000;
  const timeoutMs = options.heartbeatTimeoutMs ?? 5_000;
  let client: pg.Client | undefined;
  let stopped = false;
  let retryMs = RECONNECT.baseMs;
  /** Connection attempts that failed since the listener last listened (one warning per outage). */
  let failures = 0;
  let timer: NodeJS.Timeout | undefined;
  let heartbeat: NodeJS.Timeout | undefined;

  /** `text` on `c`, failing when no answer came within the timeout. */
  const answered = (c: pg.Client, text: string) =>
    new Promise<void>((resolve, reject) => {
      const late = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      c.query(text).then(
        () => (clearTimeout(late), resolve()),
        (err: Error) => (clearTimeout(late), reject(err)),
      );
    });

  const beat = (c: pg.Client) => {
    heartbeat = setTimeout(() => {
      heartbeat = undefined;
      answered(c, 'select 1').then(
        () => {
          if (client === c) beat(c);
        },
        (err: Error) => {
          if (client !== c) return;
          log.warn({ err: err.message }, "cluster listener connection stopped answering; reconnecting. Meanwhile new tasks are found by the periodic claim and other instances' changes within the cache TTLs");
          client = undefined;
          schedule();
          // With the heartbeat still waiting for its answer, end() destroys the socket rather than
          // saying goodbye on a path that carries nothing.
          void c.end().catch(() => undefined);
        },
      );
    }, heartbeatMs);
  };

  const connect = async () => {
    // keepAlive: the kernel, too, finds a dead path in the end, heartbeat or not.
    const c = new pg.Client({ connectionString: databaseUrl, application_name: 'mediagate-listener', keepAlive: true, connectionTimeoutMillis: timeoutMs });
    client = c;
    c.on('notification', (msg) => {
      if (msg.channel === CONFIG_CHANNEL) on.configChanged();
      else if (KINDS.includes(msg.payload as TaskKindName)) on.task(msg.payload as TaskKindName);
    });
    c.on('error', (err) => {
      if (!stopped && client === c) log.warn({ err: err.message }, "cluster listener connection lost; until it reconnects, new tasks are found by the periodic claim and other instances' changes within the cache TTLs");
    });
    c.on('end', () => {
      if (client !== c) return;
      client = undefined;
      schedule();
    });
    try {
      await c.connect();
      await answered(c, `listen ${TASK_CHANNEL}; listen ${CONFIG_CHANNEL}`);
      if (client !== c) return; // stopped meanwhile, or the connection already ended
      beat(c);
      if (failures > 0) log.info({ failedAttempts: failures }, 'cluster listener reconnected');
      failures = 0;
      retryMs = RECONNECT.baseMs;
      for (const kind of KINDS) on.task(kind);
      on.configChanged();
    } catch (err) {
      if (client === c) client = undefined;
      if (stopped) return;
      if (failures++ === 0) log.warn({ err: (err as Error).message, retryInMs: retryMs }, 'cluster listener could not connect; retrying with backoff');
      schedule();
      await c.end().catch(() => undefined);
    }
  };
  const schedule = () => {
    clearTimeout(heartbeat);
    heartbeat = undefined;
    if (stopped || timer) return;
    timer = setTimeout(() => {
      timer = undefined;
      void connect();
    }, retryMs);
    retryMs = Math.min(retryMs * 2, RECONNECT.maxMs);
  };

  void connect();
  return {
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      clearTimeout(heartbeat);
      const c = client;
      client = undefined;
      await c?.end().catch(() => undefined);
    },
  };
}
