// The CLI's words for the admin API's: the services and the contract check name a body's fields
// (`group_id`), the CLI's user typed flags (`--group`). A command's errors are told in its flags.
import { ApiError } from '../../server/errors.ts';
import type { Flags } from './args.ts';

const LIMITS = { requests_per_minute: 'rpm', max_in_flight: 'max-in-flight' };

/** The flag each body field of a resource's commands comes from, by resource (or `resource verb` where a verb differs). */
const FLAG_OF_FIELD: Record<string, Record<string, string>> = {
  accounts: {
    name: 'name',
    status: 'status',
    initial_credits: 'initial-credits',
    output_retention_days: 'output-retention-days',
    input_retention_days: 'input-retention-days',
    amount: 'amount',
    reason: 'reason',
    idempotency_key: 'idempotency-key',
    ...LIMITS,
  },
  keys: { account_id: 'account', name: 'name', credit_limit: 'credit-limit', group_id: 'group', is_active: 'active', ...LIMITS },
  groups: { name: 'name', description: 'description' },
  members: {
    name: 'name',
    provider: 'provider',
    models: 'models',
    model_map: 'model-map',
    credentials: 'credential',
    base_url: 'base-url',
    priority: 'priority',
    weight: 'weight',
    concurrency_limit: 'concurrency-limit',
    enabled: 'enabled',
  },
  models: {
    id: 'id',
    display_name: 'display-name',
    enabled: 'enabled',
    pricing: 'price',
    reference_image_max_count: 'reference-limit',
    resize: 'resize',
    edits: 'edits',
    custom_size_ratios: 'custom-size-ratios',
    min_edge: 'min-edge',
    max_edge: 'max-edge',
  },
  'models set-reference-limit': { reference_image_max_count: 'count' },
};

/**
 * `err` with the fields it names (its `param`, and each one quoted in its message) given as the
 * command's flags: "send 'group_id'" becomes "pass --group". A body read from a file (`--file`,
 * `--from`) names its own fields, so only the flags given are named then. A field whose name is
 * also a value typed on the command line (an account named 'name') is left as it is: the quote may
 * be the value.
 */
export function inFlagTerms(err: ApiError, resource: string, verb: string, args: string[], flags: Flags): ApiError {
  const table = { ...FLAG_OF_FIELD[resource], ...FLAG_OF_FIELD[`${resource} ${verb}`] };
  const fromFile = flags.file !== undefined || flags.from !== undefined;
  const typed = new Set<unknown>([...args, ...Object.values(flags).flat()]);
  const flagOf = (field: string): string | undefined => {
    const flag = Object.hasOwn(table, field) ? table[field] : undefined;
    if (flag === undefined || typed.has(field)) return undefined;
    return !fromFile || flags[flag as keyof Flags] !== undefined ? `--${flag}` : undefined;
  };
  let message = err.message;
  for (const field of Object.keys(table)) {
    const flag = flagOf(field);
    if (flag) message = message.replaceAll(`send '${field}'`, `pass ${flag}`).replaceAll(`'${field}'`, flag);
  }
  const param = err.param === null ? null : (flagOf(err.param) ?? err.param);
  if (message === err.message && param === err.param) return err;
  // The same class (InvalidBody: exit code 2).
  const Same = err.constructor as new (...args: ConstructorParameters<typeof ApiError>) => ApiError;
  return new Same(err.status, err.code, message, param, err.extra, err.headers);
}
