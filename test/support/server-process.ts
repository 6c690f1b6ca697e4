/**
 * Starts the real server as a child process (the way `npm start` does) and reads its base URL from
 * the line it prints. Used by the tests that kill, restart and run several instances.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const repoRoot = fileURLToPath(new URL('../..', import.meta.url));

/**
 * The server as `npm start` runs it: the built JavaScript, which the tests' global setup brings up
 * to date (test/setup/global-setup.ts). Not through tsx: its loader cost each start about 2 s of
 * CPU, and the tests that start servers start dozens.
 */
export const SERVER_ENTRY = 'dist/server/main.js';
export const SERVER_COMMAND: [string, ...string[]] = [process.execPath, SERVER_ENTRY];
/** The admin CLI as `npm run admin` runs it: built, like the server. */
export const ADMIN_ENTRY = 'dist/scripts/admin.js';

export interface ServerProcess {
  child: ChildProcess;
  url: string;
  /** Everything written to stdout so far. */
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code (or signal) once the process has exited. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface SpawnOptions {
  env: Record<string, string>;
  /** Command and arguments; default: SERVER_COMMAND */
  command?: [string, ...string[]];
  /** Put the child in its own process group (signals go to the whole group, like a terminal's Ctrl-C). */
  group?: boolean;
  timeoutMs?: number;
  /** A worker-only process (`--role worker`) prints this instead of a URL. */
  workerOnly?: boolean;
  /** Working directory (default: this checkout). */
  cwd?: string;
}

export async function spawnServer(options: SpawnOptions): Promise<ServerProcess> {
  const [cmd, ...args] = options.command ?? SERVER_COMMAND;
  const child = spawn(cmd, args, {
    cwd: options.cwd ?? repoRoot,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', LOG_LEVEL: 'warn', HOST: '127.0.0.1', PORT: '0', ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: options.group ?? false,
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start within ${options.timeoutMs ?? 60_000} ms\nstdout:\n${out}\nstderr:\n${err}`)), options.timeoutMs ?? 60_000);
    // Until the start line: a server at LOG_LEVEL=info writes a line a request, and scanning all of
    // its output for every chunk would cost the reading process (a bench's load generator) more each time.
    const check = () => {
      const m = options.workerOnly ? /Mediagate worker running/.exec(out) : /Mediagate listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        child.stdout!.off('data', check);
        resolve(m[1]?.replace('localhost', '127.0.0.1') ?? '');
      }
    };
    child.stdout!.on('data', check);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited (code ${code}, signal ${signal}) before listening\nstdout:\n${out}\nstderr:\n${err}`));
    });
  });
  return {
    child,
    url,
    stdout: () => out,
    stderr: () => err,
    exited,
    kill: async (signal = 'SIGTERM') => {
      if (child.exitCode === null && child.signalCode === null) {
        if (options.group) process.kill(-child.pid!, signal);
        else child.kill(signal);
      }
      return exited;
    },
  };
}
