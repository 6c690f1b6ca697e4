// What every admin command receives and returns; the resource modules only fill in the commands.
import type { AdminServices } from '../../server/services/admin/index.ts';
import { UsageError, type Flags } from './args.ts';
import type { Output } from './output.ts';

export interface CommandContext {
  admin: AdminServices;
  resource: string;
  verb: string;
  /** Positionals after the verb. */
  args: string[];
  flags: Flags;
  /** The command's subject: --id, else the first positional; a UsageError when neither is given. */
  target(): string;
  /** Resolves an account by id or name to its id (404 from the service when unknown). */
  accountId(value: string): Promise<string>;
  /** Resolves a group by id or name to its id (404 from the service when unknown). */
  groupId(value: string): Promise<string>;
}

export type Command = (ctx: CommandContext) => Promise<Output>;

/** One resource's commands, by verb. */
export type Commands = Record<string, Command>;

export function commandContext(admin: AdminServices, resource: string, verb: string, args: string[], flags: Flags): CommandContext {
  return {
    admin,
    resource,
    verb,
    args,
    flags,
    target: () => flags.id ?? args[0] ?? (() => { throw new UsageError(`${resource} ${verb} needs an id`); })(),
    accountId: async (value) => (await admin.accounts.resolve(value)).id,
    groupId: async (value) => (await admin.groups.resolve(value)).id,
  };
}
