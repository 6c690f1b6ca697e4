/** Pure mappers: video task rows and catalog rows -> the contract's objects (product spec §2.5–§2.7). */
import type { components } from '../../../generated/api.d.ts';
import type { BillingMode } from '../../catalog/capabilities.ts';
import type { VideoCatalogRow } from '../../repositories/model.repository.ts';
import type { PolledVideoTaskRow, VideoTaskRow } from '../../repositories/video-task.repository.ts';
import { toCredits } from '../../lib/money.ts';

type Schemas = components['schemas'];

export function unitOf(mode: BillingMode): 'second' | 'item' {
  return mode === 'per_second' ? 'second' : 'item';
}

/** per_second: unit price × duration; per_item: the unit price once (product spec §2.6). */
export function quoteFor(mode: BillingMode, unitPrice: number, durationSeconds: number): number {
  return mode === 'per_second' ? unitPrice * durationSeconds : unitPrice;
}

/** The columns the create shape and the billing snapshot are made of. */
export type VideoCreatedFields = Pick<
  VideoTaskRow,
  'id' | 'status' | 'model' | 'durationSeconds' | 'aspectRatio' | 'resolution' | 'generateAudio' | 'billingKind' | 'billingMode' | 'unitPrice' | 'quotedCredits' | 'actualCredits'
>;

export function toBilling(row: VideoCreatedFields): Schemas['VideoBilling'] {
  if (row.billingKind === 'legacy') {
    const legacy: Schemas['VideoBillingLegacy'] = {
      kind: 'legacy',
      unitPrice: null,
      quotedCredits: null,
      durationSeconds: row.durationSeconds,
      actualCredits: toCredits(row.actualCredits),
    };
    if (row.billingMode === 'per_second' || row.billingMode === 'per_item') {
      legacy.mode = row.billingMode;
      legacy.unit = unitOf(row.billingMode);
    }
    return legacy;
  }
  const mode = row.billingMode as BillingMode;
  const snapshot: Schemas['VideoBillingSnapshot'] = {
    kind: 'snapshot',
    mode,
    unit: unitOf(mode),
    unitPrice: toCredits(row.unitPrice!),
    durationSeconds: row.durationSeconds,
    quotedCredits: toCredits(row.quotedCredits!),
    actualCredits: toCredits(row.actualCredits),
  };
  if (mode === 'per_second') snapshot.creditsPerSecond = toCredits(row.unitPrice!);
  return snapshot;
}

export function toVideoTaskCreated(row: VideoCreatedFields): Schemas['VideoTaskCreated'] {
  return {
    object: 'video.task',
    id: row.id,
    task_id: row.id,
    generation_id: row.id,
    status: row.status as Schemas['VideoTaskCreated']['status'],
    model: row.model,
    duration: row.durationSeconds,
    duration_seconds: row.durationSeconds,
    aspectRatio: row.aspectRatio,
    aspect_ratio: row.aspectRatio,
    resolution: row.resolution,
    generateAudio: row.generateAudio,
    generate_audio: row.generateAudio,
    billing: toBilling(row),
  };
}

/** What the lookup shape may read: the columns the poll selects (PolledVideoTaskRow), so it can read no other. */
export type VideoLookupFields = Omit<PolledVideoTaskRow, 'mediaExpiresAt'> & { mediaExpiresAt?: Date | null };

/** The lookup shape: input mode and count only (never image contents); completion fields when finished. */
export function toVideoTask(row: VideoLookupFields, videoUrl: string | undefined): Schemas['VideoTask'] {
  const task: Schemas['VideoTask'] = {
    ...toVideoTaskCreated(row),
    // The image inputs (frames or reference images: the task's input files), as `mode` describes
    // them; reference videos and audios are not images (contract: VideoTask.input.count).
    input: { mode: row.inputMode as Schemas['VideoTask']['input']['mode'], count: row.inputFileIds.length },
    created_at: row.createdAt.toISOString(),
  };
  if (row.completedAt) task.completed_at = row.completedAt.toISOString();
  if (row.status === 'completed' && videoUrl) {
    task.video_url = videoUrl;
    task.data = [{ url: videoUrl }];
    if (row.mediaExpiresAt) task.media_expires_at = row.mediaExpiresAt.toISOString();
  }
  if (row.status === 'failed') task.error = { message: row.errorMessage ?? 'The task failed.', code: row.errorCode };
  return task;
}

export function toBillingRow(
  price: { resolution: string; mode: BillingMode; unitPrice: number },
  quoteToken: string,
): Schemas['VideoBillingRow'] {
  const row: Schemas['VideoBillingRow'] = {
    kind: 'current_quote',
    resolution: price.resolution,
    mode: price.mode,
    unit: unitOf(price.mode),
    unitPrice: toCredits(price.unitPrice),
    quoteToken,
  };
  if (price.mode === 'per_second') row.creditsPerSecond = toCredits(price.unitPrice);
  return row;
}

export function toCapability(row: VideoCatalogRow, billing: Schemas['VideoBillingRow'][]): Schemas['VideoCapability'] {
  const caps = row.capabilities;
  return {
    model: row.id,
    displayName: row.displayName,
    durations: caps.durations,
    aspectRatios: caps.aspectRatios,
    resolutions: caps.resolutions,
    input: {
      frames: caps.frames,
      referenceImages: { maxCount: caps.referenceImages.maxCount, configurable: caps.referenceImages.configurable },
      framesAndReferencesMutuallyExclusive: true,
    },
    audio: { supported: caps.audio.supported, defaultEnabled: caps.audio.defaultEnabled, alwaysOn: caps.audio.alwaysOn ?? false },
    durationConstraints: (caps.durationConstraints ?? []).map((d) => ({
      when: { ...(d.resolutions && { resolutions: d.resolutions }), ...(d.lastFrame && { lastFrame: true }), ...(d.referenceImages && { referenceImages: true }) },
      durations: d.durations,
    })),
    billing,
    configuredReachable: row.reachable,
  };
}
