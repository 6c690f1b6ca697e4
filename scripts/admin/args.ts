// Command-line parsing of the admin CLI: the flag table, parseArgs, and the helpers that turn
// flag strings into typed values. Every mistake is a UsageError (exit code 2).
import { parseArgs } from 'node:util';

/** A mistake in the command line itself (exit code 2, with a pointer to the usage). */
export class UsageError extends Error {}

const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  id: { type: 'string' },
  name: { type: 'string' },
  status: { type: 'string' },
  'initial-credits': { type: 'string' },
  'output-retention-days': { type: 'string' },
  'input-retention-days': { type: 'string' },
  amount: { type: 'string' },
  reason: { type: 'string' },
  'idempotency-key': { type: 'string' },
  account: { type: 'string' },
  group: { type: 'string' },
  'credit-limit': { type: 'string' },
  rpm: { type: 'string' },
  'max-in-flight': { type: 'string' },
  active: { type: 'string' },
  description: { type: 'string' },
  provider: { type: 'string' },
  models: { type: 'string' },
  'model-map': { type: 'string' },
  credential: { type: 'string', multiple: true },
  'base-url': { type: 'string' },
  priority: { type: 'string' },
  weight: { type: 'string' },
  'concurrency-limit': { type: 'string' },
  enabled: { type: 'string' },
  kind: { type: 'string' },
  resolution: { type: 'string' },
  quality: { type: 'string' },
  price: { type: 'string', multiple: true },
  mode: { type: 'string' },
  count: { type: 'string' },
  from: { type: 'string' },
  file: { type: 'string' },
  'display-name': { type: 'string' },
  'reference-limit': { type: 'string' },
  resize: { type: 'string' },
  edits: { type: 'string' },
  'custom-size-ratios': { type: 'string' },
  'min-edge': { type: 'string' },
  'max-edge': { type: 'string' },
  limit: { type: 'string' },
  cursor: { type: 'string' },
  key: { type: 'string' },
  task: { type: 'string' },
  model: { type: 'string' },
  member: { type: 'string' },
  after: { type: 'string' },
  before: { type: 'string' },
  to: { type: 'string' },
  'group-by': { type: 'string' },
  granularity: { type: 'string' },
  csv: { type: 'boolean' },
} as const;

export type Flags = ReturnType<typeof parse>['values'];

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

/** Strict: an unknown flag or a missing flag value throws (parseArgs' own error). */
export function parse(argv: string[]) {
  return parseArgs({ args: joinNegativeValues(argv), options: OPTIONS, allowPositionals: true, strict: true });
}

// ---------- flag helpers ----------

export function required(value: string | undefined, flag: string): string {
  if (value === undefined || value === '') throw new UsageError(`--${flag} is required`);
  return value;
}

export function num(value: string, flag: string): number {
  if (!/^-?\d+(\.\d+)?$/.test(value.trim())) throw new UsageError(`--${flag} must be a number, got '${value}'`);
  return Number(value);
}

export function int(value: string, flag: string): number {
  if (!/^\d+$/.test(value.trim())) throw new UsageError(`--${flag} must be a whole number, got '${value}'`);
  return Number(value);
}

export function optNum(value: string | undefined, flag: string): number | undefined {
  return value === undefined ? undefined : num(value, flag);
}

export function optInt(value: string | undefined, flag: string): number | undefined {
  return value === undefined ? undefined : int(value, flag);
}

/** `none` (or `null`) means no value, e.g. an unlimited quota. */
export function nullable<T>(value: string | undefined, convert: (v: string) => T): T | null | undefined {
  if (value === undefined) return undefined;
  return ['none', 'null', 'unlimited'].includes(value.trim().toLowerCase()) ? null : convert(value);
}

/** A client limit: a whole number, `none` (no limit) or `default` (the operator's DEFAULT_* setting). */
export function limitSetting(value: string | undefined, flag: string): number | null | 'default' | undefined {
  if (value === undefined) return undefined;
  const v = value.trim().toLowerCase();
  if (v === 'default') return 'default';
  if (['none', 'null', 'unlimited'].includes(v)) return null;
  const n = int(value, flag);
  if (n < 1) throw new UsageError(`--${flag} must be at least 1, or none (no limit) or default, got '${value}'`);
  return n;
}

export function bool(value: string | undefined, flag: string): boolean | undefined {
  if (value === undefined) return undefined;
  const v = value.trim().toLowerCase();
  if (['true', 'yes', 'on', '1'].includes(v)) return true;
  if (['false', 'no', 'off', '0'].includes(v)) return false;
  throw new UsageError(`--${flag} must be true or false, got '${value}'`);
}

export function oneOf<T extends string>(value: string | undefined, flag: string, allowed: readonly T[]): T | undefined {
  if (value === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(value)) throw new UsageError(`--${flag} must be one of ${allowed.join(', ')}, got '${value}'`);
  return value as T;
}

export function credentials(pairs: string[] | undefined): Record<string, string> | undefined {
  if (pairs === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new UsageError(`--credential must look like name=value (e.g. api_key=sk-...)`);
    // `api_key=$OPENAI_API_KEY` with the variable unset: the shape is right, the value is missing.
    if (eq === pair.length - 1) throw new UsageError(`--credential ${pair}: the value of ${pair.slice(0, eq)} is empty`);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

/** `--model-map image-pro=gpt-image-1.5,other=x` -> { 'image-pro': 'gpt-image-1.5', other: 'x' }; `none` clears it. */
export function modelMap(value: string | undefined): Record<string, string> | undefined {
  if (value === undefined) return undefined;
  if (value === 'none') return {};
  const out: Record<string, string> = {};
  for (const pair of list(value)!) {
    const eq = pair.indexOf('=');
    if (eq <= 0 || eq === pair.length - 1) throw new UsageError('--model-map must look like catalog-model=upstream-model[,…] (e.g. image-pro=gpt-image-1.5), or none');
    out[pair.slice(0, eq).trim()] = pair.slice(eq + 1).trim();
  }
  return out;
}

/** `a, b,,c` -> ['a', 'b', 'c']. */
export function list(value: string | undefined): string[] | undefined {
  return value?.split(',').map((s) => s.trim()).filter(Boolean);
}

/** Drops undefined members, so "send at least one member" checks see only what was given. */
export function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}
