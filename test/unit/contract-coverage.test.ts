import { readFileSync } from 'node:fs';
import { describe, it, expect } from 'vitest';

// The bundled contract (`npm run generate` writes it); every tool reads this one file.
const specUrl = new URL('../../generated/openapi.json', import.meta.url);

interface Schema {
  $ref?: string;
  type?: string | string[];
  properties?: Record<string, Schema>;
  patternProperties?: Record<string, Schema>;
  items?: Schema;
  allOf?: Schema[];
  oneOf?: Schema[];
  anyOf?: Schema[];
  enum?: unknown[];
  const?: unknown;
  default?: unknown;
  pattern?: string;
  format?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  minItems?: number;
  maxItems?: number;
  [key: string]: unknown;
}

interface Operation {
  operationId?: string;
  deprecated?: boolean;
  security?: unknown[];
  parameters?: Schema[];
  requestBody?: Schema;
  responses?: Record<string, Schema>;
}

const doc = JSON.parse(readFileSync(specUrl, 'utf8')) as {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema> };
};

/** Follows local `$ref`s (`#/components/...`) until a non-ref node. */
function deref<T extends object>(node: T): T {
  let current: unknown = node;
  for (let hops = 0; hops < 20; hops++) {
    const ref = (current as { $ref?: unknown }).$ref;
    if (typeof ref !== 'string') return current as T;
    if (!ref.startsWith('#/')) throw new Error(`non-local $ref in the bundle: ${ref}`);
    current = ref
      .slice(2)
      .split('/')
      .map((part) => part.replace(/~1/g, '/').replace(/~0/g, '~'))
      .reduce<unknown>((acc, key) => (acc as Record<string, unknown> | undefined)?.[key], doc);
    if (current === undefined) throw new Error(`unresolved $ref ${ref}`);
  }
  throw new Error('$ref cycle');
}

function schema(name: string): Schema {
  const found = doc.components.schemas[name];
  if (!found) throw new Error(`schema ${name} is missing`);
  return deref(found);
}

/** Properties of a schema, including those of its allOf/oneOf/anyOf branches. */
function propertiesOf(node: Schema): Record<string, Schema> {
  const s = deref(node);
  const out: Record<string, Schema> = { ...(s.properties ?? {}) };
  for (const branch of [...(s.allOf ?? []), ...(s.oneOf ?? []), ...(s.anyOf ?? [])]) {
    Object.assign(out, propertiesOf(branch));
  }
  return out;
}

/** Walks a dotted field path (`account.balance`, `items.input.frames`), stepping into array items. */
function field(schemaName: string, path: string): Schema | undefined {
  let current: Schema | undefined = schema(schemaName);
  for (const part of path.split('.')) {
    if (!current) return undefined;
    let s: Schema = deref(current);
    if (s.items && !s.properties) s = deref(s.items);
    current = propertiesOf(s)[part];
  }
  return current ? withSiblings(current) : undefined;
}

/** A property with its `$ref` target resolved; sibling keywords (`default`, `description`) win. */
function withSiblings(node: Schema): Schema {
  if (node.$ref === undefined) return node;
  const { $ref: _ref, ...siblings } = node;
  return { ...withSiblings(deref(node)), ...siblings };
}

function requireField(schemaName: string, path: string): Schema {
  const found = field(schemaName, path);
  if (!found) throw new Error(`${schemaName}.${path} is missing`);
  return found;
}

function operation(method: string, path: string): Operation {
  const op = doc.paths[path]?.[method];
  if (!op) throw new Error(`${method.toUpperCase()} ${path} is missing`);
  return op;
}

/** Name of the component schema a media type points at (`#/components/schemas/<name>`). */
function refName(node: Schema | undefined): string | undefined {
  return node?.$ref?.split('/').pop();
}

const operations = [
  { method: 'get', path: '/v1/models', operationId: 'listModels', response: ['200', 'ModelList'] },
  { method: 'get', path: '/v1/credits', operationId: 'getCredits', response: ['200', 'CreditBalance'] },
  { method: 'post', path: '/v1/images/generations', operationId: 'createImage', request: 'ImageGenerationRequest', response: ['200', 'ImageResult'] },
  { method: 'post', path: '/v1/images/edits', operationId: 'editImage', request: 'ImageEditRequest', response: ['200', 'ImageResult'] },
  { method: 'get', path: '/v1/images/{task_id}', operationId: 'getImageTask', response: ['200', 'ImageTask'] },
  { method: 'get', path: '/v1/videos/capabilities', operationId: 'getVideoCapabilities', response: ['200', 'VideoCapabilities'] },
  { method: 'post', path: '/v1/videos/generations', operationId: 'createVideo', request: 'VideoCreateRequest', response: ['202', 'VideoTaskCreated'] },
  { method: 'post', path: '/api/v1/videos/generations', operationId: 'createVideoApiV1', request: 'VideoCreateRequest', response: ['202', 'VideoTaskCreated'] },
  { method: 'post', path: '/v1/videos', operationId: 'createVideoLegacyPath' },
  { method: 'get', path: '/v1/videos/{id}', operationId: 'getVideo', response: ['200', 'VideoTask'] },
  { method: 'get', path: '/v1/files/{file_id}', operationId: 'getFile', response: ['200', 'File'] },
  { method: 'get', path: '/v1/files', operationId: 'listFiles', response: ['200', 'FileList'] },
  { method: 'get', path: '/v1/files/{file_id}/content', operationId: 'getFileContent' },
  { method: 'delete', path: '/v1/files/{file_id}', operationId: 'deleteFile', response: ['200', 'FileDeleted'] },
  { method: 'get', path: '/v1/videos', operationId: 'listVideos', response: ['200', 'VideoTaskList'] },
  { method: 'get', path: '/v1/images', operationId: 'listImageTasks', response: ['200', 'ImageTaskList'] },
  { method: 'get', path: '/healthz', operationId: 'getHealth', response: ['200', 'HealthStatus'] },
  { method: 'get', path: '/readyz', operationId: 'getReadiness', response: ['200', 'ReadinessStatus'] },
  { method: 'get', path: '/metrics', operationId: 'getMetrics' },
  { method: 'get', path: '/docs', operationId: 'getApiReference' },
  { method: 'get', path: '/openapi.json', operationId: 'getOpenApiDocument' },
  { method: 'get', path: '/admin/v1/tasks', operationId: 'listTasks', response: ['200', 'AdminTaskList'] },
  { method: 'get', path: '/admin/v1/tasks/{task_id}', operationId: 'getTask', response: ['200', 'AdminTask'] },
  { method: 'get', path: '/admin/v1/ledger', operationId: 'listLedgerEntries', response: ['200', 'AdminLedgerEntryList'] },
  { method: 'get', path: '/admin/v1/webhook-deliveries', operationId: 'listWebhookDeliveries', response: ['200', 'AdminWebhookDeliveryList'] },
  { method: 'get', path: '/admin/v1/usage', operationId: 'getUsage', response: ['200', 'AdminUsageReport'] },
] as const;

const imageParameters = [
  'prompt', 'model', 'aspectRatio', 'aspect_ratio', 'resolution', 'quality', 'response_format',
  'output_format', 'output_compression', 'background', 'stream', 'size',
];

const videoTaskCreateFields = [
  'object', 'id', 'task_id', 'generation_id', 'status', 'model', 'duration', 'duration_seconds',
  'aspectRatio', 'aspect_ratio', 'resolution', 'generateAudio', 'generate_audio', 'billing',
];

// Product specification tables 2.1–2.7 and 4.3–4.8, field by field (aliases included).
const fieldTables: { table: string; schema: string; fields: string[] }[] = [
  { table: '2.1', schema: 'ModelList', fields: ['object', 'data', 'data.id', 'data.object', 'data.created', 'data.owned_by'] },
  {
    table: '2.2',
    schema: 'CreditBalance',
    fields: [
      'object', 'account.balance', 'account.total_earned', 'account.total_spent', 'account.status',
      'api_key.id', 'api_key.name', 'api_key.key_prefix', 'api_key.last_four', 'api_key.is_active',
      'api_key.credit_limit', 'api_key.credits_used', 'api_key.credits_remaining', 'api_key.unlimited',
      'api_key.last_used_at', 'api_key.created_at',
    ],
  },
  { table: '2.3', schema: 'ImageResult', fields: ['created', 'data', 'data.b64_json', 'data.url', 'data.revised_prompt'] },
  {
    table: '2.4',
    schema: 'ImageTask',
    fields: ['id', 'object', 'status', 'created', 'created_at', 'completed', 'completed_at', 'data.url', 'data.b64_json', 'error.message'],
  },
  { table: '2.5 (create shape)', schema: 'VideoTaskCreated', fields: videoTaskCreateFields },
  {
    table: '2.5 (lookup shape)',
    schema: 'VideoTask',
    fields: [...videoTaskCreateFields, 'input.mode', 'input.count', 'created_at', 'completed_at', 'video_url', 'data.url', 'error.message'],
  },
  {
    table: '2.6',
    schema: 'VideoBillingSnapshot',
    fields: ['kind', 'mode', 'unit', 'unitPrice', 'creditsPerSecond', 'durationSeconds', 'quotedCredits', 'actualCredits'],
  },
  { table: '2.6 (legacy)', schema: 'VideoBillingLegacy', fields: ['kind', 'unitPrice', 'quotedCredits', 'durationSeconds', 'actualCredits'] },
  {
    table: '2.7',
    schema: 'VideoCapabilities',
    fields: [
      'items', 'limits', 'items.model', 'items.displayName', 'items.durations', 'items.aspectRatios',
      'items.resolutions', 'items.input.frames', 'items.input.referenceImages.maxCount',
      'items.input.referenceImages.configurable', 'items.input.framesAndReferencesMutuallyExclusive',
      'items.audio.supported', 'items.audio.defaultEnabled', 'items.billing', 'items.configuredReachable',
      'limits.maxMediaInputCount', 'limits.maxMediaInputBytes',
    ],
  },
  {
    table: '2.7 (billing row)',
    schema: 'VideoBillingRow',
    fields: ['kind', 'resolution', 'mode', 'unit', 'unitPrice', 'creditsPerSecond', 'quoteToken'],
  },
  { table: '4.3', schema: 'ImageGenerationRequest', fields: imageParameters },
  { table: '4.4 (JSON)', schema: 'ImageEditRequest', fields: [...imageParameters, 'images', 'mask'] },
  { table: '4.4 (multipart)', schema: 'ImageEditMultipartRequest', fields: [...imageParameters, 'image', 'image[]', 'mask'] },
  {
    table: '4.6',
    schema: 'VideoCreateRequest',
    fields: [
      'client_request_id', 'clientRequestIdRequired', 'prompt', 'model', 'seconds', 'duration',
      'duration_seconds', 'aspectRatio', 'aspect_ratio', 'resolution', 'quote_token', 'quoteToken',
      'negative_prompt', 'negativePrompt', 'generate_audio', 'generateAudio', 'firstFrame', 'first_frame',
      'lastFrame', 'last_frame', 'referenceImages', 'reference_images', 'callback_url', 'callbackUrl',
      'reference_videos', 'reference_audios',
    ],
  },
];

const enums: { schema: string; field: string; values: string[] }[] = [
  { schema: 'ImageTask', field: 'status', values: ['processing', 'needs_attention', 'completed', 'failed'] },
  { schema: 'VideoTask', field: 'status', values: ['queued', 'in_progress', 'completed', 'failed'] },
  { schema: 'VideoCapabilities', field: 'items.input.frames', values: ['none', 'first-only', 'first-and-optional-last'] },
  { schema: 'VideoBillingRow', field: 'mode', values: ['per_second', 'per_item'] },
  { schema: 'VideoBillingSnapshot', field: 'mode', values: ['per_second', 'per_item'] },
  { schema: 'ImageGenerationRequest', field: 'quality', values: ['auto', 'low', 'medium', 'high'] },
  { schema: 'ImageGenerationRequest', field: 'response_format', values: ['url', 'b64_json'] },
  { schema: 'ImageGenerationRequest', field: 'output_format', values: ['png', 'jpeg', 'webp'] },
  { schema: 'ImageGenerationRequest', field: 'background', values: ['transparent', 'opaque', 'auto'] },
];

const constants: { schema: string; field: string; value: string }[] = [
  { schema: 'ModelList', field: 'object', value: 'list' },
  { schema: 'ModelList', field: 'data.object', value: 'model' },
  { schema: 'CreditBalance', field: 'object', value: 'credit_balance' },
  { schema: 'VideoTask', field: 'object', value: 'video.task' },
  { schema: 'VideoTaskCreated', field: 'object', value: 'video.task' },
  { schema: 'VideoBillingSnapshot', field: 'kind', value: 'snapshot' },
  { schema: 'VideoBillingLegacy', field: 'kind', value: 'legacy' },
  { schema: 'VideoBillingRow', field: 'kind', value: 'current_quote' },
];

const defaults: { schema: string; field: string; value: unknown }[] = [
  { schema: 'ImageGenerationRequest', field: 'quality', value: 'auto' },
  { schema: 'ImageGenerationRequest', field: 'response_format', value: 'b64_json' },
  { schema: 'ImageGenerationRequest', field: 'stream', value: false },
  { schema: 'VideoCapabilities', field: 'limits.maxMediaInputCount', value: 256 },
  { schema: 'VideoCapabilities', field: 'limits.maxMediaInputBytes', value: 536870912 },
];

/** Enum values of a field, whether written as `enum`, `const` or inside a `$ref`'d enum schema. */
function enumValues(s: Schema): unknown[] {
  if (s.enum) return s.enum;
  if (s.const !== undefined) return [s.const];
  return [...(s.oneOf ?? []), ...(s.anyOf ?? [])].flatMap((branch) => enumValues(deref(branch)));
}

const imageRequests = ['ImageGenerationRequest', 'ImageEditRequest', 'ImageEditMultipartRequest'];

const mediaFields: { schema: string; field: string; items?: boolean }[] = [
  { schema: 'VideoCreateRequest', field: 'firstFrame' },
  { schema: 'VideoCreateRequest', field: 'first_frame' },
  { schema: 'VideoCreateRequest', field: 'lastFrame' },
  { schema: 'VideoCreateRequest', field: 'last_frame' },
  { schema: 'VideoCreateRequest', field: 'referenceImages', items: true },
  { schema: 'VideoCreateRequest', field: 'reference_images', items: true },
  { schema: 'ImageEditRequest', field: 'images', items: true },
  { schema: 'ImageEditRequest', field: 'mask' },
  { schema: 'ImageEditMultipartRequest', field: 'image' },
  { schema: 'ImageEditMultipartRequest', field: 'image[]', items: true },
  { schema: 'ImageEditMultipartRequest', field: 'mask' },
];

describe('contract coverage: operations', () => {
  it.each(operations)('$operationId is $method $path', (expected) => {
    const op = operation(expected.method, expected.path);
    expect(op.operationId).toBe(expected.operationId);
    if ('request' in expected) {
      const body = deref(op.requestBody ?? {}) as { content?: Record<string, { schema?: Schema }> };
      expect(refName(body.content?.['application/json']?.schema)).toBe(expected.request);
    }
    if ('response' in expected) {
      const [status, name] = expected.response;
      const response = deref(op.responses?.[status] ?? {}) as { content?: Record<string, { schema?: Schema }> };
      expect(refName(response.content?.['application/json']?.schema)).toBe(name);
    }
  });

  it('takes multipart uploads on POST /v1/images/edits', () => {
    const body = deref(operation('post', '/v1/images/edits').requestBody ?? {}) as {
      content?: Record<string, { schema?: Schema }>;
    };
    expect(refName(body.content?.['multipart/form-data']?.schema)).toBe('ImageEditMultipartRequest');
  });

  it('streams image events as text/event-stream', () => {
    for (const path of ['/v1/images/generations', '/v1/images/edits']) {
      const ok = deref(operation('post', path).responses?.['200'] ?? {}) as { content?: Record<string, { schema?: Schema }> };
      expect(refName(ok.content?.['text/event-stream']?.schema)).toBe('ImageStreamEvent');
    }
  });

  it('marks POST /v1/videos as a deprecated 404', () => {
    const op = operation('post', '/v1/videos');
    expect(op.deprecated).toBe(true);
    expect(op.requestBody).toBeUndefined();
    expect(Object.keys(op.responses ?? {})).toContain('404');
  });

  it('leaves signed file downloads, health and readiness without an API key, and puts metrics behind its own token', () => {
    for (const path of ['/healthz', '/readyz']) {
      expect(operation('get', path).security).toEqual([]);
    }
    // A signed URL is its own credential; the same path with the key and no signature is the file object.
    expect(operation('get', '/v1/files/{file_id}').security).toEqual([{ apiKey: [] }, {}]);
    expect(operation('get', '/metrics').security).toEqual([{ metricsToken: [] }]);
  });

  it('answers usage reports as CSV too', () => {
    const ok = deref(operation('get', '/admin/v1/usage').responses?.['200'] ?? {}) as { content?: Record<string, { schema?: Schema }> };
    expect(Object.keys(ok.content ?? {})).toEqual(['application/json', 'text/csv']);
  });

  it('leaves the rendered reference and the bundled contract without an API key', () => {
    for (const path of ['/docs', '/openapi.json']) {
      expect(operation('get', path).security).toEqual([]);
    }
  });
});

describe('contract coverage: product specification fields', () => {
  const cases = fieldTables.flatMap(({ table, schema: name, fields }) =>
    fields.map((path) => ({ table, name, path })),
  );
  it.each(cases)('table $table: $name has $path', ({ name, path }) => {
    expect(field(name, path), `${name}.${path}`).toBeDefined();
  });

  it('accepts image_* upload fields on multipart edits', () => {
    expect(schema('ImageEditMultipartRequest').patternProperties?.['^image_.+$']).toBeDefined();
  });

  it.each(enums)('$schema: $field allows exactly the specified values', ({ schema: name, field: path, values }) => {
    expect([...enumValues(requireField(name, path))].sort()).toEqual([...values].sort());
  });

  it.each(constants)('$schema: $field is always $value', ({ schema: name, field: path, value }) => {
    expect(requireField(name, path).const).toBe(value);
  });

  it.each(defaults)('$schema: $field defaults to $value', ({ schema: name, field: path, value }) => {
    expect(requireField(name, path).default).toBe(value);
  });

  it('makes the key quota and remaining credits nullable', () => {
    for (const path of ['api_key.credit_limit', 'api_key.credits_remaining', 'api_key.last_used_at']) {
      expect(requireField('CreditBalance', path).type).toContain('null');
    }
  });
});

describe('contract coverage: limits', () => {
  it('caps prompts at 32,000 characters in image and video requests', () => {
    for (const name of [...imageRequests, 'VideoCreateRequest']) {
      expect(requireField(name, 'prompt').maxLength, name).toBe(32000);
    }
  });

  it('caps the negative prompt at 8,000 characters under both names', () => {
    expect(requireField('VideoCreateRequest', 'negative_prompt').maxLength).toBe(8000);
    expect(requireField('VideoCreateRequest', 'negativePrompt').maxLength).toBe(8000);
  });

  it('caps client_request_id at 128 characters under both names', () => {
    expect(requireField('VideoCreateRequest', 'client_request_id').maxLength).toBe(128);
    expect(requireField('VideoCreateRequest', 'clientRequestIdRequired').maxLength).toBe(128);
  });

  it('bounds output_compression to 0..100 and n to 1..10', () => {
    for (const name of imageRequests) {
      expect(requireField(name, 'output_compression'), name).toMatchObject({ minimum: 0, maximum: 100 });
      expect(requireField(name, 'n'), name).toMatchObject({ minimum: 1, maximum: 10 });
    }
  });

  it('accepts at most 16 edit images', () => {
    expect(requireField('ImageEditRequest', 'images')).toMatchObject({ minItems: 1, maxItems: 16 });
    expect(requireField('ImageEditMultipartRequest', 'image[]').maxItems).toBe(16);
  });

  it('caps video task ids at 128 characters', () => {
    const param = (operation('get', '/v1/videos/{id}').parameters ?? [])
      .map((p) => deref(p) as { name?: string; schema?: Schema })
      .find((p) => p.name === 'id');
    expect(param?.schema?.maxLength).toBe(128);
    for (const path of ['id', 'task_id', 'generation_id']) {
      expect(requireField('VideoTask', path).maxLength).toBe(128);
    }
  });
});

describe('contract coverage: media fields', () => {
  it.each(mediaFields)('$schema: $field has no pattern, maxLength or format byte', ({ schema: name, field: path, items }) => {
    const property = requireField(name, path);
    const declared = items ? deref(property.items ?? {}) : property;
    // A field that also takes OpenAI's object form (`{"image_url": …}`) is a oneOf: its string branch.
    const target = declared.oneOf ? deref(declared.oneOf.map((b) => deref(b)).find((b) => b.type === 'string') ?? {}) : declared;
    expect(target.type, `${name}.${path}`).toBe('string');
    expect(target.pattern).toBeUndefined();
    expect(target.maxLength).toBeUndefined();
    expect(target.format).not.toBe('byte');
  });

  it('puts no pattern, maxLength or format byte on image_* uploads', () => {
    const upload = deref(schema('ImageEditMultipartRequest').patternProperties?.['^image_.+$'] ?? {});
    expect(upload.pattern).toBeUndefined();
    expect(upload.maxLength).toBeUndefined();
    expect(upload.format).not.toBe('byte');
  });
});
