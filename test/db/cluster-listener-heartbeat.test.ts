/**
 * The cluster listener's connection notices a path that goes silent (no FIN, no reset: a NAT or
 * firewall that forgot it, a failover): its heartbeat gets no answer, the connection is given up
 * with a warning, and a new one LISTENs again, so notifications are heard again. Without it such a
 * connection was kept forever and every notification after the silence was lost. Through a TCP
 * proxy in front of PostgreSQL that can stop carrying bytes on the connections it already has.
 */
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_CHANNEL, listenToCluster, type ClusterListener } from '../../server/db/cluster-listener.ts';
import { createLogger } from '../../server/logger.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { until } from '../support/tasks.ts';

/** A proxy to `target` whose `freeze()` makes the connections open now drop every byte, both ways; later ones flow. */
function silenceableProxy(target: URL) {
  const links: { frozen: boolean; sockets: Socket[] }[] = [];
  const server = createServer((down) => {
    const up = connect(Number(target.port || 5432), target.hostname);
    const link = { frozen: false, sockets: [down, up] };
    links.push(link);
    down.on('data', (d) => {
      if (!link.frozen) up.write(d);
    });
    up.on('data', (d) => {
      if (!link.frozen) down.write(d);
    });
    for (const s of link.sockets) s.on('error', () => undefined);
    down.on('close', () => up.destroy());
    up.on('close', () => down.destroy());
  });
  return {
    server,
    /** Connections accepted so far. */
    connections: () => links.length,
    freeze: () => links.forEach((l) => (l.frozen = true)),
    close: () => {
      for (const l of links) l.sockets.forEach((s) => s.destroy());
      server.close();
    },
  };
}

describe('cluster listener heartbeat', () => {
  let t: TestDatabase;
  let notifier: pg.Client;
  beforeAll(async () => {
    t = await createTestDatabase({ max: 1 });
    notifier = new pg.Client({ connectionString: t.url });
    await notifier.connect();
  });
  afterAll(async () => {
    await notifier?.end();
    await t?.destroy();
  });

  it('gives up a connection whose path went silent, with a warning, and hears notifications on the next one', async () => {
    const target = new URL(t.url);
    const proxy = silenceableProxy(target);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', () => resolve()));
    const viaProxy = new URL(t.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String((proxy.server.address() as AddressInfo).port);

    const lines: Record<string, any>[] = [];
    const log = createLogger('info', new Writable({ write: (chunk, _enc, cb) => (lines.push(...String(chunk).split('\n').filter(Boolean).map((l) => JSON.parse(l))), cb()) }));
    let heard = 0;
    let listener: ClusterListener | undefined;
    try {
      listener = listenToCluster(viaProxy.toString(), { task: () => undefined, configChanged: () => heard++ }, log, { heartbeatMs: 100, heartbeatTimeoutMs: 300 });
      // Listening: it acts on the channel once as it starts.
      await until(() => heard === 1, 10_000, 'the listener to listen');
      const notify = () => notifier.query(`select pg_notify('${CONFIG_CHANNEL}', '')`);
      await notify();
      await until(() => heard === 2, 10_000, 'a notification on the healthy connection');
      // Heartbeats answered keep the connection: several pass without a new one.
      await sleep(500);
      expect(proxy.connections()).toBe(1);
      expect(lines.filter((l) => l.level >= 40)).toEqual([]);

      proxy.freeze();
      await notify(); // lost on the silent path
      // The heartbeat finds the silence; the new connection acts on the channel once as it starts.
      await until(() => proxy.connections() === 2 && heard === 3, 10_000, 'a new listening connection');
      expect(lines.filter((l) => l.level >= 40).map((l) => l.msg)).toEqual([expect.stringMatching(/^cluster listener connection stopped answering; reconnecting/)]);
      await notify();
      await until(() => heard === 4, 10_000, 'a notification on the new connection');
    } finally {
      // The proxy first: a listener still on a frozen connection would wait forever for its goodbye.
      proxy.close();
      await listener?.stop();
    }
  });
});
