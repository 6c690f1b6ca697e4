/**
 * The image generation fast path (server/http/generation-fast-path.ts) against the contract
 * validator it skips: the same requests sent to the app with it and without it get the same answers,
 * body by body — the validator's 400 where the contract refuses, and otherwise the handler with the
 * same body (defaults filled in alike). The handler here is a stand-in that echoes what it was
 * given and says which way it came. The real handler through the fast path is what every other
 * image test runs.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Request, Response } from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApp } from '../../server/app.ts';
import { createHandlers } from '../../server/http/handlers.ts';
import { compileRequestBody } from '../../server/http/generation-fast-path.ts';
import { loadOpenApiDocument } from '../../server/openapi.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let t: TestServer;
let key: string;
const servers: Server[] = [];
let withFastPath: string;
let withoutFastPath: string;

async function listen(fast: boolean): Promise<string> {
  const handlers = createHandlers(t.ctx);
  handlers.createImage = async (req: Request, res: Response) => {
    const openapi = (req as Request & { openapi?: { expressRoute?: string; schema?: { operationId?: string } } }).openapi;
    res.status(299).json({ body: req.body, operationId: openapi?.schema?.operationId, validated: openapi?.expressRoute !== undefined });
  };
  const server = createServer(createApp(t.ctx, handlers, { generationFastPath: fast }));
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

beforeAll(async () => {
  t = await startTestServer();
  const account = await createAccount(t.db);
  const group = await createGroup(t.db);
  key = (await createApiKey(t.db, { accountId: account.id, groupId: group.id })).key;
  withFastPath = await listen(true);
  withoutFastPath = await listen(false);
});

afterAll(async () => {
  for (const s of servers) await new Promise<void>((resolve) => s.close(() => resolve()));
  await t?.close();
});

interface Case {
  name: string;
  body: unknown;
  raw?: string;
  headers?: Record<string, string>;
  path?: string;
}

async function send(base: string, c: Case): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${base}${c.path ?? '/v1/images/generations'}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...c.headers },
    body: c.raw ?? JSON.stringify(c.body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

const base = { model: 'gpt-image-1', prompt: 'a red fox in fresh snow' };
const cases: Case[] = [
  { name: 'the two required fields', body: base },
  { name: 'every field, valid', body: { ...base, aspectRatio: '16:9', aspect_ratio: '16:9', resolution: '2K', quality: 'high', response_format: 'url', output_format: 'webp', output_compression: 80, background: 'transparent', stream: true, n: 10, partial_images: 3, size: '1024x1024', user: 'u-1' } },
  { name: 'size auto', body: { ...base, size: 'auto' } },
  { name: 'a custom size', body: { ...base, size: '1536x640' } },
  { name: 'prompt of 32000 characters', body: { ...base, prompt: 'x'.repeat(32000) } },
  { name: 'Prefer respond-async', body: base, headers: { prefer: 'respond-async' } },
  { name: 'charset in the content type', body: base, headers: { 'content-type': 'application/json; charset=utf-8' } },
  { name: 'Accept: text/event-stream', body: base, headers: { accept: 'text/event-stream' } },
  { name: 'no model', body: { prompt: 'x' } },
  { name: 'no prompt', body: { model: 'gpt-image-1' } },
  { name: 'empty object', body: {} },
  { name: 'an array', body: [base] },
  { name: 'empty prompt', body: { ...base, prompt: '' } },
  { name: 'prompt of 32001 characters', body: { ...base, prompt: 'x'.repeat(32001) } },
  { name: 'model too long', body: { ...base, model: 'm'.repeat(129) } },
  { name: 'prompt a number', body: { ...base, prompt: 7 } },
  { name: 'prompt null', body: { ...base, prompt: null } },
  { name: 'an unknown field', body: { ...base, seed: 1 } },
  { name: 'n 0', body: { ...base, n: 0 } },
  { name: 'n 11', body: { ...base, n: 11 } },
  { name: 'n 1.5', body: { ...base, n: 1.5 } },
  { name: 'n a string', body: { ...base, n: '2' } },
  { name: 'n null', body: { ...base, n: null } },
  { name: 'stream a string', body: { ...base, stream: 'true' } },
  { name: 'partial_images -1', body: { ...base, partial_images: -1 } },
  { name: 'partial_images 4', body: { ...base, partial_images: 4 } },
  { name: 'quality not in the enum', body: { ...base, quality: 'ultra' } },
  { name: 'response_format not in the enum', body: { ...base, response_format: 'png' } },
  { name: 'output_format not in the enum', body: { ...base, output_format: 'gif' } },
  { name: 'output_compression 101', body: { ...base, output_compression: 101 } },
  { name: 'background not in the enum', body: { ...base, background: 'blue' } },
  { name: 'aspectRatio against its pattern', body: { ...base, aspectRatio: '16x9' } },
  { name: 'aspect_ratio 0:1', body: { ...base, aspect_ratio: '0:1' } },
  { name: 'resolution empty', body: { ...base, resolution: '' } },
  { name: 'size against its pattern', body: { ...base, size: 'big' } },
  { name: 'size a number', body: { ...base, size: 1024 } },
  { name: 'user too long', body: { ...base, user: 'u'.repeat(257) } },
  { name: 'Prefer of 257 characters', body: base, headers: { prefer: 'x'.repeat(257) } },
  { name: 'a query string', body: base, path: '/v1/images/generations?x=1' },
  { name: 'a body of JSON text, not an object', body: undefined, raw: '"a fox"' },
];

describe('image generation fast path', () => {
  it('answers every request as the contract validator does', async () => {
    for (const c of cases) {
      const fast = await send(withFastPath, c);
      const validated = await send(withoutFastPath, c);
      // Identical answers, apart from which way the request came.
      const strip = (r: { status: number; body: Record<string, unknown> }) => ({ status: r.status, body: { ...r.body, validated: undefined } });
      expect(strip(fast), c.name).toEqual(strip(validated));
      if (validated.status === 299) {
        // Accepted: the fast path took it, with the validator's defaults.
        expect(fast.body.validated, c.name).toBe(c.headers?.prefer?.length === 257 ? true : false);
        expect(fast.body.operationId, c.name).toBe('createImage');
        expect(validated.body.validated, c.name).toBe(true);
      } else {
        expect(validated.status, c.name).toBe(400);
      }
    }
    const accepted = (await Promise.all(cases.map((c) => send(withFastPath, c)))).filter((r) => r.status === 299);
    expect(accepted.length).toBe(8);
  });

  it('fills in the defaults the validator fills in', async () => {
    const { body } = await send(withFastPath, { name: 'defaults', body: base });
    expect(body.validated).toBe(false);
    expect(body.body).toEqual({ ...base, quality: 'auto', response_format: 'b64_json', stream: false, n: 1, partial_images: 0, moderation: 'auto' });
  });

  it('refuses, at start, a body schema that needs formats it does not know', () => {
    const spec = loadOpenApiDocument() as { components: { schemas: Record<string, { properties: Record<string, unknown> }> } } & ReturnType<typeof loadOpenApiDocument>;
    spec.components.schemas.ImageGenerationRequest!.properties.user = { type: 'string', format: 'made-up-format' };
    expect(() => compileRequestBody(spec, '/v1/images/generations', 'post')).toThrow(/unknown format/);
  });
});
