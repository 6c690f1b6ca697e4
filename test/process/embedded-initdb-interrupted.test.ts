/**
 * A first start stopped while initdb builds the embedded cluster (found by a review, with real
 * processes). Killed with its process group (a container's `docker stop`, a service manager, `kill -9
 * -PGID`): initdb writes PG_VERSION first, and the half-built cluster it left was taken for a whole
 * one, so every later start failed until the folder was removed by hand; initdb now builds in a
 * sibling folder renamed into place once done, and the next start builds again. A terminal's Ctrl-C
 * reaches initdb too: that is a stop during start-up (exit 0), not a fatal initdb failure that blames
 * the disk.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';

const dirs: string[] = [];
const running: ServerProcess[] = [];
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill()));
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function freshDataDir(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `mediagate-${name}-`));
  dirs.push(dir);
  return dir;
}

/** The server process of a first start on `dataDir`, in its own process group, as a container's are. */
function firstStart(dataDir: string) {
  const env = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', MEDIAGATE_DATA_DIR: dataDir };
  const child = spawn(process.execPath, [SERVER_ENTRY], { cwd: repoRoot, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  return { child, output: () => out, exited };
}

describe('a first start stopped while initdb runs', () => {
  it('killed with its process group mid-way through initdb: the next start builds the cluster again and runs', async () => {
    const dataDir = freshDataDir('initdb-killed');
    const start = firstStart(dataDir);
    // initdb's single-user backend marks the cluster it builds with its negated pid: initdb is mid-way.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const building = readdirSync(dataDir).filter((e) => e.startsWith('pg.initdb-'));
      const pidFile = building.map((e) => join(dataDir, e, 'postmaster.pid')).find((f) => existsSync(f));
      if (pidFile && readFileSync(pidFile, 'utf8').startsWith('-')) break;
      if (Date.now() > deadline) throw new Error(`initdb never reached its single-user phase:\n${start.output()}`);
      await sleep(5);
    }
    process.kill(-start.child.pid!, 'SIGKILL'); // the server and its initdb
    await start.exited;
    await sleep(200);
    expect(existsSync(join(dataDir, 'pg', 'PG_VERSION'))).toBe(false);

    const next = await spawnServer({ env: { LOG_LEVEL: 'info', MEDIAGATE_DATA_DIR: dataDir }, timeoutMs: 90_000 });
    running.push(next);
    expect((await fetch(`${next.url}/readyz`)).status).toBe(200);
    // What the killed initdb left is gone.
    expect(readdirSync(dataDir).filter((e) => e.startsWith('pg.initdb-') || e.startsWith('.pg-pwfile-'))).toEqual([]);
  }, 180_000);

  it('a Ctrl-C (SIGINT to the whole group) while initdb runs is a stop during start-up, exit 0', async () => {
    const dataDir = freshDataDir('initdb-ctrlc');
    const start = firstStart(dataDir);
    const deadline = Date.now() + 60_000;
    while (!/initialising embedded PostgreSQL/.test(start.output())) {
      if (Date.now() > deadline) throw new Error(`initdb never started:\n${start.output()}`);
      await sleep(10);
    }
    await sleep(300);
    process.kill(-start.child.pid!, 'SIGINT'); // a terminal's Ctrl-C
    const code = await start.exited;
    expect(start.output().split('\n').filter((l) => l.includes('"level":60'))).toEqual([]);
    expect(start.output()).toMatch(/stopped during start-up/);
    expect(code).toBe(0);
  }, 120_000);
});
