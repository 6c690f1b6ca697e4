/** Admin rules for API keys: issue (the full key once), list, get, update. */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, badRequest } from '../../errors.ts';
import type { AccountRepository } from '../../repositories/account.repository.ts';
import type { ApiKeyAdminRepository } from '../../repositories/api-key-admin.repository.ts';
import type { GroupRepository } from '../../repositories/group.repository.ts';
import { generateApiKey } from '../../lib/api-key-material.ts';
import { newId } from '../../lib/ids.ts';
import { accountNotFound, microCredits } from './account-admin.service.ts';
import { toAdminApiKey, type AdminApiKey } from './admin-mappers.ts';
import { storedOf } from '../limits/client-limits.ts';
import { decodeCreatedAtCursor, encodeCreatedAtCursor, pageSize, splitPage } from './cursor.ts';
import { groupNotFound } from './group-admin.service.ts';

type Schemas = components['schemas'];
export type ApiKeyCreateInput = Schemas['AdminApiKeyCreate'];
export type ApiKeyUpdateInput = Schemas['AdminApiKeyUpdate'];

/** Keys created without `group_id` join the group with this name. */
export const DEFAULT_GROUP_NAME = 'default';

const apiKeyNotFound = () => new ApiError(404, 'api_key_not_found', 'No API key has this id.');

function creditLimit(value: number | null | undefined): number | null {
  if (value === undefined || value === null) return null;
  const micro = microCredits(value, 'credit_limit');
  if (micro < 0) throw badRequest('invalid_request', "'credit_limit' must not be negative.", 'credit_limit');
  return micro;
}

export class ApiKeyAdminService {
  constructor(
    private readonly keys: ApiKeyAdminRepository,
    private readonly accounts: AccountRepository,
    private readonly groups: GroupRepository,
  ) {}

  /** Issues a key. The result is the only place the full key ever appears. */
  async create(input: ApiKeyCreateInput): Promise<Schemas['AdminApiKeyCreated']> {
    const limit = creditLimit(input.credit_limit);
    if (!(await this.accounts.findById(input.account_id))) throw accountNotFound('account_id');
    const groupId = await this.groupIdFor(input.group_id);
    const material = generateApiKey();
    const row = await this.keys.insert({
      id: newId('key'),
      accountId: input.account_id,
      groupId,
      name: input.name,
      keyHash: material.hash,
      keyPrefix: material.prefix,
      lastFour: material.lastFour,
      creditLimit: limit,
      requestsPerMinute: storedOf(input.requests_per_minute, 'requests_per_minute'),
      maxInFlight: storedOf(input.max_in_flight, 'max_in_flight'),
    });
    return { ...toAdminApiKey(row), key: material.key };
  }

  async list(opts: { limit?: number; cursor?: string; accountId?: string }): Promise<Schemas['AdminApiKeyList']> {
    const limit = pageSize(opts.limit);
    const after = opts.cursor === undefined ? undefined : decodeCreatedAtCursor('api_keys', opts.cursor);
    const rows = await this.keys.list({ limit: limit + 1, accountId: opts.accountId, after });
    const { page, last } = splitPage(rows, limit);
    return { data: page.map(toAdminApiKey), next_cursor: last ? encodeCreatedAtCursor('api_keys', last) : null };
  }

  async get(id: string): Promise<AdminApiKey> {
    const row = await this.keys.findById(id);
    if (!row) throw apiKeyNotFound();
    return toAdminApiKey(row);
  }

  async update(id: string, input: ApiKeyUpdateInput): Promise<AdminApiKey> {
    if (Object.values(input).every((v) => v === undefined)) throw badRequest('invalid_request', 'Send at least one member to change.');
    const patch: { name?: string; creditLimit?: number | null; groupId?: string; isActive?: boolean; requestsPerMinute?: number | null; maxInFlight?: number | null } = {
      name: input.name,
      isActive: input.is_active,
      requestsPerMinute: storedOf(input.requests_per_minute, 'requests_per_minute'),
      maxInFlight: storedOf(input.max_in_flight, 'max_in_flight'),
    };
    if (input.credit_limit !== undefined) patch.creditLimit = creditLimit(input.credit_limit);
    if (input.group_id !== undefined) {
      if (!(await this.keys.findById(id))) throw apiKeyNotFound();
      if (!(await this.groups.findById(input.group_id))) throw groupNotFound('group_id');
      patch.groupId = input.group_id;
    }
    const row = await this.keys.update(id, patch);
    if (!row) throw apiKeyNotFound();
    return toAdminApiKey(row);
  }

  private async groupIdFor(groupId: string | undefined): Promise<string> {
    if (groupId !== undefined) {
      const group = await this.groups.findById(groupId);
      if (!group) throw groupNotFound('group_id');
      return group.id;
    }
    const fallback = await this.groups.findByName(DEFAULT_GROUP_NAME);
    if (!fallback) {
      throw badRequest('invalid_request', `No group is named '${DEFAULT_GROUP_NAME}': send 'group_id' to choose the key's backend group.`, 'group_id');
    }
    return fallback.id;
  }
}
