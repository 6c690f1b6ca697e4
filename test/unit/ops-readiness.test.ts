/**
 * Operations units: /readyz answers within its time limit whatever the database does, and says not
 * ready once the process stops; loadConfig checks DATABASE_URL and MEDIAGATE_SECRET_KEY at once (a
 * mistake used to surface after migrations, with a stack trace); the metrics label of a request the
 * validator never matched is its operation in the contract.
 */
import { randomBytes } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { ConfigError, loadConfig } from '../../server/config.ts';
import { ApiError } from '../../server/errors.ts';
import { operationMatcher } from '../../server/http/access-log.ts';
import { createLogger } from '../../server/logger.ts';
import { loadOpenApiDocument } from '../../server/openapi.ts';
import type { HealthRepository } from '../../server/repositories/health.repository.ts';
import { READINESS_TIMEOUT_MS, ReadinessService } from '../../server/services/readiness.service.ts';

const log = createLogger('silent');
const health = (ping: () => Promise<void>) => ({ ping }) as unknown as HealthRepository;

/** What check() threw, as status and code. */
function checked(service: ReadinessService): Promise<string> {
  return service.check().then(
    () => 'ready',
    (err: unknown) => (err instanceof ApiError ? `${err.status} ${err.code}: ${err.message}` : String(err)),
  );
}

describe('readiness', () => {
  it('is ready when the database answers', async () => {
    expect(await checked(new ReadinessService(health(async () => undefined), log))).toBe('ready');
  });

  it('answers 503 not_ready when the database does not answer in time (a frozen one never does), on a fake clock', async () => {
    expect(READINESS_TIMEOUT_MS).toBe(2_000);
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
    try {
      const frozen = new ReadinessService(health(() => new Promise(() => undefined)), log);
      let outcome: string | undefined;
      void checked(frozen).then((o) => (outcome = o));
      await vi.advanceTimersByTimeAsync(READINESS_TIMEOUT_MS - 1);
      expect(outcome).toBeUndefined(); // still waiting for the database
      await vi.advanceTimersByTimeAsync(1);
      expect(outcome).toBe('503 not_ready: The database is unreachable.');
    } finally {
      vi.useRealTimers();
    }
  });

  it('answers 503 not_ready once draining, without asking the database', async () => {
    let pings = 0;
    const service = new ReadinessService(health(async () => void pings++), log);
    service.drain();
    expect(await checked(service)).toBe('503 not_ready: The server is shutting down.');
    expect(pings).toBe(0);
  });
});

describe('loadConfig: the database settings', () => {
  const key = randomBytes(32).toString('hex');
  const refusal = (env: Record<string, string>) => {
    try {
      loadConfig(env, []);
      return 'accepted';
    } catch (err) {
      return err instanceof ConfigError ? err.message : `not a ConfigError: ${String(err)}`;
    }
  };

  it('names DATABASE_URL when it is not a postgres:// URL, without echoing it', () => {
    for (const url of ['notaurl', 'mysql://u:secretpw@db/x', 'db.example.com:5432/mediagate']) {
      const message = refusal({ DATABASE_URL: url, MEDIAGATE_SECRET_KEY: key });
      expect(message).toMatch(/^DATABASE_URL must be a postgres:\/\/ URL/);
      expect(message).not.toContain('secretpw');
    }
    expect(refusal({ DATABASE_URL: 'postgres://u:p@db:5432/x', MEDIAGATE_SECRET_KEY: key })).toBe('accepted');
    expect(refusal({ DATABASE_URL: 'postgresql://db/x', MEDIAGATE_SECRET_KEY: key })).toBe('accepted');
  });

  it('names REDIS_URL when it is not a redis:// URL, without echoing it (its password)', () => {
    for (const url of ['valkey://default:Sup3rS3cretPw@cache.internal:6379', 'redis//:Sup3rS3cretPw@cache.internal:6379']) {
      const message = refusal({ REDIS_URL: url });
      expect(message).toMatch(/^REDIS_URL must be a redis:\/\/ or rediss:\/\/ URL/);
      expect(message).not.toContain('Sup3rS3cretPw');
    }
    expect(refusal({ REDIS_URL: 'rediss://default:pw@cache:6380' })).toBe('accepted');
  });

  it('requires a well-formed MEDIAGATE_SECRET_KEY with DATABASE_URL, and checks one given in embedded mode', () => {
    const url = 'postgres://u:p@db:5432/x';
    expect(refusal({ DATABASE_URL: url })).toMatch(/^MEDIAGATE_SECRET_KEY is required with DATABASE_URL/);
    expect(refusal({ DATABASE_URL: url, MEDIAGATE_SECRET_KEY: 'abc' })).toMatch(/^MEDIAGATE_SECRET_KEY must be 64 hex characters or base64 of 32 bytes/);
    expect(refusal({ MEDIAGATE_SECRET_KEY: 'x'.repeat(64) })).toMatch(/^MEDIAGATE_SECRET_KEY must be/);
    expect(refusal({ DATABASE_URL: url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('base64') })).toBe('accepted');
    expect(refusal({})).toBe('accepted'); // embedded: the key is generated into the data dir
  });
});

describe('metrics: the operation of a request the validator never matched', () => {
  const operationAt = operationMatcher(loadOpenApiDocument());

  it("is the contract's operation for the method and path, static paths before parameters", () => {
    expect(operationAt('POST', '/v1/images/generations')).toBe('createImage');
    expect(operationAt('POST', '/api/v1/videos/generations')).toBe('createVideoApiV1');
    expect(operationAt('GET', '/v1/videos/capabilities')).toBe('getVideoCapabilities');
    expect(operationAt('GET', '/v1/videos/vid_123')).toBe('getVideo');
    expect(operationAt('HEAD', '/v1/files/file_1/content')).toBe('headFileContent');
    expect(operationAt('HEAD', '/v1/models')).toBe('listModels');
    expect(operationAt('PATCH', '/admin/v1/groups/grp_1/members/mem_1')).toBe('updateGroupMember');
    expect(operationAt('GET', '/metrics')).toBe('getMetrics');
  });

  it('is undefined (the label unmatched) for what the contract has no operation for', () => {
    expect(operationAt('GET', '/v1/nothing')).toBeUndefined();
    expect(operationAt('DELETE', '/v1/models')).toBeUndefined();
    expect(operationAt('GET', '/v1/videos/vid_1/extra')).toBeUndefined();
    expect(operationAt('GET', '/v1/models.json')).toBeUndefined();
  });
});
