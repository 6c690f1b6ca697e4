/**
 * loadConfig refuses values it used to accept silently: a PUBLIC_BASE_URL or S3_ENDPOINT without
 * http:// or https:// (URL.canParse reads `media.example.com:8443` as a URL of scheme
 * `media.example.com:`, so every signed URL was unusable), a PUBLIC_BASE_URL with a query or a
 * fragment (the signed query is appended to it), a bare `--role` (it ran every role), and a
 * `--role worker` without PUBLIC_BASE_URL (its webhooks linked videos to http://localhost:8080);
 * and it keeps the defaults the product spec states.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../server/config.ts';

/** loadConfig's ConfigError message, or 'accepted'. */
function refusal(env: Record<string, string>, argv: string[] = []): string {
  try {
    loadConfig(env, argv);
    return 'accepted';
  } catch (err) {
    return err instanceof ConfigError ? err.message : `not a ConfigError: ${String(err)}`;
  }
}

describe('loadConfig: URLs', () => {
  it('refuses a PUBLIC_BASE_URL that is not an http:// or https:// URL, naming it and the value', () => {
    for (const value of ['media.example.com:8443', 'localhost:8080', 'ftp://media.example.com', 'mailto:ops@example.com']) {
      expect(refusal({ PUBLIC_BASE_URL: value })).toBe(
        `PUBLIC_BASE_URL must be an http:// or https:// URL without a query or fragment (e.g. https://media.example.com), got '${value}'`,
      );
    }
  });

  it('refuses a PUBLIC_BASE_URL with a query or a fragment', () => {
    for (const value of ['https://media.example.com/?x=1', 'https://media.example.com/#top', 'https://media.example.com?']) {
      expect(refusal({ PUBLIC_BASE_URL: value })).toMatch(/^PUBLIC_BASE_URL must be an http:\/\/ or https:\/\/ URL without a query or fragment/);
    }
  });

  it('accepts http:// and https:// base URLs, with a port or a path prefix', () => {
    for (const value of ['https://media.example.com', 'http://media.example.com:8443/', 'https://example.com/mediagate']) {
      expect(refusal({ PUBLIC_BASE_URL: value })).toBe('accepted');
    }
    expect(loadConfig({ PUBLIC_BASE_URL: 'http://media.example.com:8443/' }, []).publicBaseUrl).toBe('http://media.example.com:8443');
  });

  it('refuses an S3_ENDPOINT that is not an http:// or https:// URL', () => {
    const s3 = { MEDIA_STORE: 's3', S3_BUCKET: 'media' };
    for (const value of ['minio:9000', 's3.example.com', 'ftp://minio:9000']) {
      expect(refusal({ ...s3, S3_ENDPOINT: value })).toBe(`S3_ENDPOINT must be an http:// or https:// URL (e.g. http://minio:9000), got '${value}'`);
    }
    expect(refusal({ ...s3, S3_ENDPOINT: 'http://minio:9000' })).toBe('accepted');
    expect(loadConfig({ ...s3, S3_ENDPOINT: 'https://acct.r2.cloudflarestorage.com' }, []).s3?.endpoint).toBe('https://acct.r2.cloudflarestorage.com');
  });

  it('refuses S3 settings without MEDIA_STORE=s3 (unset or misspelt), which would keep media on this machine', () => {
    expect(refusal({ S3_BUCKET: 'media', S3_ENDPOINT: 'http://minio:9000' })).toBe(
      "S3_BUCKET, S3_ENDPOINT are set but MEDIA_STORE is 'fs': set MEDIA_STORE=s3 to keep media in the bucket, or unset them to keep it in MEDIA_DIR",
    );
    expect(refusal({ MEDIA_STOR: 's3', S3_BUCKET: 'media' })).toBe("S3_BUCKET is set but MEDIA_STORE is 'fs': set MEDIA_STORE=s3 to keep media in the bucket, or unset it to keep it in MEDIA_DIR");
    expect(refusal({ MEDIA_STORE: 'fs', S3_PREFIX: 'prod/' })).toMatch(/^S3_PREFIX is set but MEDIA_STORE is 'fs'/);
    expect(refusal({ MEDIA_STORE: 's3', S3_BUCKET: 'media', S3_PREFIX: 'prod/' })).toBe('accepted');
  });
});

describe('loadConfig: --role', () => {
  it('refuses --role without a value instead of running every role', () => {
    expect(refusal({}, ['--role'])).toBe('--role needs a value: --role api or --role worker');
    expect(refusal({ ROLE: 'worker' }, ['--role'])).toBe('--role needs a value: --role api or --role worker');
  });

  it('takes --role api, --role=worker and ROLE, and refuses other values', () => {
    const base = { PUBLIC_BASE_URL: 'https://media.example.com' };
    expect(loadConfig({}, ['--role', 'api']).role).toBe('api');
    expect(loadConfig(base, ['--role=worker']).role).toBe('worker');
    expect(loadConfig({ ...base, ROLE: 'worker' }, []).role).toBe('worker');
    expect(loadConfig({}, []).role).toBe('all');
    expect(refusal({}, ['--role', 'web'])).toBe("--role must be api or worker, got 'web'");
    expect(refusal({}, ['--role='])).toBe("--role must be api or worker, got ''");
  });
});

describe('loadConfig: PUBLIC_BASE_URL of a worker', () => {
  const needed =
    '--role worker needs PUBLIC_BASE_URL: workers sign the video links their webhooks carry, and a worker serves no API to link to; set it to the URL clients reach the API instances at (e.g. https://media.example.com)';

  it('refuses a worker without PUBLIC_BASE_URL, however its role is given and whatever HOST says (it linked webhooks to http://localhost:8080)', () => {
    expect(refusal({}, ['--role', 'worker'])).toBe(needed);
    expect(refusal({}, ['--role=worker'])).toBe(needed);
    expect(refusal({ ROLE: 'worker' })).toBe(needed);
    expect(refusal({ HOST: '127.0.0.1', METRICS_PORT: '9464' }, ['--role', 'worker'])).toBe(needed);
    expect(refusal({ PUBLIC_BASE_URL: ' ' }, ['--role', 'worker'])).toBe(needed);
  });

  it('takes a worker with PUBLIC_BASE_URL, and the single process (npm start) and a loopback API instance without it', () => {
    expect(loadConfig({ PUBLIC_BASE_URL: 'https://media.example.com/' }, ['--role', 'worker']).publicBaseUrl).toBe('https://media.example.com');
    expect(loadConfig({}, []).publicBaseUrl).toBeUndefined();
    expect(loadConfig({}, ['--role', 'api']).publicBaseUrl).toBeUndefined();
  });
});

describe('loadConfig: bearer tokens', () => {
  it('refuses an ADMIN_TOKEN or METRICS_TOKEN outside visible ASCII (a header carries latin1: it could never match)', () => {
    expect(refusal({ ADMIN_TOKEN: 'pässwörd-0123456789abcdef' })).toBe(
      'ADMIN_TOKEN must be visible ASCII characters only (letters, digits, punctuation; no spaces): it is sent in an HTTP header',
    );
    expect(refusal({ METRICS_TOKEN: 'metrics token with spaces' })).toContain('METRICS_TOKEN must be visible ASCII characters only');
    expect(refusal({ ADMIN_TOKEN: 'short' })).toBe('ADMIN_TOKEN must be at least 16 characters');
    expect(refusal({ ADMIN_TOKEN: 'Ab0-._~+/=!#$%&*()[]{}', METRICS_TOKEN: 'metrics-token-0123456789' })).toBe('accepted');
  });
});

describe('loadConfig: defaults the product spec states', () => {
  it("defaults the video capabilities' limits to 256 media inputs and 536870912 bytes (§2.7, §8)", () => {
    const config = loadConfig({}, []);
    expect({ count: config.maxMediaInputCount, bytes: config.maxMediaInputBytes }).toEqual({ count: 256, bytes: 536_870_912 });
  });
});
