// Usage: npm run admin -- <resource> <verb> [id] [--flag value] [--json]   (see USAGE below)
//   The admin CLI runs the same admin services as the HTTP admin API, straight on the database:
//   DATABASE_URL, or else the embedded PostgreSQL of $MEDIAGATE_DATA_DIR (default ./.mediagate),
//   shared with a running `npm start` or started (and stopped) for this one command.
//   It never prints a full API key except the one `keys create` just issued.
//   Each resource's commands live in scripts/admin/<resource>.ts; this file parses, connects and
//   dispatches (`runAdmin`); scripts/admin.ts runs it as a process, and the tests also run it
//   in-process (test/support/admin-cli.ts).
import { createDatabase, type DbLogger } from '../../server/db/database.ts';
import { connectOrStartEmbedded } from '../../server/db/embedded.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { ApiError } from '../../server/errors.ts';
import { PROVIDER_KINDS } from '../../server/providers/provider-kinds.ts';
import { createAdminServices, type AdminServices } from '../../server/services/admin/index.ts';
import { loadSecretKey } from '../../server/lib/secret-box.ts';
import { createLogger } from '../../server/logger.ts';
import { accountCommands } from './accounts.ts';
import { parse, UsageError, type Flags } from './args.ts';
import { commandContext, type Command, type Commands } from './command.ts';
import { InvalidBody } from './contract.ts';
import { inFlagTerms } from './flag-names.ts';
import { groupCommands } from './groups.ts';
import { keyCommands } from './keys.ts';
import { memberCommands } from './members.ts';
import { modelCommands } from './models.ts';
import type { Output } from './output.ts';
import { switchCommands } from './switches.ts';
import { webhookCommands } from './webhooks.ts';
import { taskCommands } from './tasks.ts';
import { ledgerCommands } from './ledger.ts';
import { TABLE_ROWS, usageCommands } from './usage.ts';
import { cliOutputUrls } from './output-urls.ts';

const USAGE = `Usage: npm run admin -- <resource> <verb> [id] [--flag value ...] [--json]

  accounts create --name NAME [--initial-credits N] [--status active|suspended]
                  [--rpm N|none|default] [--max-in-flight N|none|default]
  accounts list [--status active|suspended] [--limit N] [--cursor C]
  accounts get <account id|name>
  accounts update <account id|name> [--name NAME] [--status active|suspended]
                  [--output-retention-days N|default] [--input-retention-days N|default]
                  [--rpm N|none|default] [--max-in-flight N|none|default]
  accounts credit <account id|name> --amount N --reason TEXT [--idempotency-key KEY]
                  (negative N debits; with a KEY, the same command run again, e.g. after an error,
                   applies it once; another amount or reason under that KEY is idempotency_conflict)

  keys create --account <id|name> --name NAME [--credit-limit N|none] [--group <id|name>]
              [--rpm N|none|default] [--max-in-flight N|none|default]
  keys list [--account <id|name>] [--limit N] [--cursor C]
  keys get <key id>
  keys update <key id> [--name NAME] [--credit-limit N|none] [--group <id|name>] [--active true|false]
              [--rpm N|none|default] [--max-in-flight N|none|default]

  groups create --name NAME [--description TEXT]
  groups list [--limit N] [--cursor C]
  groups get <group id|name>
  groups update <group id|name> [--name NAME] [--description TEXT|none]

  members add --group <id|name> --name NAME --provider ${PROVIDER_KINDS.join('|')} --models a,b
              [--model-map catalog-id=upstream-id,...|none] [--credential key=value ...] [--base-url URL]
              [--priority N] [--weight N] [--concurrency-limit N|none] [--enabled true|false]
  members list --group <id|name>       (with health: in flight, cooldown, rejected credentials, recent ok/fail)
  members update <member id|name> --group <id|name> [same flags as add, except --provider]
  members delete <member id|name> --group <id|name>   (a disabled member, once no task runs on it)

  models list [--kind image|video]
  models get <model id>
  models definitions [--provider openai|gemini|…] [--kind image|video]   (ready-made catalog models to load)
  models definitions <definition id>   (its notes and body; --json prints the body --file takes)
  models create --from <definition id> | --file <body.json|->
              [--id ID] [--display-name NAME] [--enabled true|false] [--price RES[/QUALITY]=N ...] [--mode per_second|per_item]
  models update <model id> [--display-name NAME] [--enabled true|false] [--price RES[/QUALITY]=N ...] [--mode per_second|per_item]
              [--reference-limit N] [--resize exact|native] [--edits true|false]
              [--custom-size-ratios any|offered] [--min-edge N|none] [--max-edge N|none] [--file <patch.json|->]
  models set-price <model id> --resolution R [--quality low|medium|high] --price N [--mode per_second|per_item]
  models set-reference-limit <model id> --count N
  models set-mapping <model id> --provider fal|replicate --file <mapping.json|->   (an aggregator's mapping; see the README)
  models remove-mapping <model id> --provider fal|replicate
  models enable <model id>
  models disable <model id>

  switches list
  switches set <image_generation|image_edit|video_generation> on|off

  tasks list [--kind image|video] [--status needs_attention,queued,…] [--account <id|name>] [--key <key id>]
             [--model M] [--member <member id>] [--provider P] [--after T] [--before T] [--limit N] [--cursor C]
  tasks show <task id>                 (its story: quote, hold, ledger, upstream attempts, webhook)

  ledger list [--account <id|name>] [--key <key id>] [--task <task id>] [--kind grant,debit,hold,capture,release]
              [--after T] [--before T] [--limit N] [--cursor C]

  usage --from T --to T [--group-by account,key,model,provider] [--granularity hour|day] [--account <id|name>] [--csv]
                                       (credits spent and refunded, tasks and images by status; T is RFC 3339;
                                        the table shows ${TABLE_ROWS} rows at most: --csv or --json prints all)

  webhooks list [--status pending,delivered,gone,failed] [--account <id|name>] [--after T] [--before T] [--limit N] [--cursor C]
  webhooks show <video task id>        (the callback_url delivery: status, next attempt, every attempt)
  webhooks redeliver <video task id>   (send it again now, same webhook-id and body)

Amounts are credits (decimals, at most 6 fractional digits). --json prints the API objects as JSON.
Every body a command sends is checked as the admin API checks it (the same error; exit code 2).
Model bodies (--file, definitions) are those of POST and PATCH /admin/v1/models;
--price changes the named rows of a model's (or definition's) prices and keeps the others.
Database: DATABASE_URL, else the embedded database in $MEDIAGATE_DATA_DIR (default ./.mediagate).
Credentials are encrypted with MEDIAGATE_SECRET_KEY (embedded mode: the data dir's secret.key).`;

const RESOURCES: Record<string, Commands> = {
  accounts: accountCommands,
  keys: keyCommands,
  groups: groupCommands,
  members: memberCommands,
  models: modelCommands,
  switches: switchCommands,
  webhooks: webhookCommands,
  tasks: taskCommands,
  ledger: ledgerCommands,
  usage: usageCommands,
};

// Keyed `resource verb` (a Map, so that no verb can reach Object.prototype).
const COMMANDS = new Map<string, Command>(
  Object.entries(RESOURCES).flatMap(([resource, commands]) =>
    Object.entries(commands).map(([verb, command]): [string, Command] => [`${resource} ${verb}`, command]),
  ),
);

// Unknown verbs are reported only after connecting, as before the split: the database setup comes first.
async function run(admin: AdminServices, resource: string, verb: string | undefined, args: string[], flags: Flags): Promise<Output> {
  const command = COMMANDS.get(`${resource} ${verb ?? ''}`.trim());
  if (!command || verb === undefined) throw new UsageError(`unknown command '${[resource, verb].filter(Boolean).join(' ')}'`);
  try {
    return await command(commandContext(admin, resource, verb, args, flags));
  } catch (err) {
    throw err instanceof ApiError ? inFlagTerms(err, resource, verb, args, flags) : err;
  }
}

// ---------- main ----------

/** Where a run of the CLI reads its settings and writes; for the process: its environment, stdout and stderr. */
export interface AdminIo {
  env: NodeJS.ProcessEnv;
  /** One printed result (a line is added). */
  out(text: string): void;
  /** Progress and errors (never the result, so that --json output stays parseable). */
  err: NodeJS.WritableStream;
}

/**
 * Runs one command of the CLI; resolves with its exit code (0, 1 for a failure, 2 for a usage error
 * or a body the API would refuse: InvalidBody, which a usage report's refused query is too).
 */
export async function runAdmin(argv: string[], io: AdminIo): Promise<number> {
  try {
    await main(argv, io);
    return 0;
  } catch (err) {
    if (err instanceof UsageError) {
      io.err.write(`error: ${err.message}\nRun 'npm run admin -- --help' for usage.\n`);
      return 2;
    }
    if (err instanceof ApiError) {
      io.err.write(`error: ${err.message} (${err.code}${err.param ? `, ${err.param}` : ''})\n`);
      return err instanceof InvalidBody ? 2 : 1;
    }
    io.err.write(`error: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
}

async function main(argv: string[], io: AdminIo): Promise<void> {
  // Progress of the embedded database goes to stderr, so that --json output stays parseable.
  const log: DbLogger = {
    info: (msg) => io.err.write(`${msg}\n`),
    warn: (msg) => io.err.write(`${msg}\n`),
  };
  const quiet: DbLogger = { info: () => {}, warn: log.warn };
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values: flags, positionals } = parsed;
  // `usage` alone is `usage report`.
  const [resource, verb = resource === 'usage' ? 'report' : undefined, ...args] = positionals;
  if (flags.help || resource === undefined || resource === 'help') {
    io.out(USAGE);
    return;
  }
  if (!Object.hasOwn(RESOURCES, resource)) {
    throw new UsageError(`unknown resource '${resource}'`);
  }

  const env = io.env;
  const databaseUrl = env.DATABASE_URL?.trim() || undefined;
  const dataDir = env.MEDIAGATE_DATA_DIR?.trim() || './.mediagate';
  const embedded = databaseUrl ? undefined : await connectOrStartEmbedded(dataDir, log);
  const db = createDatabase(databaseUrl ?? embedded!.url, { max: 2, applicationName: 'mediagate-admin-cli' });
  try {
    await migrateToLatest(db, quiet);
    const serviceLog = createLogger('warn', io.err);
    // Loaded only when credentials are stored or output URLs signed; with DATABASE_URL it must come from the environment.
    const secretKey = () => loadSecretKey({ envValue: env.MEDIAGATE_SECRET_KEY, dataDir: databaseUrl ? undefined : dataDir });
    const admin = createAdminServices({
      db,
      log: serviceLog,
      secretKey,
      outputUrl: cliOutputUrls(db, serviceLog, secretKey, env),
      // An image task's deadline in `tasks show`, as the server has it.
      taskMaxLifetimeSeconds: Number(env.TASK_MAX_LIFETIME_SECONDS) || undefined,
    });
    const output = await run(admin, resource, verb, args, flags);
    if (output.print) await output.print(io.out, flags.json === true);
    else io.out(flags.json ? JSON.stringify(output.json, null, 2) : output.text);
  } finally {
    await db.destroy();
    if (embedded?.started) await embedded.stop();
  }
}
