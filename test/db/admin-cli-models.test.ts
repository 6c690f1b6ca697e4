/**
 * The admin CLI's catalog commands: `models definitions`, `models create` (from a shipped
 * definition or a body of one's own) and `models update`, on the database of a running app whose
 * admin API answers the same bodies. What the CLI refuses, the API refuses with the same code and
 * message; what it creates, the API serves. Most cases run the commands in-process (parsed as
 * scripts/admin.ts parses them: a CLI process spends seconds starting); a few run the CLI as a
 * process (built, as `npm run admin` runs it: adminProcess) for its output, exit codes and standard input.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { parse, UsageError } from '../../scripts/admin/args.ts';
import { commandContext } from '../../scripts/admin/command.ts';
import { modelCommands } from '../../scripts/admin/models.ts';
import type { Output } from '../../scripts/admin/output.ts';
import { catalogDefinitionsDir, loadCatalogDefinitions } from '../../server/catalog/catalog-definitions.ts';
import { ApiError } from '../../server/errors.ts';
import { createLogger } from '../../server/logger.ts';
import { createAdminServices, type AdminServices } from '../../server/services/admin/index.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { adminProcess, type CliRun } from '../support/admin-cli.ts';

let server: TestServer;
let admin: AdminServices;
let files: string;

beforeAll(async () => {
  server = await startTestServer();
  admin = createAdminServices({ db: server.db, log: createLogger('silent'), secretKey: server.secretKey });
  files = mkdtempSync(join(tmpdir(), 'admin-cli-models-'));
});
afterAll(async () => {
  await server?.close();
  if (files) rmSync(files, { recursive: true, force: true });
});

type CreateBody = paths['/admin/v1/models']['post']['requestBody']['content']['application/json'];
type UpdateBody = paths['/admin/v1/models/{model_id}']['patch']['requestBody']['content']['application/json'];
type Model = paths['/admin/v1/models/{model_id}']['get']['responses'][200]['content']['application/json'];
const api = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });

/** `models <verb> …` in-process: the CLI's own parsing and command, on the app's database. */
async function models(...argv: string[]): Promise<Output> {
  const { values: flags, positionals } = parse(['models', ...argv]);
  const [, verb, ...args] = positionals;
  return modelCommands[verb!]!(commandContext(admin, 'models', verb!, args, flags));
}

/** What a refused command threw: an API error as `code param message`, or a usage error. */
async function refusal(...argv: string[]): Promise<{ usage: string } | { code: string; param: string | null; message: string }> {
  const err = await models(...argv).then(
    () => undefined,
    (e: unknown) => e,
  );
  if (err instanceof UsageError) return { usage: err.message };
  if (err instanceof ApiError) return { code: err.code, param: err.param, message: err.message };
  throw new Error(`models ${argv.join(' ')} was not refused (${String(err)})`);
}

/** The error the admin API answered, in the shape of {@link refusal}. */
function apiRefusal(status: number, res: { error?: unknown; response: Response }) {
  expect(res.response.status).toBe(status);
  const { code, param, message } = (res.error as { error: { code: string; param: string | null; message: string } }).error;
  return { code, param, message };
}

/** `npm run admin -- …` as a process on the app's database; `stdin` is piped in. */
function cli(args: string[], stdin = ''): Promise<CliRun> {
  return adminProcess(args, { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex') }, stdin);
}

const definitionFile = (id: string) => JSON.parse(readFileSync(join(catalogDefinitionsDir(), `${id}.json`), 'utf8')) as { model: CreateBody };

/** A body in a file, for --file. */
function file(name: string, body: unknown): string {
  const path = join(files, name);
  writeFileSync(path, typeof body === 'string' ? body : JSON.stringify(body));
  return path;
}

describe('shipped definitions through the catalog service', () => {
  it('creates every one exactly as shipped, and the admin API serves it', async () => {
    for (const def of loadCatalogDefinitions()) {
      const body = { ...structuredClone(def.model), id: `svc-${def.model.id}` };
      const created = await admin.catalog.create(body);
      expect(created).toMatchObject({ ...body, enabled: true });
      const { data } = await api().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: body.id } } });
      expect(data).toEqual(created);
    }
  });
});

describe('admin CLI: models', () => {
  it('lists the definitions, filtered, and prints one as the body --file takes', async () => {
    const all = (await models('definitions')).json as { data: { id: string; provider: string; model: CreateBody }[] };
    expect(all.data.map((d) => d.id)).toEqual(loadCatalogDefinitions().map((d) => d.id));
    const { text } = await models('definitions', '--provider', 'gemini', '--kind', 'video');
    expect(text).toMatch(/^id +kind +upstream_model +display_name +prices\n/);
    expect(text).toMatch(/\ngemini\/veo-3\.1-generate-preview +video +veo-3\.1-generate-preview +Veo 3\.1 +720p 0\.4\/s, 1080p 0\.4\/s, 4k 0\.6\/s$/m);
    expect(text).not.toContain('openai/');
    expect(text).not.toContain('gemini-3-pro-image');

    const one = await models('definitions', 'openai/sora-2');
    expect(one.json).toEqual(definitionFile('openai/sora-2').model);
    expect(one.text).toMatch(/^Sora 2 through the OpenAI Videos API/);
    expect(one.text).toMatch(/\nupstream_model +sora-2\n/);
  });

  it('creates a model from a definition, under another id, with other prices, and says what a member needs', async () => {
    const run = await cli(['models', 'create', '--from', 'openai/gpt-image-1.5', '--id', 'image-pro', '--display-name', 'Image Pro', '--price', '1K/low=0.02', '--price', '1K/high=0.3']);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^id +image-pro\n/);
    expect(run.stdout).toContain("\n\nserve it from a member of provider 'openai': members add|update … --models image-pro --model-map image-pro=gpt-image-1.5\n");

    const { data } = await api().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: 'image-pro' } } });
    const shipped = definitionFile('openai/gpt-image-1.5').model;
    expect(data).toEqual({
      ...shipped,
      id: 'image-pro',
      display_name: 'Image Pro',
      enabled: true,
      image: { ...shipped.image, size_table: 'reference', max_input_images: null, resize: 'exact', edits: true, custom_size_ratios: 'any', min_edge: null, max_edge: null },
      video: null,
      pricing: [
        { resolution: '1K', quality: 'low', mode: 'per_item', unit_price: 0.02 },
        { resolution: '1K', quality: 'medium', mode: 'per_item', unit_price: 0.05 },
        { resolution: '1K', quality: 'high', mode: 'per_item', unit_price: 0.3 },
      ],
      upstream_mappings: {},
    });
    const same = await models('create', '--from', 'openai/sora-2');
    expect(same.text).toMatch(/members add\|update … --models sora-2$/);
    expect((same.json as Model).id).toBe('sora-2');
  }, 60_000);

  it('creates a model of your own from a JSON body, on standard input too, as POST /admin/v1/models would', async () => {
    const veo = definitionFile('gemini/veo-3.1-generate-preview').model;
    const own = await models('create', '--file', file('own.json', { ...veo, id: 'own-veo', display_name: 'Own Veo' }), '--price', '4k=0.9');
    expect(own.json).toMatchObject({ id: 'own-veo', display_name: 'Own Veo', kind: 'video' });
    expect((own.json as Model).pricing).toContainEqual({ resolution: '4k', quality: null, mode: 'per_second', unit_price: 0.9 });

    const piped = await cli(['models', 'create', '--file', '-', '--json'], JSON.stringify({ ...veo, id: 'my-veo' }));
    expect(piped.stderr).toBe('');
    expect(JSON.parse(piped.stdout)).toMatchObject({ id: 'my-veo', kind: 'video', display_name: 'Veo 3.1' });
    const broken = await cli(['models', 'create', '--file', '-'], '{"id": "x",\n');
    expect(broken.code).toBe(1);
    expect(broken.stderr).toMatch(/^error: The file '-' is not valid JSON: [^\n]+\. \(invalid_json\)\n$/);
  }, 60_000);

  it('refuses what the admin API refuses, with its code, param and message, and creates nothing', async () => {
    const sora = definitionFile('openai/sora-2').model;
    const unpriced = { ...sora, id: 'unpriced', pricing: [{ resolution: '1080p', quality: null, mode: 'per_second' as const, unit_price: 1 }] };
    const silent = { ...sora, id: 'silent', video: { ...sora.video!, audio: { supported: false, default_enabled: true } } };
    const extra = { ...sora, id: 'extra', colour: 'red' };
    const cases: [string[], number, CreateBody][] = [
      // The contract's schema.
      [['--from', 'openai/sora-2', '--id', 'Sora_Two'], 400, { ...sora, id: 'Sora_Two' }],
      [['--from', 'openai/sora-2', '--id', 'neg', '--price', '720p=-1'], 400, { ...sora, id: 'neg', pricing: [{ ...sora.pricing[0]!, unit_price: -1 }] }],
      [['--file', file('extra.json', extra)], 400, extra as CreateBody],
      [['--file', file('array.json', [sora])], 400, [sora] as unknown as CreateBody],
      // The catalog service.
      [['--file', file('unpriced.json', unpriced)], 400, unpriced],
      [['--file', file('silent.json', silent)], 400, silent],
      [['--from', 'openai/sora-2'], 409, sora],
    ];
    for (const [args, status, body] of cases) {
      const refused = await refusal('create', ...args);
      expect(refused, args.join(' ')).toEqual(apiRefusal(status, await api().POST('/admin/v1/models', { body })));
    }
    const ids = await server.db.selectFrom('catalogModels').select('id').where('id', 'in', ['Sora_Two', 'neg', 'extra', 'unpriced', 'silent']).execute();
    expect(ids).toEqual([]);

    // As the CLI prints it: one line, exit code 2 (a body the contract refuses, as a bad flag).
    const run = await cli(['models', 'create', '--from', 'openai/sora-2', '--id', 'Sora_Two']);
    expect(run).toEqual({ code: 2, stdout: '', stderr: `error: Invalid --id: must match pattern "^[a-z0-9][a-z0-9._-]*$". (invalid_request, --id)\n` });
  }, 60_000);

  it('updates names, switches and the named prices only, checked as PATCH /admin/v1/models/{id} checks them', async () => {
    await models('create', '--from', 'openai/sora-2-pro');
    const updated = (await models('update', 'sora-2-pro', '--display-name', 'Sora Pro', '--enabled', 'false', '--price', '1080p=0.8')).json as Model;
    expect(updated).toMatchObject({ display_name: 'Sora Pro', enabled: false });
    expect(updated.pricing).toEqual([
      { resolution: '720p', quality: null, mode: 'per_second', unit_price: 0.3 },
      { resolution: '1080p', quality: null, mode: 'per_second', unit_price: 0.8 },
    ]);
    const perClip = (await models('update', 'sora-2-pro', '--price', '720p=1.5', '--mode', 'per_item')).json as Model;
    expect(perClip.pricing).toEqual([
      { resolution: '720p', quality: null, mode: 'per_item', unit_price: 1.5 },
      { resolution: '1080p', quality: null, mode: 'per_second', unit_price: 0.8 },
    ]);
    const patch = { pricing: [{ resolution: '720p', quality: null, mode: 'per_item', unit_price: 1 }, { resolution: '1080p', quality: null, mode: 'per_item', unit_price: 2 }] };
    const fromFile = (await models('update', 'sora-2-pro', '--file', file('patch.json', patch))).json as Model;
    expect(fromFile.pricing).toEqual(patch.pricing);
    expect(fromFile.enabled).toBe(false);

    // An image model's upstream limits: whether it edits, the ratios a custom size may have, its edges.
    await models('create', '--from', 'replicate/flux-schnell-replicate');
    const limited = (await models('update', 'flux-schnell-replicate', '--edits', 'true', '--custom-size-ratios', 'any', '--min-edge', '256', '--max-edge', '2048')).json as Model;
    expect(limited.image).toMatchObject({ edits: true, custom_size_ratios: 'any', min_edge: 256, max_edge: 2048 });
    const cleared = (await models('update', 'flux-schnell-replicate', '--edits', 'false', '--custom-size-ratios', 'offered', '--min-edge', 'none', '--max-edge', 'none')).json as Model;
    expect(cleared.image).toMatchObject({ edits: false, custom_size_ratios: 'offered', min_edge: null, max_edge: null });

    await models('create', '--from', 'gemini/veo-3.1-fast-generate-preview');
    const cases: [string[], number, UpdateBody][] = [
      [['veo-3.1-fast-generate-preview', '--edits', 'false'], 400, { edits: false }],
      [['veo-3.1-fast-generate-preview', '--reference-limit', '300'], 400, { reference_image_max_count: 300 }],
      [['veo-3.1-fast-generate-preview', '--reference-limit', '2'], 400, { reference_image_max_count: 2 }],
      [['veo-3.1-fast-generate-preview', '--display-name', ''], 400, { display_name: '' }],
      [['veo-3.1-fast-generate-preview', '--file', file('empty.json', {})], 400, {}],
      [['nope', '--enabled', 'true'], 404, { enabled: true }],
    ];
    for (const [args, status, body] of cases) {
      const refused = await refusal('update', ...args);
      expect(refused, args.join(' ')).toEqual(apiRefusal(status, await api().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: args[0]! } }, body })));
    }
    // set-price, set-reference-limit, enable and disable go the same way.
    expect(await refusal('set-reference-limit', 'veo-3.1-fast-generate-preview', '--count', '300')).toEqual(
      apiRefusal(400, await api().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'veo-3.1-fast-generate-preview' } }, body: { reference_image_max_count: 300 } })),
    );
  });

  it('answers command-line mistakes with a usage error that says what to do (exit code 2)', async () => {
    await models('create', '--from', 'openai/gpt-image-1');
    const cases: [string[], string][] = [
      [['create'], 'models create needs exactly one of --from <definition> and --file <body.json>'],
      [['create', '--from', 'openai/sora-2', '--file', 'x.json'], 'models create needs exactly one of --from <definition> and --file <body.json>'],
      [['create', '--from', 'acme/nothing'], "no catalog definition 'acme/nothing' (run 'npm run admin -- models definitions' for the list)"],
      [['definitions', 'acme/nothing'], "no catalog definition 'acme/nothing' (run 'npm run admin -- models definitions' for the list)"],
      [['create', '--from', 'openai/sora-2', '--id', 'x', '--price', '1080p=1'], 'x has no price row for 1080p (rows: 720p)'],
      [['update', 'gpt-image-1', '--price', '1K=1'], 'gpt-image-1 has no price row for 1K (rows: 1K/low, 1K/medium, 1K/high)'],
      [['update', 'gpt-image-1', '--price', '1K/ultra=1'], "--price quality must be one of low, medium, high, got 'ultra'"],
      [['create', '--from', 'openai/sora-2', '--id', 'z', '--price', '720p'], "--price must look like RESOLUTION=PRICE or RESOLUTION/QUALITY=PRICE (e.g. 720p=0.2, 1K/high=0.3), got '720p'"],
      [['create', '--from', 'openai/sora-2', '--id', 'z', '--price', '720p=cheap'], "--price must be a number, got 'cheap'"],
      [['update', 'gpt-image-1'], 'models update needs --display-name, --enabled, --price, --reference-limit, --resize, --edits, --custom-size-ratios, --min-edge, --max-edge or --file'],
      [['update', 'gpt-image-1', '--enabled', 'true', '--mode', 'per_item'], '--mode changes the rows named by --price; name them'],
      [['set-price', 'gpt-image-1', '--resolution', '1K', '--quality', 'low', '--price', '1', '--price', '2'], 'set-price takes one --price; models update takes several'],
    ];
    for (const [args, message] of cases) expect(await refusal(...args), args.join(' ')).toEqual({ usage: message });

    const run = await cli(['models', 'create']);
    expect(run).toEqual({ code: 2, stdout: '', stderr: "error: models create needs exactly one of --from <definition> and --file <body.json>\nRun 'npm run admin -- --help' for usage.\n" });
  }, 60_000);
});
