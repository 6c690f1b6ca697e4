/**
 * The provider registry is the one list of provider kinds: the contract's `AdminProvider` enum and
 * the database's check constraint must say exactly the same.
 */
import { readFileSync } from 'node:fs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PROVIDER_KINDS, PROVIDERS, createProviderRegistry } from '../../server/providers/registry.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

describe('provider kinds', () => {
  it('equal the contract AdminProvider enum', () => {
    const spec = JSON.parse(readFileSync(new URL('../../generated/openapi.json', import.meta.url), 'utf8')) as { components: { schemas: Record<string, { enum?: string[] }> } };
    expect([...spec.components.schemas.AdminProvider!.enum!].sort()).toEqual([...PROVIDER_KINDS].sort());
  });

  it('equal the values the group_members_provider_check constraint accepts', async () => {
    const { rows } = await sql<{ def: string }>`
      select pg_get_constraintdef(oid) as def from pg_constraint where conname = 'group_members_provider_check'`.execute(t.db);
    const accepted = [...rows[0]!.def.matchAll(/'([a-z]+)'::text/g)].map((m) => m[1]);
    expect(accepted.sort()).toEqual([...PROVIDER_KINDS].sort());
  });

  it('each have a definition, and the registry offers adapters only for defined kinds', () => {
    expect(Object.keys(PROVIDERS).sort()).toEqual([...PROVIDER_KINDS].sort());
    const registry = createProviderRegistry({ mediaDir: '/tmp/mediagate-registry-test', localRenderDelayMs: 0 });
    expect(registry.kindsFor('image')).toContain('local');
    expect(registry.kindsFor('video')).toContain('local');
    expect(registry.credentialFreeKinds()).toEqual(['local']);
    expect(registry.image('no-such-provider')).toBeUndefined();
  });

  it('say which kinds of model each runs exactly as the registry has adapters for them (members are checked against it)', () => {
    const registry = createProviderRegistry({ mediaDir: '/tmp/mediagate-registry-test', localRenderDelayMs: 0 });
    for (const kind of ['image', 'video'] as const) {
      expect([kind, registry.kindsFor(kind)]).toEqual([kind, PROVIDER_KINDS.filter((p) => PROVIDERS[p].kinds.includes(kind))]);
    }
  });
});
