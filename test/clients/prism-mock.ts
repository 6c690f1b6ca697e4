import { spawn } from 'node:child_process';
import { accepts, freePort } from '../support/ports.ts';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

export interface PrismMock {
  url: string;
  /** Prism's recent log output, for failure messages. */
  output(): string;
  stop(): Promise<void>;
}

/** Starts `prism mock generated/openapi.json --errors` on a free loopback port. */
export async function startPrismMock(timeoutMs = 45_000): Promise<PrismMock> {
  const port = await freePort();
  const child = spawn(
    `${root}node_modules/.bin/prism`,
    ['mock', 'generated/openapi.json', '--host', '127.0.0.1', '--port', String(port), '--errors'],
    { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  // Prism logs every request; keep the tail only, but always drain the pipes so it never blocks.
  let log = '';
  const keep = (chunk: Buffer): void => {
    log = (log + chunk.toString()).slice(-20_000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);

  const stop = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await exited;
  };

  const deadline = Date.now() + timeoutMs;
  while (!(await accepts(port))) {
    if (child.exitCode !== null) throw new Error(`prism exited with code ${child.exitCode}:\n${log}`);
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`prism did not listen on ${port} within ${timeoutMs} ms:\n${log}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url: `http://127.0.0.1:${port}`, output: () => log, stop };
}
