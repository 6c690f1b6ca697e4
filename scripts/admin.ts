// Usage: npm run admin -- <resource> <verb> [id] [--flag value] [--json]   (see scripts/admin/main.ts)
//   The admin CLI as a process: DATABASE_URL and the other settings from the environment, results on
//   stdout, progress and errors on stderr, exit code 0, 1 (a failure) or 2 (a usage error, or a body the API would refuse).
import { runAdmin } from './admin/main.ts';

process.exitCode = await runAdmin(process.argv.slice(2), {
  env: process.env,
  out: (text) => console.log(text),
  err: process.stderr,
});
