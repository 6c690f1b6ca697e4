/**
 * The admin CLI run in this process (runAdmin of scripts/admin/main.ts, which scripts/admin.ts runs
 * as a process): what `npm run admin -- …` prints and its exit code, without a process per command
 * (each costs about 2 s of CPU here for Node and the server's modules). `adminProcess` runs it as
 * the process, for the tests of the process itself: test/db/admin-cli.test.ts ('as a process': exit
 * codes, stdout and stderr) and test/db/admin-cli-models.test.ts (stdin); test/process/server-start
 * runs it beside a running server.
 */
import { execFile } from 'node:child_process';
import { Writable } from 'node:stream';
import { runAdmin } from '../../scripts/admin/main.ts';
import { repoRoot, ADMIN_ENTRY } from './server-process.ts';

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** One command with `env` as its environment (the test process's own, plus these). */
export async function adminCli(args: string[], env: Record<string, string>): Promise<CliRun> {
  let stdout = '';
  let stderr = '';
  const err = new Writable({
    write(chunk: Buffer | string, _encoding, done) {
      stderr += chunk.toString();
      done();
    },
  });
  const code = await runAdmin(args, { env: { ...process.env, ...env }, out: (text) => void (stdout += `${text}\n`), err });
  return { code, stdout, stderr };
}

/** The same command as a process, as `npm run admin` runs it (the built CLI: ADMIN_ENTRY); `stdin` is piped in. */
export function adminProcess(args: string[], env: Record<string, string>, stdin = ''): Promise<CliRun> {
  return new Promise((resolve) => {
    const child = execFile(process.execPath, [ADMIN_ENTRY, ...args], { cwd: repoRoot, env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin!.end(stdin);
  });
}
