/**
 * The admin CLI run in this process (runAdmin of scripts/admin/main.ts, which scripts/admin.ts runs
 * as a process): what `npm run admin -- …` prints and its exit code, without a process per command
 * (each costs about 2 s of CPU here for Node, tsx and the server's modules). The process itself is
 * tested by test/db/admin-cli.test.ts ('as a process'), test/db/admin-cli-models.test.ts (stdin) and
 * test/process/server-start.test.ts (beside a running server).
 */
import { Writable } from 'node:stream';
import { runAdmin } from '../../scripts/admin/main.ts';

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
