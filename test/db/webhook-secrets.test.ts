/**
 * Webhook signing secrets on real PostgreSQL: created once (concurrent first reads agree), stored
 * encrypted, rotated with an overlap during which both sign, and only the new one after it; the
 * published retry schedule of deliveries.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS, loadConfig } from '../../server/config.ts';
import { WebhookRepository } from '../../server/repositories/webhook.repository.ts';
import { retryDelay } from '../../server/services/tasks/retry-policy.ts';
import { WebhookSecrets } from '../../server/services/webhooks/webhook-secrets.ts';
import { createAccount } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let repo: WebhookRepository;
const key = randomBytes(32);

beforeAll(async () => {
  t = await createTestDatabase();
  repo = new WebhookRepository(t.db);
});
afterAll(async () => t?.destroy());

describe('webhook secrets', () => {
  it('creates one secret per account on first use, even when asked concurrently, and stores it encrypted', async () => {
    const account = await createAccount(t.db);
    const secrets = new WebhookSecrets(repo, key, 60);
    const views = await Promise.all(Array.from({ length: 8 }, () => secrets.get(account.id)));
    expect(new Set(views.map((v) => v.secret)).size).toBe(1);
    expect(views[0]!.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    const row = await t.db.selectFrom('webhookSecrets').selectAll().where('accountId', '=', account.id).executeTakeFirstOrThrow();
    expect(row.secretCiphertext.toString('latin1')).not.toContain(views[0]!.secret.slice(6));
    expect(await secrets.signing(account.id)).toEqual([views[0]!.secret]);
  });

  it('signs with the new and the previous secret during the overlap, then with the new one only', async () => {
    const account = await createAccount(t.db);
    let now = Date.now();
    const secrets = new WebhookSecrets(repo, key, 3600, () => now);
    const old = await secrets.get(account.id);
    const rotated = await secrets.rotate(account.id);
    expect(rotated.secret).not.toBe(old.secret);
    expect(rotated.previousExpiresAt!.getTime() - Date.now()).toBeGreaterThan(3590_000);
    expect(await secrets.signing(account.id)).toEqual([rotated.secret, old.secret]);
    now += 3601_000;
    expect(await secrets.signing(account.id)).toEqual([rotated.secret]);
    expect((await secrets.get(account.id)).previousExpiresAt).toBeNull();
    // Rotating again drops the oldest at once: only the last two are ever in use.
    now = Date.now();
    const third = await secrets.rotate(account.id);
    expect(await secrets.signing(account.id)).toEqual([third.secret, rotated.secret]);
  });
});

describe('webhook retry schedule', () => {
  it('is 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h by default, each up to 10 % later, then gives up', () => {
    const config = loadConfig({}, []);
    expect(config.webhookRetryScheduleMs).toEqual([5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000]);
    const policy = { maxRetries: 7, baseDelayMs: 0, maxDelayMs: 0, scheduleMs: DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS };
    expect(DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS.map((_, k) => retryDelay(policy, k, () => 0))).toEqual(DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS);
    expect(retryDelay(policy, 1, () => 1)).toBe(330_000);
    expect(retryDelay(policy, 7, () => 0)).toBeUndefined();
    expect(() => loadConfig({ WEBHOOK_RETRY_SCHEDULE_MS: '5s,10' }, [])).toThrow(/WEBHOOK_RETRY_SCHEDULE_MS/);
  });
});
