/**
 * How the server stops (server/main.ts), on real processes:
 * - a drain lets no client keep a keep-alive connection busy with new requests for the whole
 *   SHUTDOWN_GRACE_MS: answers not yet begun say `Connection: close`, /readyz says not ready, and
 *   the server exits as soon as its last request ended;
 * - a database that stops answering (a frozen PostgreSQL, behind a proxy here) makes /readyz answer
 *   503 within its time limit and cannot hold a stop past SHUTDOWN_GRACE_MS and a few seconds, nor
 *   past a second signal: the process exits 1 with a line naming what did not stop;
 * - a signal during start-up (migrating the embedded PostgreSQL) stops the embedded PostgreSQL and
 *   exits, instead of killing the process by the signal's default action and orphaning PostgreSQL.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { recordedClusterDir } from '../../server/db/embedded-layout.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';

const ADMIN_TOKEN = 'ops-shutdown-admin-token-0123';
let t: TestDatabase;
const processes: ServerProcess[] = [];
const cleanup: (() => void)[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill('SIGKILL')));
  for (const clean of cleanup) clean();
  await t?.destroy();
});

async function start(env: Record<string, string>): Promise<ServerProcess> {
  const p = await spawnServer({
    env: { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), DEMO_DATA: '0', LOG_LEVEL: 'info', ADMIN_TOKEN, MEDIAGATE_DATA_DIR: join(repoRoot, '.test-data', `ops-${randomBytes(4).toString('hex')}`), ...env },
  });
  processes.push(p);
  return p;
}

/** A raw HTTP/1.1 connection: what the server wrote, and whether it closed the connection. */
function rawConnection(url: string) {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  let received = '';
  let closed = false;
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => undefined);
  const ended = new Promise<void>((resolve) => socket.on('close', () => ((closed = true), resolve())));
  return {
    socket,
    write: (text: string) => new Promise<void>((resolve) => socket.write(text, () => resolve())),
    received: () => received,
    closed: () => closed,
    ended,
  };
}

const until = async (what: string, check: () => boolean, ms = 10_000) => {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

/** Status line and headers of the last answer in `raw`. */
function lastAnswer(raw: string): { status: number; connection: string | undefined; body: string } {
  const at = raw.lastIndexOf('HTTP/1.1 ');
  const [head = '', body = ''] = raw.slice(at).split('\r\n\r\n');
  const connection = /^connection: *(.+)$/im.exec(head)?.[1]?.trim().toLowerCase();
  return { status: Number(head.slice(9, 12)), connection, body };
}

describe('a stop while keep-alive connections are busy', () => {
  it('answers with Connection: close and /readyz 503, closes each connection once idle, and exits without waiting out the grace', async () => {
    const server = await start({ SHUTDOWN_GRACE_MS: '60000' });

    // A: a request whose body is still arriving when the stop begins (its answer not yet begun).
    const body = JSON.stringify({ name: `drain-${randomBytes(3).toString('hex')}` });
    const a = rawConnection(server.url);
    await a.write(`POST /admin/v1/groups HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`);
    // B: a keep-alive connection that has served a request and is sending its next one.
    const b = rawConnection(server.url);
    await b.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    await until('/healthz', () => b.received().includes('{"status":"ok"}'));
    expect(lastAnswer(b.received())).toMatchObject({ status: 200, connection: 'keep-alive' });
    await b.write('GET /readyz HTTP/1.1\r\nHost: x\r\n');
    await new Promise((r) => setTimeout(r, 200));

    // Twice at once, as `npm start` in a terminal gets a Ctrl-C (the group's and npm's relay): one stop.
    server.child.kill('SIGTERM');
    server.child.kill('SIGTERM');
    await until('the shutdown line', () => /"msg":"shutting down"/.test(server.stdout()));
    await new Promise((r) => setTimeout(r, 300));
    expect([a.closed(), b.closed(), server.child.exitCode]).toEqual([false, false, null]);

    await b.write('\r\n');
    await until('/readyz answered', () => b.received().includes('not_ready') || b.received().includes('"ready"'));
    expect(lastAnswer(b.received())).toMatchObject({ status: 503, connection: 'close' });
    expect(JSON.parse(lastAnswer(b.received()).body)).toMatchObject({ error: { code: 'not_ready' } });
    await until('B closed by the server', () => b.closed(), 2_000);

    await a.write(body.slice(5));
    await until('the group created', () => a.received().includes('"name"') || a.received().includes('"error"'));
    expect(lastAnswer(a.received())).toMatchObject({ status: 201, connection: 'close' });
    await until('A closed by the server', () => a.closed(), 2_000);

    const exit = await Promise.race([server.exited, new Promise((r) => setTimeout(() => r('still running'), 10_000))]);
    expect(exit).toEqual({ code: 0, signal: null });
    expect(server.stdout()).toMatch(/"msg":"stopped"/);
    expect(server.stdout()).not.toMatch(/exiting without a clean stop/);
  }, 90_000);
});

/** A TCP proxy to PostgreSQL that can freeze: it then forwards nothing, either way, as a frozen server answers nothing. */
async function freezableProxy(target: URL): Promise<{ url: string; freeze(): void; close(): void }> {
  let frozen = false;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    sockets.add(client);
    client.on('error', () => undefined);
    if (frozen) return;
    const upstream = connect(Number(target.port || 5432), target.hostname);
    sockets.add(upstream);
    upstream.on('error', () => client.destroy());
    client.on('data', (d) => void (frozen || upstream.write(d)));
    upstream.on('data', (d) => void (frozen || client.write(d)));
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as { port: number }).port);
  return {
    url: url.toString(),
    freeze: () => void (frozen = true),
    close: () => {
      server.close();
      for (const s of sockets) s.destroy();
    },
  };
}

describe('a stop while PostgreSQL does not answer', () => {
  it('answers /readyz 503 within its limit, and exits 1 after the grace and 5 s, naming what did not stop', async () => {
    const proxy = await freezableProxy(new URL(t.url));
    cleanup.push(proxy.close);
    const server = await start({ DATABASE_URL: proxy.url, SHUTDOWN_GRACE_MS: '500', TASK_POLL_MS: '100' });
    expect((await fetch(`${server.url}/readyz`)).status).toBe(200);

    proxy.freeze();
    // A frozen database never answers: an answer at all is the readiness check's own limit at work.
    const ready = await fetch(`${server.url}/readyz`, { signal: AbortSignal.timeout(10_000) });
    expect([ready.status, ((await ready.json()) as { error: { code: string } }).error.code]).toEqual([503, 'not_ready']);

    // The engines' claims are now waiting for an answer that never comes.
    await new Promise((r) => setTimeout(r, 500));
    server.child.kill('SIGTERM');
    const exit = await Promise.race([server.exited, new Promise((r) => setTimeout(() => r('still running'), 20_000))]);
    expect(exit).toEqual({ code: 1, signal: null });
    const line = server.stdout().split('\n').find((l) => l.includes('exiting without a clean stop'));
    expect(line).toBeDefined();
    expect(JSON.parse(line!)).toMatchObject({ level: 50, waitingFor: expect.stringMatching(/^(settling the image requests the drain cut, and stopping the task workers|stopping the task workers|stopping the cluster listener|closing the database pool)$/) });
    expect(line).toContain('did not end within 5500 ms');
  }, 60_000);

  it('exits at once on a second signal (a second after the first: not a relayed copy of it)', async () => {
    const proxy = await freezableProxy(new URL(t.url));
    cleanup.push(proxy.close);
    const server = await start({ DATABASE_URL: proxy.url, SHUTDOWN_GRACE_MS: '60000', TASK_POLL_MS: '100' });
    proxy.freeze();
    await new Promise((r) => setTimeout(r, 500));
    server.child.kill('SIGTERM');
    await until('the shutdown line', () => /"msg":"shutting down"/.test(server.stdout()));
    await new Promise((r) => setTimeout(r, 1_200));
    expect(server.child.exitCode).toBeNull();
    server.child.kill('SIGINT');
    const exit = await Promise.race([server.exited, new Promise((r) => setTimeout(() => r('still running'), 5_000))]);
    expect(exit).toEqual({ code: 1, signal: null });
    expect(server.stdout()).toMatch(/"msg":"second SIGINT: exiting without a clean stop/);
  }, 60_000);
});

describe('a signal during start-up', () => {
  it('stops the embedded PostgreSQL it started and exits, leaving no PostgreSQL behind', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'mediagate-ops-start-'));
    const pgRoot = mkdtempSync(join(tmpdir(), 'mediagate-ops-pgroot-'));
    chmodSync(pgRoot, 0o755);
    const child = spawn(process.execPath, [SERVER_ENTRY], {
      cwd: repoRoot,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', MEDIAGATE_DATA_DIR: dataDir, MEDIAGATE_PG_ROOT_DIR: pgRoot, SHUTDOWN_GRACE_MS: '60000' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    let postmaster: number | undefined;
    cleanup.push(() => {
      child.kill('SIGKILL');
      if (postmaster !== undefined) {
        try {
          process.kill(postmaster, 'SIGKILL');
        } catch {
          // gone, as it should be
        }
      }
      rmSync(dataDir, { recursive: true, force: true });
      rmSync(pgRoot, { recursive: true, force: true });
    });

    // Right after PostgreSQL is up the server migrates the new database: the signal lands there.
    await until('the embedded PostgreSQL', () => /embedded PostgreSQL listening/.test(out), 90_000);
    const pidFile = join(recordedClusterDir(dataDir), 'postmaster.pid');
    postmaster = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    child.kill('SIGTERM');
    const exit = await Promise.race([exited, new Promise((r) => setTimeout(() => r('still running'), 30_000))]);
    expect(exit, out.slice(-3000)).toEqual({ code: 0, signal: null });
    expect(out).not.toMatch(/Mediagate listening/);
    expect(out).toMatch(/"msg":"stopped during start-up"/);
    expect(existsSync(pidFile)).toBe(false);
    expect(() => process.kill(postmaster!, 0)).toThrow();
  }, 120_000);
});
