/**
 * Catalog entries and group members for upstream providers, shared by the adapter tests and the
 * benchmarks: a model sold under the upstream's own id and a member pointing at a fake upstream.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { CatalogModelDefinition } from '../../server/catalog/capabilities.ts';
import { encryptSecret } from '../../server/lib/secret-box.ts';
import { MICRO } from '../../server/lib/money.ts';
import { newId } from '../../server/lib/ids.ts';

/** `sora-2` as OpenAI's /v1/videos wire format can express it: 4/8/12 s, 16:9 and 9:16, first frame. */
export const SORA_2: CatalogModelDefinition = {
  id: 'sora-2',
  kind: 'video',
  displayName: 'Sora 2 (OpenAI-compatible upstream)',
  capabilities: {
    durations: [4, 8, 12],
    aspectRatios: ['16:9', '9:16'],
    resolutions: ['720p'],
    frames: 'first-only',
    referenceImages: { maxCount: 0, configurable: false },
    audio: { supported: true, defaultEnabled: true },
  },
  prices: [{ resolution: '720p', quality: '', mode: 'per_second', unitPrice: Math.round(0.1 * MICRO) }],
};

/** An upstream member of `provider` with an encrypted `credentials` object, serving `models`. */
export async function addUpstreamMember(
  db: Kysely<DB>,
  secretKey: Buffer,
  o: { groupId: string; provider: 'openai' | 'gemini'; baseUrl: string; credentials: Record<string, string>; models: string[]; name?: string },
): Promise<{ id: string }> {
  const id = newId('mem');
  await db
    .insertInto('groupMembers')
    .values({
      id,
      groupId: o.groupId,
      name: o.name ?? `${o.provider}-${id.slice(4, 12).toLowerCase()}`,
      provider: o.provider,
      baseUrl: o.baseUrl,
      models: o.models,
      enabled: true,
      credentialsCiphertext: encryptSecret(secretKey, JSON.stringify(o.credentials)),
    })
    .execute();
  return { id };
}
