/**
 * The validator's route matchers are compiled once (http/validator-route-cache.ts) and match what
 * path-to-regexp compiles fresh; requests still reach their operations with their path parameters.
 */
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import express from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import { cacheValidatorRouteMatchers, cachedPatterns } from '../../server/http/validator-route-cache.ts';

const fresh = createRequire(import.meta.url)('path-to-regexp') as typeof import('path-to-regexp');

describe('validator route matcher cache', () => {
  it('compiles each pattern once per option set, with the same matcher path-to-regexp would build', () => {
    const module = cacheValidatorRouteMatchers();
    expect(cacheValidatorRouteMatchers()).toBe(module); // installed once
    const a = module.pathToRegexp('/v1/images/:task_id', { sensitive: false, strict: false });
    expect(module.pathToRegexp('/v1/images/:task_id', { sensitive: false, strict: false })).toBe(a);
    const strict = module.pathToRegexp('/v1/images/:task_id', { sensitive: false, strict: true });
    expect(strict).not.toBe(a);
    // The same as an uncached compile (path-to-regexp's internal pathToRegexp, through match()).
    const reference = fresh.match('/v1/images/:task_id', { sensitive: false });
    expect(a.regexp.exec('/v1/images/img_123')?.[1]).toBe('img_123');
    expect(reference('/v1/images/img_123')).toMatchObject({ params: { task_id: 'img_123' } });
    expect(a.keys.map((k) => k.name)).toEqual(['task_id']);
    expect(a.regexp.exec('/v1/images/img_1/x')).toBeNull();
    // Options it does not know are compiled every time, as before.
    const end = module.pathToRegexp('/v1/images/:task_id', { end: false });
    expect(module.pathToRegexp('/v1/images/:task_id', { end: false })).not.toBe(end);
    expect(end.regexp.exec('/v1/images/img_1/x')?.[1]).toBe('img_1');
  });

  it("the validator's route lookups go through it, and path parameters still arrive", async () => {
    cacheValidatorRouteMatchers();
    const app = express();
    const op = (id: string) => ({ operationId: id, responses: { '200': { description: 'ok' } } });
    app.use(
      OpenApiValidator.middleware({
        apiSpec: {
          openapi: '3.1.0',
          info: { title: 't', version: '1' },
          paths: {
            '/things': { get: op('listThings') },
            '/things/{thing_id}': { get: { ...op('getThing'), parameters: [{ name: 'thing_id', in: 'path', required: true, schema: { type: 'string', pattern: '^t_' } }] } },
          },
        } as never,
        validateRequests: true,
      }),
    );
    app.get('/things/:thing_id', (req, res) => void res.json({ id: req.params.thing_id }));
    app.use((err: { status?: number }, _req: express.Request, res: express.Response, _next: express.NextFunction) => void res.status(err.status ?? 500).json({}));
    const server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    try {
      const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      const before = cachedPatterns();
      expect(await (await fetch(`${base}/things/t_1`)).json()).toEqual({ id: 't_1' });
      expect(cachedPatterns()).toBeGreaterThan(before);
      const after = cachedPatterns();
      expect((await fetch(`${base}/things/x_1`)).status).toBe(400); // the parameter's pattern is still checked
      expect(cachedPatterns()).toBe(after); // nothing compiled again
    } finally {
      server.close();
    }
  });
});
