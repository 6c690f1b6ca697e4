/**
 * Apps of one process built from the same contract share one validator (http/contract-validator.ts);
 * each still answers its security schemes with its own checks and gets its path parameters, and the
 * caller's contract is left as written. Its paths are its own (`/widgets`): validator-route-cache.test.ts
 * counts the patterns compiled for `/things` in the same process.
 */
import { describe, expect, it } from 'vitest';
import express from 'express';
import { builtValidators, useContractValidator } from '../../server/http/contract-validator.ts';
import type { OpenApiDocument } from '../../server/openapi.ts';

const spec = {
  openapi: '3.1.0',
  info: { title: 'shared-validator-test', version: '1' },
  components: { securitySchemes: { apiKey: { type: 'http', scheme: 'bearer' }, adminToken: { type: 'http', scheme: 'bearer' }, metricsToken: { type: 'http', scheme: 'bearer' } } },
  security: [{ apiKey: [] }],
  paths: {
    '/widgets/{widget_id}': {
      get: {
        operationId: 'getWidget',
        parameters: [{ name: 'widget_id', in: 'path', required: true, schema: { type: 'string', pattern: '^t_' } }],
        responses: { '200': { description: 'ok', content: { 'application/json': { schema: { type: 'object', properties: { id: { type: 'string' }, app: { type: 'string' } }, required: ['id', 'app'], additionalProperties: false } } } } },
      },
    },
  },
} as unknown as OpenApiDocument;

/** An app whose apiKey check accepts one token, answering the path parameter and its own name. */
async function startApp(name: string, token: string, validateResponses: boolean) {
  const app = express();
  useContractValidator(app, spec, { validateResponses }, {
    apiKey: async (req) => {
      if (req.headers.authorization === `Bearer ${token}`) return true;
      throw Object.assign(new Error('no'), { status: 401 });
    },
    adminToken: () => false,
    metricsToken: () => false,
  });
  app.get('/widgets/:widget_id', (req, res) => void res.json({ id: req.params.widget_id, app: name }));
  app.use((err: { status?: number }, _req: express.Request, res: express.Response, _next: express.NextFunction) => void res.status(err.status ?? 500).json({ status: err.status }));
  const server = app.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  const get = async (path: string, auth: string) => {
    const r = await fetch(`${base}${path}`, { headers: { Authorization: `Bearer ${auth}` } });
    return { status: r.status, body: (await r.json()) as unknown };
  };
  return { get, close: () => new Promise<void>((r) => server.close(() => r())) };
}

describe('the contract validator shared by the apps of a process', () => {
  it('is built once per contract and options, and each app answers with its own checks and path parameters', async () => {
    const before = JSON.stringify(spec);
    const built = builtValidators();
    const a = await startApp('a', 'token-a', true);
    const b = await startApp('b', 'token-b', true);
    try {
      expect(builtValidators()).toBe(built + 1);
      expect(await a.get('/widgets/t_1', 'token-a')).toEqual({ status: 200, body: { id: 't_1', app: 'a' } });
      expect(await b.get('/widgets/t_2', 'token-b')).toEqual({ status: 200, body: { id: 't_2', app: 'b' } });
      // Each app's security: the other app's token is refused.
      expect((await a.get('/widgets/t_1', 'token-b')).status).toBe(401);
      expect((await b.get('/widgets/t_1', 'token-a')).status).toBe(401);
      // Validation still applies in both (the pattern of the path parameter).
      expect((await b.get('/widgets/x_1', 'token-b')).status).toBe(400);
      expect((await a.get('/widgets/x_1', 'token-a')).status).toBe(400);
      // Other options: another validator.
      const c = await startApp('c', 'token-c', false);
      try {
        expect(builtValidators()).toBe(built + 2);
        expect(await c.get('/widgets/t_3', 'token-c')).toEqual({ status: 200, body: { id: 't_3', app: 'c' } });
      } finally {
        await c.close();
      }
      // The caller's contract is as it was (the validator was given a copy).
      expect(JSON.stringify(spec)).toBe(before);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});
