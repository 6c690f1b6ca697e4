/** Pure mappers: repository rows -> the contract's Admin* objects (money as decimal credits). */
import type { components } from '../../../generated/api.d.ts';
import type { ImageCapabilities, VideoCapabilities } from '../../catalog/capabilities.ts';
import type { AccountRow, LedgerEntryRow } from '../../repositories/account.repository.ts';
import type { ApiKeyAdminRow } from '../../repositories/api-key-admin.repository.ts';
import { settingOf } from '../limits/client-limits.ts';
import type { CapabilitySwitchRow } from '../../repositories/capability-switch.repository.ts';
import type { CatalogModelWithPrices, PriceRowRecord } from '../../repositories/catalog.repository.ts';
import type { GroupRow, MemberRow } from '../../repositories/group.repository.ts';
import { toCredits } from '../../lib/money.ts';

type Schemas = components['schemas'];
export type AdminAccount = Schemas['AdminAccount'];
export type AdminLedgerEntry = Schemas['AdminLedgerEntry'];
export type AdminApiKey = Schemas['AdminApiKey'];
export type AdminGroup = Schemas['AdminGroup'];
export type AdminGroupMember = Schemas['AdminGroupMember'];
export type AdminCatalogModel = Schemas['AdminCatalogModel'];
export type AdminPriceRow = Schemas['AdminPriceRow'];
export type AdminImageModelCapabilities = Schemas['AdminImageModelCapabilities'];
export type AdminVideoModelCapabilities = Schemas['AdminVideoModelCapabilities'];
export type AdminCapabilitySwitch = Schemas['AdminCapabilitySwitch'];
export type AdminCapabilityName = Schemas['AdminCapabilityName'];

const iso = (d: Date) => d.toISOString();

/** The contract's maxLength of a member-health reason (AdminMemberHealth). */
const REASON_MAX = 400;

/**
 * A member-health reason within the contract's length. The upstream's words (sanitized to 300
 * characters) come with a prefix of ours (`HTTP 422 code: …`, `fal refused the input that the
 * mapping made for … (…)`), so the whole can be longer; cut here, where every reason passes,
 * including those written before. Counted in code points, as the validator counts them.
 */
function reasonOf(text: string): string {
  const chars = Array.from(text);
  return chars.length <= REASON_MAX ? text : `${chars.slice(0, REASON_MAX - 3).join('')}...`;
}

export function toAdminAccount(row: AccountRow): AdminAccount {
  return {
    id: row.id,
    name: row.name,
    status: row.status as AdminAccount['status'],
    balance: toCredits(row.balance),
    total_earned: toCredits(row.totalEarned),
    total_spent: toCredits(row.totalSpent),
    output_retention_days: row.outputRetentionDays,
    input_retention_days: row.inputRetentionDays,
    requests_per_minute: settingOf(row.requestsPerMinute),
    max_in_flight: settingOf(row.maxInFlight),
    created_at: iso(row.createdAt),
    updated_at: iso(row.updatedAt),
  };
}

/**
 * The ledger stores positive amounts; the API shows the signed change of a debit (negative), and
 * what each entry did to the available balance: + grant/release, - debit/hold, 0 capture.
 */
export function toAdminLedgerEntry(row: LedgerEntryRow): AdminLedgerEntry {
  const kind = row.kind as AdminLedgerEntry['kind'];
  const credits = toCredits(row.amount);
  const balanceChange = kind === 'grant' || kind === 'release' ? credits : kind === 'capture' ? 0 : -credits;
  return {
    id: `led_${row.id}`,
    kind,
    amount: kind === 'debit' ? -credits : credits,
    balance_change: balanceChange,
    account_id: row.accountId,
    api_key_id: row.apiKeyId,
    task_id: row.taskId,
    hold_id: row.holdId,
    reason: row.reason,
    created_at: iso(row.createdAt),
  };
}

export function toAdminApiKey(row: ApiKeyAdminRow): AdminApiKey {
  const limit = row.creditLimit;
  return {
    id: row.id,
    account_id: row.accountId,
    group_id: row.groupId,
    name: row.name,
    key_prefix: row.keyPrefix,
    last_four: row.lastFour,
    is_active: row.isActive,
    credit_limit: limit === null ? null : toCredits(limit),
    credits_used: toCredits(row.creditsUsed),
    credits_remaining: limit === null ? null : toCredits(Math.max(0, limit - row.creditsUsed)),
    unlimited: limit === null,
    requests_per_minute: settingOf(row.requestsPerMinute),
    max_in_flight: settingOf(row.maxInFlight),
    last_used_at: row.lastUsedAt === null ? null : iso(row.lastUsedAt),
    created_at: iso(row.createdAt),
  };
}

export function toAdminGroup(row: GroupRow): AdminGroup {
  return {
    id: row.id,
    name: row.name,
    description: row.description,
    member_count: row.memberCount,
    created_at: iso(row.createdAt),
    updated_at: iso(row.updatedAt),
  };
}

export function toAdminGroupMember(row: MemberRow): AdminGroupMember {
  return {
    id: row.id,
    group_id: row.groupId,
    name: row.name,
    provider: row.provider as AdminGroupMember['provider'],
    base_url: row.baseUrl,
    enabled: row.enabled,
    models: row.models,
    model_map: row.modelMap,
    priority: row.priority,
    weight: row.weight,
    concurrency_limit: row.concurrencyLimit,
    has_credentials: row.hasCredentials,
    health: {
      in_flight: row.health.inFlight,
      cooldown_until: row.health.cooldownUntil && row.health.cooldownUntil > new Date() ? iso(row.health.cooldownUntil) : null,
      cooldown_reason: row.health.cooldownUntil && row.health.cooldownUntil > new Date() ? (row.health.cooldownReason as AdminGroupMember['health']['cooldown_reason']) : null,
      // An open circuit stays open past its cooldown until a probe (or another success) closes it.
      circuit: row.health.cooldownReason !== 'circuit_open' ? 'closed' : row.health.cooldownUntil && row.health.cooldownUntil > new Date() ? 'open' : 'half_open',
      credentials_rejected: row.health.credentialsRejectedAt !== null,
      account_disabled: row.health.accountDisabledAt ? { reason: reasonOf(row.health.accountDisabledReason ?? ''), since: iso(row.health.accountDisabledAt) } : null,
      model_faults: row.health.modelFaults.map((f) => ({ model: f.model, kind: f.kind, reason: reasonOf(f.reason), since: iso(new Date(f.since)), until: f.until && iso(new Date(f.until)) })),
      last_error: row.health.lastError && reasonOf(row.health.lastError),
      last_error_at: row.health.lastErrorAt && iso(row.health.lastErrorAt),
      last_success_at: row.health.lastSuccessAt && iso(row.health.lastSuccessAt),
      recent: { since: row.health.windowStartedAt && iso(row.health.windowStartedAt), successes: row.health.successes ?? 0, failures: row.health.failures ?? 0 },
    },
    created_at: iso(row.createdAt),
    updated_at: iso(row.updatedAt),
  };
}

export function toAdminImageCapabilities(c: ImageCapabilities): AdminImageModelCapabilities {
  return {
    resolutions: c.resolutions as AdminImageModelCapabilities['resolutions'],
    aspect_ratios: c.aspectRatios,
    output_formats: c.outputFormats,
    supports_quality: c.supportsQuality,
    supports_transparent_background: c.supportsTransparentBackground,
    max_n: c.maxN,
    size_table: c.sizeTable ?? 'reference',
    max_input_images: c.maxInputImages ?? null,
    resize: c.resize ?? 'exact',
    edits: c.edits ?? true,
    custom_size_ratios: c.customSizeRatios ?? 'any',
    min_edge: c.minEdge ?? null,
    max_edge: c.maxEdge ?? null,
  };
}

export function toAdminVideoCapabilities(c: VideoCapabilities): AdminVideoModelCapabilities {
  return {
    durations: c.durations,
    aspect_ratios: c.aspectRatios,
    resolutions: c.resolutions,
    frames: c.frames,
    reference_images: { max_count: c.referenceImages.maxCount, configurable: c.referenceImages.configurable },
    audio: { supported: c.audio.supported, default_enabled: c.audio.defaultEnabled, always_on: c.audio.alwaysOn ?? false },
    duration_constraints: (c.durationConstraints ?? []).map((d) => ({
      ...(d.resolutions && { resolutions: d.resolutions }),
      ...(d.lastFrame && { last_frame: true }),
      ...(d.referenceImages && { reference_images: true }),
      durations: d.durations,
    })),
  };
}

/** API capabilities -> the camelCase jsonb shape of catalog_models.capabilities. */
export function fromAdminImageCapabilities(c: AdminImageModelCapabilities): ImageCapabilities {
  return {
    resolutions: c.resolutions,
    aspectRatios: c.aspect_ratios,
    outputFormats: c.output_formats,
    supportsQuality: c.supports_quality,
    supportsTransparentBackground: c.supports_transparent_background,
    maxN: c.max_n,
    ...(c.size_table && c.size_table !== 'reference' && { sizeTable: c.size_table }),
    ...(typeof c.max_input_images === 'number' && { maxInputImages: c.max_input_images }),
    ...(c.resize === 'native' && { resize: 'native' as const }),
    // Stored only when not the default, as `resize`: rows created before these existed read the same.
    ...(c.edits === false && { edits: false as const }),
    ...(c.custom_size_ratios === 'offered' && { customSizeRatios: 'offered' as const }),
    ...(typeof c.min_edge === 'number' && { minEdge: c.min_edge }),
    ...(typeof c.max_edge === 'number' && { maxEdge: c.max_edge }),
  };
}

export function fromAdminVideoCapabilities(c: AdminVideoModelCapabilities): VideoCapabilities {
  return {
    durations: c.durations,
    aspectRatios: c.aspect_ratios,
    resolutions: c.resolutions,
    frames: c.frames,
    referenceImages: {
      maxCount: c.reference_images.max_count,
      configurable: c.reference_images.configurable,
      ...(c.reference_images.configurable && { ceiling: c.reference_images.max_count }),
    },
    audio: { supported: c.audio.supported, defaultEnabled: c.audio.default_enabled, ...(c.audio.always_on && { alwaysOn: true }) },
    ...(c.duration_constraints?.length && {
      durationConstraints: c.duration_constraints.map((d) => ({
        ...(d.resolutions?.length && { resolutions: d.resolutions }),
        ...(d.last_frame && { lastFrame: true }),
        ...(d.reference_images && { referenceImages: true }),
        durations: d.durations,
      })),
    }),
  };
}

const QUALITY_ORDER = ['', 'low', 'medium', 'high'];

/**
 * Price rows in capability order (resolution, then low/medium/high). Rows with a quality the
 * contract does not know (the local catalog seeds an `auto` row) are internal and left out.
 */
export function toAdminPricing(prices: PriceRowRecord[], resolutions: readonly string[]): AdminPriceRow[] {
  const rank = (p: PriceRowRecord) => {
    const r = resolutions.indexOf(p.resolution);
    return (r < 0 ? resolutions.length : r) * QUALITY_ORDER.length + QUALITY_ORDER.indexOf(p.quality);
  };
  return prices
    .filter((p) => QUALITY_ORDER.includes(p.quality))
    .sort((a, b) => rank(a) - rank(b) || a.resolution.localeCompare(b.resolution))
    .map((p) => ({
      resolution: p.resolution,
      quality: p.quality === '' ? null : (p.quality as AdminPriceRow['quality']),
      mode: p.mode as AdminPriceRow['mode'],
      unit_price: toCredits(p.unitPrice),
    }));
}

export function toAdminCatalogModel(row: CatalogModelWithPrices): AdminCatalogModel {
  if (row.kind === 'image') {
    const caps = row.capabilities as unknown as ImageCapabilities;
    return {
      id: row.id,
      kind: 'image',
      display_name: row.displayName,
      enabled: row.enabled,
      image: toAdminImageCapabilities(caps),
      video: null,
      pricing: toAdminPricing(row.prices, caps.resolutions),
      upstream_mappings: row.upstreamMappings as Schemas['AdminUpstreamMappings'],
    };
  }
  const caps = row.capabilities as unknown as VideoCapabilities;
  return {
    id: row.id,
    kind: 'video',
    display_name: row.displayName,
    enabled: row.enabled,
    image: null,
    video: toAdminVideoCapabilities(caps),
    pricing: toAdminPricing(row.prices, caps.resolutions),
    upstream_mappings: row.upstreamMappings as Schemas['AdminUpstreamMappings'],
  };
}

export const CAPABILITY_NAMES: readonly AdminCapabilityName[] = ['image_generation', 'image_edit', 'video_generation'];

export function toAdminCapabilitySwitch(row: CapabilitySwitchRow): AdminCapabilitySwitch {
  return { name: row.name as AdminCapabilityName, enabled: row.enabled, updated_at: iso(row.updatedAt) };
}
