// Usage: npm run admin -- <resource> <verb> [id] [--flag value] [--json]   (see USAGE below)
//   The admin CLI runs the same admin services as the HTTP admin API, straight on the database:
//   DATABASE_URL, or else the embedded PostgreSQL of $MEDIAGATE_DATA_DIR (default ./.mediagate),
//   shared with a running `npm start` or started (and stopped) for this one command.
//   It never prints a full API key except the one `keys create` just issued.
import { parseArgs } from 'node:util';
import { createDatabase, type DbLogger } from '../server/db/database.ts';
import { connectOrStartEmbedded } from '../server/db/embedded.ts';
import { migrateToLatest } from '../server/db/migrate.ts';
import { ApiError } from '../server/errors.ts';
import { createAdminServices, type AdminServices } from '../server/services/admin/index.ts';
import type { AdminPriceRow } from '../server/services/admin/admin-mappers.ts';
import { loadSecretKey } from '../server/services/secret-box.ts';

const USAGE = `Usage: npm run admin -- <resource> <verb> [id] [--flag value ...] [--json]

  accounts create --name NAME [--initial-credits N] [--status active|suspended]
  accounts list [--status active|suspended] [--limit N] [--cursor C]
  accounts get <account id|name>
  accounts update <account id|name> [--name NAME] [--status active|suspended]
  accounts credit <account id|name> --amount N --reason TEXT      (negative N debits)

  keys create --account <id|name> --name NAME [--credit-limit N|none] [--group <id|name>]
  keys list [--account <id|name>] [--limit N] [--cursor C]
  keys get <key id>
  keys update <key id> [--name NAME] [--credit-limit N|none] [--group <id|name>] [--active true|false]

  groups create --name NAME [--description TEXT]
  groups list [--limit N] [--cursor C]
  groups get <group id|name>
  groups update <group id|name> [--name NAME] [--description TEXT|none]

  members add --group <id|name> --name NAME --provider local|openai|gemini|ark|kling --models a,b
              [--credential key=value ...] [--base-url URL] [--priority N] [--weight N]
              [--concurrency-limit N|none] [--enabled true|false]
  members list --group <id|name>
  members update <member id|name> --group <id|name> [same flags as add, except --provider]

  models list [--kind image|video]
  models get <model id>
  models set-price <model id> --resolution R [--quality low|medium|high] --price N [--mode per_second|per_item]
  models set-reference-limit <model id> --count N
  models enable <model id>
  models disable <model id>

  switches list
  switches set <image_generation|image_edit|video_generation> on|off

Amounts are credits (decimals, at most 6 fractional digits). --json prints the API objects as JSON.
Database: DATABASE_URL, else the embedded database in $MEDIAGATE_DATA_DIR (default ./.mediagate).
Credentials are encrypted with MEDIAGATE_SECRET_KEY (embedded mode: the data dir's secret.key).`;

/** A mistake in the command line itself (exit code 2, with a pointer to the usage). */
class UsageError extends Error {}

const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  id: { type: 'string' },
  name: { type: 'string' },
  status: { type: 'string' },
  'initial-credits': { type: 'string' },
  amount: { type: 'string' },
  reason: { type: 'string' },
  account: { type: 'string' },
  group: { type: 'string' },
  'credit-limit': { type: 'string' },
  active: { type: 'string' },
  description: { type: 'string' },
  provider: { type: 'string' },
  models: { type: 'string' },
  credential: { type: 'string', multiple: true },
  'base-url': { type: 'string' },
  priority: { type: 'string' },
  weight: { type: 'string' },
  'concurrency-limit': { type: 'string' },
  enabled: { type: 'string' },
  kind: { type: 'string' },
  resolution: { type: 'string' },
  quality: { type: 'string' },
  price: { type: 'string' },
  mode: { type: 'string' },
  count: { type: 'string' },
  limit: { type: 'string' },
  cursor: { type: 'string' },
} as const;

type Flags = ReturnType<typeof parse>['values'];

/** `--amount -5` -> `--amount=-5`: parseArgs would otherwise take `-5` for a flag. */
function joinNegativeValues(argv: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const next = argv[i + 1];
    const option = OPTIONS[arg.slice(2) as keyof typeof OPTIONS] as { type: string } | undefined;
    if (arg.startsWith('--') && option?.type === 'string' && next !== undefined && /^-\d/.test(next)) {
      out.push(`${arg}=${next}`);
      i++;
    } else out.push(arg);
  }
  return out;
}

function parse(argv: string[]) {
  return parseArgs({ args: joinNegativeValues(argv), options: OPTIONS, allowPositionals: true, strict: true });
}

// ---------- flag helpers ----------

function required(value: string | undefined, flag: string): string {
  if (value === undefined || value === '') throw new UsageError(`--${flag} is required`);
  return value;
}

function num(value: string, flag: string): number {
  if (!/^-?\d+(\.\d+)?$/.test(value.trim())) throw new UsageError(`--${flag} must be a number, got '${value}'`);
  return Number(value);
}

function int(value: string, flag: string): number {
  if (!/^\d+$/.test(value.trim())) throw new UsageError(`--${flag} must be a whole number, got '${value}'`);
  return Number(value);
}

function optNum(value: string | undefined, flag: string): number | undefined {
  return value === undefined ? undefined : num(value, flag);
}

function optInt(value: string | undefined, flag: string): number | undefined {
  return value === undefined ? undefined : int(value, flag);
}

/** `none` (or `null`) means no value, e.g. an unlimited quota. */
function nullable<T>(value: string | undefined, convert: (v: string) => T): T | null | undefined {
  if (value === undefined) return undefined;
  return ['none', 'null', 'unlimited'].includes(value.trim().toLowerCase()) ? null : convert(value);
}

function bool(value: string | undefined, flag: string): boolean | undefined {
  if (value === undefined) return undefined;
  const v = value.trim().toLowerCase();
  if (['true', 'yes', 'on', '1'].includes(v)) return true;
  if (['false', 'no', 'off', '0'].includes(v)) return false;
  throw new UsageError(`--${flag} must be true or false, got '${value}'`);
}

function oneOf<T extends string>(value: string | undefined, flag: string, allowed: readonly T[]): T | undefined {
  if (value === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(value)) throw new UsageError(`--${flag} must be one of ${allowed.join(', ')}, got '${value}'`);
  return value as T;
}

function credentials(pairs: string[] | undefined): Record<string, string> | undefined {
  if (pairs === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0 || eq === pair.length - 1) throw new UsageError(`--credential must look like name=value (e.g. api_key=sk-...)`);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

const list = (value: string | undefined) => value?.split(',').map((s) => s.trim()).filter(Boolean);

/** Drops undefined members, so "send at least one member" checks see only what was given. */
function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

// ---------- output ----------

type Row = Record<string, unknown>;

function cell(value: unknown): string {
  if (value === null || value === undefined) return '-';
  if (Array.isArray(value)) return value.join(',');
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

function table(rows: Row[], columns: string[]): string {
  if (rows.length === 0) return '(none)';
  const cells = rows.map((r) => columns.map((c) => cell(r[c])));
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)));
  const line = (values: string[]) => values.map((v, i) => v.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(columns), ...cells.map(line)].join('\n');
}

function lines(obj: Row): string {
  const width = Math.max(...Object.keys(obj).map((k) => k.length));
  return Object.entries(obj)
    .map(([k, v]) => `${k.padEnd(width)}  ${cell(v)}`)
    .join('\n');
}

interface Output {
  json: unknown;
  text: string;
}

const ACCOUNT_COLUMNS = ['id', 'name', 'status', 'balance', 'total_earned', 'total_spent', 'created_at'];
const KEY_COLUMNS = ['id', 'account_id', 'group_id', 'name', 'key_prefix', 'last_four', 'is_active', 'credit_limit', 'credits_used', 'last_used_at'];
const GROUP_COLUMNS = ['id', 'name', 'member_count', 'description'];
const MEMBER_COLUMNS = ['id', 'name', 'provider', 'enabled', 'priority', 'weight', 'concurrency_limit', 'has_credentials', 'models'];
const MODEL_COLUMNS = ['id', 'kind', 'enabled', 'display_name'];
const SWITCH_COLUMNS = ['name', 'enabled', 'updated_at'];

function page(result: { data: unknown[]; next_cursor: string | null }, columns: string[]): Output {
  const text = table(result.data as Row[], columns) + (result.next_cursor ? `\n(more: --cursor ${result.next_cursor})` : '');
  return { json: result, text };
}

function modelText(model: Awaited<ReturnType<AdminServices['catalog']['get']>>): string {
  const { pricing, image, video, ...rest } = model;
  const caps = image ?? video;
  const prices = table(pricing as unknown as Row[], ['resolution', 'quality', 'mode', 'unit_price']);
  return `${lines({ ...rest, capabilities: caps })}\npricing:\n${prices}`;
}

// ---------- commands ----------

async function run(admin: AdminServices, resource: string, verb: string | undefined, args: string[], flags: Flags): Promise<Output> {
  const target = () => flags.id ?? args[0] ?? (() => { throw new UsageError(`${resource} ${verb} needs an id`); })();
  const accountId = async (value: string) => (await admin.accounts.resolve(value)).id;
  const groupId = async (value: string) => (await admin.groups.resolve(value)).id;
  const one = (obj: object): Output => ({ json: obj, text: lines(obj as Row) });

  switch (`${resource} ${verb ?? ''}`.trim()) {
    case 'accounts create':
      return one(
        await admin.accounts.create(
          defined({
            name: required(flags.name, 'name'),
            initial_credits: optNum(flags['initial-credits'], 'initial-credits'),
            status: oneOf(flags.status, 'status', ['active', 'suspended'] as const),
          }),
        ),
      );
    case 'accounts list':
      return page(
        await admin.accounts.list({
          limit: optInt(flags.limit, 'limit'),
          cursor: flags.cursor,
          status: oneOf(flags.status, 'status', ['active', 'suspended'] as const),
        }),
        ACCOUNT_COLUMNS,
      );
    case 'accounts get':
      return one(await admin.accounts.resolve(target()));
    case 'accounts update':
      return one(
        await admin.accounts.update(
          await accountId(target()),
          defined({ name: flags.name, status: oneOf(flags.status, 'status', ['active', 'suspended'] as const) }),
        ),
      );
    case 'accounts credit': {
      const result = await admin.accounts.adjustCredits(await accountId(target()), {
        amount: num(required(flags.amount, 'amount'), 'amount'),
        reason: required(flags.reason, 'reason'),
      });
      return { json: result, text: `${lines(result.account)}\n\nledger entry:\n${lines(result.entry)}` };
    }

    case 'keys create': {
      const created = await admin.apiKeys.create(
        defined({
          account_id: await accountId(required(flags.account, 'account')),
          name: required(flags.name, 'name'),
          credit_limit: nullable(flags['credit-limit'], (v) => num(v, 'credit-limit')),
          group_id: flags.group === undefined ? undefined : await groupId(flags.group),
        }),
      );
      const { key, ...shown } = created;
      return { json: created, text: `${lines(shown)}\n\nkey  ${key}\n\nStore this key now: it is shown only once and cannot be retrieved again.` };
    }
    case 'keys list':
      return page(
        await admin.apiKeys.list({
          limit: optInt(flags.limit, 'limit'),
          cursor: flags.cursor,
          accountId: flags.account === undefined ? undefined : await accountId(flags.account),
        }),
        KEY_COLUMNS,
      );
    case 'keys get':
      return one(await admin.apiKeys.get(target()));
    case 'keys update':
      return one(
        await admin.apiKeys.update(
          target(),
          defined({
            name: flags.name,
            credit_limit: nullable(flags['credit-limit'], (v) => num(v, 'credit-limit')),
            group_id: flags.group === undefined ? undefined : await groupId(flags.group),
            is_active: bool(flags.active, 'active'),
          }),
        ),
      );

    case 'groups create':
      return one(await admin.groups.create(defined({ name: required(flags.name, 'name'), description: flags.description })));
    case 'groups list':
      return page(await admin.groups.list({ limit: optInt(flags.limit, 'limit'), cursor: flags.cursor }), GROUP_COLUMNS);
    case 'groups get':
      return one(await admin.groups.resolve(target()));
    case 'groups update':
      return one(
        await admin.groups.update(
          await groupId(target()),
          defined({ name: flags.name, description: nullable(flags.description, (v) => v) }),
        ),
      );

    case 'members add': {
      const group = await groupId(required(flags.group, 'group'));
      const member = await admin.groups.createMember(
        group,
        defined({
          name: required(flags.name, 'name'),
          provider: oneOf(required(flags.provider, 'provider'), 'provider', ['local', 'openai', 'gemini', 'ark', 'kling'] as const)!,
          models: list(required(flags.models, 'models'))!,
          credentials: credentials(flags.credential),
          base_url: flags['base-url'],
          priority: optInt(flags.priority, 'priority'),
          weight: optInt(flags.weight, 'weight'),
          concurrency_limit: nullable(flags['concurrency-limit'], (v) => int(v, 'concurrency-limit')),
          enabled: bool(flags.enabled, 'enabled'),
        }),
      );
      return one(member);
    }
    case 'members list': {
      const members = await admin.groups.listMembers(await groupId(required(flags.group, 'group')));
      return { json: members, text: table(members.data as unknown as Row[], MEMBER_COLUMNS) };
    }
    case 'members update': {
      if (flags.provider !== undefined) throw new UsageError('the provider of a member cannot change; add a new member instead');
      const group = await groupId(required(flags.group, 'group'));
      const ref = target();
      const members = (await admin.groups.listMembers(group)).data;
      const member = members.find((m) => m.id === ref) ?? members.find((m) => m.name === ref);
      if (!member) throw new ApiError(404, 'member_not_found', `The group has no member with the id or name '${ref}'.`);
      return one(
        await admin.groups.updateMember(
          group,
          member.id,
          defined({
            name: flags.name,
            models: list(flags.models),
            credentials: credentials(flags.credential),
            base_url: nullable(flags['base-url'], (v) => v),
            priority: optInt(flags.priority, 'priority'),
            weight: optInt(flags.weight, 'weight'),
            concurrency_limit: nullable(flags['concurrency-limit'], (v) => int(v, 'concurrency-limit')),
            enabled: bool(flags.enabled, 'enabled'),
          }),
        ),
      );
    }

    case 'models list': {
      const models = await admin.catalog.list(oneOf(flags.kind, 'kind', ['image', 'video'] as const));
      return { json: models, text: table(models.data as unknown as Row[], MODEL_COLUMNS) };
    }
    case 'models get': {
      const model = await admin.catalog.get(target());
      return { json: model, text: modelText(model) };
    }
    case 'models set-price': {
      const id = target();
      const resolution = required(flags.resolution, 'resolution');
      const quality = oneOf(flags.quality, 'quality', ['low', 'medium', 'high'] as const) ?? null;
      const price = num(required(flags.price, 'price'), 'price');
      const mode = oneOf(flags.mode, 'mode', ['per_second', 'per_item'] as const);
      const current = await admin.catalog.get(id);
      const row = current.pricing.find((p) => p.resolution === resolution && p.quality === quality);
      if (!row) {
        const slots = current.pricing.map((p) => (p.quality ? `${p.resolution}/${p.quality}` : p.resolution)).join(', ');
        throw new UsageError(`${id} has no price row for ${quality ? `${resolution}/${quality}` : resolution} (rows: ${slots})`);
      }
      const pricing: AdminPriceRow[] = current.pricing.map((p) => (p === row ? { ...p, unit_price: price, mode: mode ?? p.mode } : p));
      const model = await admin.catalog.update(id, { pricing });
      return { json: model, text: modelText(model) };
    }
    case 'models set-reference-limit': {
      const model = await admin.catalog.update(target(), { reference_image_max_count: int(required(flags.count, 'count'), 'count') });
      return { json: model, text: modelText(model) };
    }
    case 'models enable':
    case 'models disable': {
      const model = await admin.catalog.update(target(), { enabled: verb === 'enable' });
      return { json: model, text: modelText(model) };
    }

    case 'switches list': {
      const switches = await admin.switches.list();
      return { json: switches, text: table(switches.data as unknown as Row[], SWITCH_COLUMNS) };
    }
    case 'switches set': {
      const name = target();
      const state = flags.enabled ?? args[1];
      const enabled = bool(required(state, 'enabled'), 'enabled');
      return one(await admin.switches.set(name, enabled!));
    }
    default:
      throw new UsageError(`unknown command '${[resource, verb].filter(Boolean).join(' ')}'`);
  }
}

// ---------- main ----------

// Progress of the embedded database goes to stderr, so that --json output stays parseable.
const log: DbLogger = {
  info: (msg) => process.stderr.write(`${msg}\n`),
  warn: (msg) => process.stderr.write(`${msg}\n`),
};
const quiet: DbLogger = { info: () => {}, warn: log.warn };

async function main(argv: string[]): Promise<void> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values: flags, positionals } = parsed;
  const [resource, verb, ...args] = positionals;
  if (flags.help || resource === undefined || resource === 'help') {
    console.log(USAGE);
    return;
  }
  if (!['accounts', 'keys', 'groups', 'members', 'models', 'switches'].includes(resource)) {
    throw new UsageError(`unknown resource '${resource}'`);
  }

  const databaseUrl = process.env.DATABASE_URL?.trim() || undefined;
  const dataDir = process.env.MEDIAGATE_DATA_DIR?.trim() || './.mediagate';
  const embedded = databaseUrl ? undefined : await connectOrStartEmbedded(dataDir, log);
  const db = createDatabase(databaseUrl ?? embedded!.url, { max: 2, applicationName: 'mediagate-admin-cli' });
  try {
    await migrateToLatest(db, quiet);
    const admin = createAdminServices({
      db,
      // Loaded only when credentials are stored; with DATABASE_URL it must come from the environment.
      secretKey: () => loadSecretKey({ envValue: process.env.MEDIAGATE_SECRET_KEY, dataDir: databaseUrl ? undefined : dataDir }),
      // Other processes' key caches expire on their own within KEY_CACHE_TTL_MS (at most 5 s).
      auth: { invalidate: () => {} },
    });
    const output = await run(admin, resource, verb, args, flags);
    console.log(flags.json ? JSON.stringify(output.json, null, 2) : output.text);
  } finally {
    await db.destroy();
    if (embedded?.started) await embedded.stop();
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (err instanceof UsageError) {
    console.error(`error: ${err.message}\nRun 'npm run admin -- --help' for usage.`);
    process.exitCode = 2;
  } else if (err instanceof ApiError) {
    console.error(`error: ${err.message} (${err.code}${err.param ? `, ${err.param}` : ''})`);
    process.exitCode = 1;
  } else {
    console.error(`error: ${err instanceof Error ? err.message : String(err)}`);
    process.exitCode = 1;
  }
});
