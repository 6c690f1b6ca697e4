/** Admin rules for backend groups and their members (upstream provider accounts). */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, badRequest, conflict } from '../../errors.ts';
import type { CatalogRepository } from '../../repositories/catalog.repository.ts';
import type { GroupRepository, MemberValues } from '../../repositories/group.repository.ts';
import { newId } from '../../lib/ids.ts';
import { PROVIDERS, type ProviderKind } from '../../providers/registry.ts';
import { encryptSecret } from '../../lib/secret-box.ts';
import { toAdminGroup, toAdminGroupMember, type AdminGroup, type AdminGroupMember } from './admin-mappers.ts';
import { decodeNameCursor, encodeNameCursor, pageSize, splitPage } from './cursor.ts';

type Schemas = components['schemas'];
export type GroupCreateInput = Schemas['AdminGroupCreate'];
export type GroupUpdateInput = Schemas['AdminGroupUpdate'];
type MemberDefaults = 'enabled' | 'priority' | 'weight';
export type MemberCreateInput = Omit<Schemas['AdminGroupMemberCreate'], MemberDefaults> & Partial<Pick<Schemas['AdminGroupMemberCreate'], MemberDefaults>>;
export type MemberUpdateInput = Schemas['AdminGroupMemberUpdate'];
type Credentials = Schemas['AdminMemberCredentials'];

export const groupNotFound = (param: string | null = null) => new ApiError(404, 'group_not_found', 'No backend group has this id.', param);
const memberNotFound = () => new ApiError(404, 'member_not_found', 'This group has no member with this id.');

/** `format: uri` also admits e.g. `ftp:` URLs; upstreams are reached over HTTP(S) only (a DB check too). */
function checkBaseUrl(baseUrl: string | null | undefined): void {
  if (baseUrl !== undefined && baseUrl !== null && !/^https?:\/\//i.test(baseUrl)) {
    throw badRequest('invalid_request', "'base_url' must be an http:// or https:// URL.", 'base_url');
  }
}

/** Credentials must carry exactly the names the provider uses (a typo would only show at the first job). */
function checkCredentials(provider: ProviderKind, credentials: Credentials): void {
  const needed = PROVIDERS[provider].credentials;
  const missing = needed.filter((name) => !(name in credentials));
  const unknown = Object.keys(credentials).filter((name) => !needed.includes(name));
  if (missing.length > 0 || unknown.length > 0) {
    const problems = [missing.length > 0 && `missing ${missing.join(', ')}`, unknown.length > 0 && `unknown ${unknown.join(', ')}`].filter(Boolean).join('; ');
    throw badRequest('invalid_request', `Credentials of provider '${provider}' are ${needed.join(' and ')} (${problems}).`, 'credentials');
  }
}

/** Every key of the model map must be a model the member serves (else the mapping could never apply). */
function checkModelMap(models: readonly string[], modelMap: Record<string, string> | undefined): void {
  if (modelMap === undefined) return;
  const stray = Object.keys(modelMap).filter((id) => !models.includes(id));
  if (stray.length > 0) throw badRequest('invalid_request', `'model_map' names models the member does not serve: ${stray.join(', ')}; add them to 'models' first.`, 'model_map');
}

export class GroupAdminService {
  constructor(
    private readonly groups: GroupRepository,
    private readonly catalog: CatalogRepository,
    private readonly secretKey: () => Buffer,
  ) {}

  async create(input: GroupCreateInput): Promise<AdminGroup> {
    const row = await this.groups.insert({ id: newId('grp'), name: input.name, description: input.description ?? null });
    if (!row) throw conflict('conflict', `A group named '${input.name}' already exists.`, {}, 'name');
    return toAdminGroup(row);
  }

  async list(opts: { limit?: number; cursor?: string }): Promise<Schemas['AdminGroupList']> {
    const limit = pageSize(opts.limit);
    const afterName = opts.cursor === undefined ? undefined : decodeNameCursor('groups', opts.cursor);
    const rows = await this.groups.list({ limit: limit + 1, afterName });
    const { page, last } = splitPage(rows, limit);
    return { data: page.map(toAdminGroup), next_cursor: last ? encodeNameCursor('groups', last.name) : null };
  }

  async get(id: string): Promise<AdminGroup> {
    const row = await this.groups.findById(id);
    if (!row) throw groupNotFound();
    return toAdminGroup(row);
  }

  /** Looks a group up by id, or else by its unique name (CLI convenience). */
  async resolve(idOrName: string): Promise<AdminGroup> {
    const row = (await this.groups.findById(idOrName)) ?? (await this.groups.findByName(idOrName));
    if (!row) throw new ApiError(404, 'group_not_found', `No backend group has the id or name '${idOrName}'.`);
    return toAdminGroup(row);
  }

  async update(id: string, input: GroupUpdateInput): Promise<AdminGroup> {
    if (input.name === undefined && input.description === undefined) throw badRequest('invalid_request', 'Send at least one of name and description.');
    await this.requireGroup(id);
    if (input.name !== undefined) {
      const holder = await this.groups.findByName(input.name);
      if (holder && holder.id !== id) throw conflict('conflict', `A group named '${input.name}' already exists.`, {}, 'name');
    }
    const row = await this.groups.update(id, { name: input.name, description: input.description });
    if (!row) throw groupNotFound();
    return toAdminGroup(row);
  }

  async listMembers(groupId: string): Promise<Schemas['AdminGroupMemberList']> {
    await this.requireGroup(groupId);
    return { data: (await this.groups.listMembers(groupId)).map(toAdminGroupMember) };
  }

  async createMember(groupId: string, input: MemberCreateInput): Promise<AdminGroupMember> {
    await this.requireGroup(groupId);
    const needed = PROVIDERS[input.provider].credentials;
    if (needed.length === 0) this.rejectForCredentialFree(input.provider, input);
    else if (input.credentials === undefined) {
      throw badRequest('invalid_request', `Provider '${input.provider}' needs 'credentials' (${needed.join(', ')}).`, 'credentials');
    } else checkCredentials(input.provider, input.credentials);
    checkBaseUrl(input.base_url);
    await this.requireModels(input.models, input.provider);
    checkModelMap(input.models, input.model_map);
    const values: MemberValues = {
      name: input.name,
      provider: input.provider,
      baseUrl: input.base_url ?? null,
      credentialsCiphertext: input.credentials === undefined ? null : this.encrypt(input.credentials),
      enabled: input.enabled ?? true,
      models: input.models,
      modelMap: input.model_map ?? {},
      priority: input.priority ?? 0,
      weight: input.weight ?? 1,
      concurrencyLimit: input.concurrency_limit ?? null,
    };
    const row = await this.groups.insertMember({ id: newId('mem'), groupId, ...values });
    if (!row) throw conflict('conflict', `The group already has a member named '${input.name}'.`, {}, 'name');
    return toAdminGroupMember(row);
  }

  async updateMember(groupId: string, memberId: string, input: MemberUpdateInput): Promise<AdminGroupMember> {
    if (Object.values(input).every((v) => v === undefined)) throw badRequest('invalid_request', 'Send at least one member to change.');
    // The contract has no `provider` here; the CLI or a caller skipping validation gets a clear 400.
    if ('provider' in input) throw badRequest('invalid_request', 'The provider of a member cannot change; add a new member instead.', 'provider');
    await this.requireGroup(groupId);
    const member = await this.groups.findMember(groupId, memberId);
    if (!member) throw memberNotFound();
    const provider = member.provider as ProviderKind;
    if (PROVIDERS[provider].credentials.length === 0) this.rejectForCredentialFree(provider, input);
    else if (input.credentials !== undefined) checkCredentials(provider, input.credentials);
    checkBaseUrl(input.base_url);
    if (input.models !== undefined) await this.requireModels(input.models, provider);
    // A new model list drops mappings of models no longer served; a new map must fit the list.
    const models = input.models ?? member.models;
    checkModelMap(models, input.model_map);
    const modelMap =
      input.model_map ?? (input.models === undefined ? undefined : Object.fromEntries(Object.entries(member.modelMap).filter(([id]) => models.includes(id))));
    if (input.name !== undefined) {
      const holder = await this.groups.findMemberByName(groupId, input.name);
      if (holder && holder.id !== memberId) throw conflict('conflict', `The group already has a member named '${input.name}'.`, {}, 'name');
    }
    const row = await this.groups.updateMember(groupId, memberId, {
      name: input.name,
      baseUrl: input.base_url,
      credentialsCiphertext: input.credentials === undefined ? undefined : this.encrypt(input.credentials),
      enabled: input.enabled,
      models: input.models,
      modelMap,
      priority: input.priority,
      weight: input.weight,
      concurrencyLimit: input.concurrency_limit,
    });
    if (!row) throw memberNotFound();
    return toAdminGroupMember(row);
  }

  /** Deletes a disabled member that runs no unfinished task (else 409 member_in_use: disable it, then delete it once they have finished). */
  async deleteMember(groupId: string, memberId: string): Promise<void> {
    await this.requireGroup(groupId);
    const result = await this.groups.deleteMember(groupId, memberId);
    if (!result) throw memberNotFound();
    if (result.enabled) {
      throw new ApiError(409, 'member_in_use', `Member '${memberId}' is enabled and may take new work; set enabled: false first, and delete it once the tasks it runs have finished.`);
    }
    if (!result.deleted) {
      const tasks = result.running === 1 ? '1 task that has not finished runs' : `${result.running} tasks that have not finished run`;
      throw new ApiError(409, 'member_in_use', `${tasks} on member '${memberId}'; set enabled: false (no new work goes to it) and delete it once they have finished.`);
    }
  }

  private async requireGroup(groupId: string): Promise<void> {
    if (!(await this.groups.findById(groupId))) throw groupNotFound();
  }

  /**
   * Every model exists in the catalog, and is of a kind the member's provider runs: a video-only
   * provider listing an image model would be shown serving it while every request for it answers
   * `503 no_reachable_member`.
   */
  private async requireModels(models: readonly string[], provider: ProviderKind): Promise<void> {
    const kinds = await this.catalog.modelKinds(models);
    const unknown = models.filter((id) => !kinds.has(id));
    if (unknown.length > 0) {
      throw new ApiError(404, 'model_not_found', `Unknown catalog model${unknown.length > 1 ? 's' : ''}: ${unknown.join(', ')}.`, 'models');
    }
    const runs = PROVIDERS[provider].kinds;
    const other = models.filter((id) => !runs.includes(kinds.get(id) as 'image' | 'video'));
    if (other.length > 0) {
      throw badRequest(
        'invalid_request',
        `Provider '${provider}' runs ${runs.join(' and ')} models only; ${other.map((id) => `'${id}' is ${kinds.get(id) === 'image' ? 'an image' : 'a video'} model`).join(', ')}.`,
        'models',
      );
    }
  }

  /** A provider that runs on this machine (`local`): a base URL or credentials would be silently ignored, so refuse them. */
  private rejectForCredentialFree(provider: string, input: { base_url?: string | null; credentials?: Credentials }): void {
    if (input.base_url !== undefined && input.base_url !== null) {
      throw badRequest('invalid_request', `The '${provider}' provider takes no 'base_url'.`, 'base_url');
    }
    if (input.credentials !== undefined) throw badRequest('invalid_request', `The '${provider}' provider takes no 'credentials'.`, 'credentials');
  }

  private encrypt(credentials: Credentials): Buffer {
    return encryptSecret(this.secretKey(), JSON.stringify(credentials));
  }
}
