/**
 * The HTTP server the app runs in (main.ts and the test harness build it from `httpServerOptions`):
 * Node's own request timeout (a bare 408, no body, no request id) never ends a body before the
 * app's BODY_TIMEOUT_MS answers the contract's 408 body_timeout.
 */
import { createServer } from 'node:http';
import { describe, expect, it } from 'vitest';
import { httpServerOptions } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';

const configWith = (env: Record<string, string>) =>
  loadConfig({ DATABASE_URL: 'postgres://127.0.0.1:1/x', ADMIN_TOKEN: 'a'.repeat(32), MEDIAGATE_SECRET_KEY: 'ab'.repeat(32), ...env });

describe("the server's request timeout", () => {
  it.each([[{}], [{ BODY_TIMEOUT_MS: '3600000' }], [{ BODY_TIMEOUT_MS: '1000' }]])('comes after the body timeout of %j', (env) => {
    const config = configWith(env);
    const server = createServer(httpServerOptions(config));
    expect(server.requestTimeout).toBeGreaterThan(config.bodyTimeoutMs);
  });
});
