/**
 * What the validator computed at start to throw away (http/validator-startup.ts): its contract
 * preparation reads `#/components/schemas/<name>` refs from the contract instead of compiling them
 * with Ajv, and on every ref of the bundled contract gets the very object Ajv's lookup returns; the
 * OpenAPI meta-schema is compiled on first use, and still refuses an invalid document; Ajv walks
 * the contract's `paths` and `components` attached to each operation's schemas once, not at every
 * schema, and registers what it registered before.
 */
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { ajvResolveModule, requireFromValidator, schemaPreprocessorClass, schemaValidatorModule, trimValidatorStartup } from '../../server/http/validator-startup.ts';
import { loadOpenApiDocument } from '../../server/openapi.ts';

describe('the validator reading schema refs from the contract', () => {
  it('returns what Ajv returns, the same object, for every ref of the contract', () => {
    trimValidatorStartup();
    const spec = loadOpenApiDocument();
    const refs = new Set<string>();
    JSON.stringify(spec, (key, value: unknown) => {
      if (key === '$ref' && typeof value === 'string') refs.add(value);
      return value;
    });
    const SchemaPreprocessor = schemaPreprocessorClass();
    const preprocessor = new SchemaPreprocessor(spec, { formats: {}, validateFormats: false, strict: false }, false);
    const schemaRefs = [...refs].filter((r) => r.startsWith('#/components/schemas/'));
    expect(schemaRefs.length).toBeGreaterThan(50);
    const ajvLookup = preprocessor.ajv.getSchema.bind(preprocessor.ajv);
    let compiled = 0;
    preprocessor.ajv.getSchema = (ref) => {
      compiled++;
      return ajvLookup(ref);
    };
    const direct = schemaRefs.map((ref) => preprocessor.resolveSchema({ $ref: ref }));
    expect(compiled).toBe(0); // Ajv was not asked
    schemaRefs.forEach((ref, i) => {
      expect(direct[i], ref).toBeDefined();
      expect(direct[i], ref).toBe(ajvLookup(ref)!.schema);
    });
    // Other refs (responses, parameters, headers) still go the validator's way.
    const other = [...refs].find((r) => r.startsWith('#/components/responses/'))!;
    expect(preprocessor.resolveSchema({ $ref: other })).toBe((spec.components as { responses: Record<string, unknown> }).responses[other.split('/').pop()!]);
  });

  it('compiles the OpenAPI meta-schema on first use, which still refuses an invalid document and passes the contract', () => {
    trimValidatorStartup();
    const { OpenAPISchemaValidator } = schemaValidatorModule();
    expect(OpenAPISchemaValidator.name).toBe('LazyOpenAPISchemaValidator');
    const validator = new OpenAPISchemaValidator({ version: '3.1.0', validateApiSpec: true });
    expect(validator.validate(loadOpenApiDocument()).errors).toEqual([]);
    expect(validator.validate({ openapi: '3.1.0', info: { title: 'no version' }, paths: {} }).errors.length).toBeGreaterThan(0);
  });
});

type AjvClass = new (opts: Record<string, unknown>) => {
  addSchema(schema: unknown, key: string): unknown;
  getSchema(key: string): ((data: unknown) => boolean) | undefined;
  refs: Record<string, unknown>;
};

describe("Ajv's walk of the contract attached to each operation's schemas", () => {
  const Ajv = (requireFromValidator('ajv') as { default: AjvClass }).default;
  /** A JSON object whose property reads are counted (what a walk of it reads). */
  function counted<T extends object>(target: T, reads: { n: number }): T {
    return new Proxy(target, {
      get(t, key, receiver) {
        reads.n++;
        const value = Reflect.get(t, key, receiver) as unknown;
        return value && typeof value === 'object' ? counted(value, reads) : value;
      },
    });
  }

  it("walks the contract's paths and components once, not with every schema, and validates as before", () => {
    trimValidatorStartup();
    const spec = loadOpenApiDocument() as { paths: object; components: { schemas: Record<string, unknown> } };
    const reads = { n: 0 };
    const paths = counted(spec.paths, reads);
    const components = counted(spec.components, reads);
    const ajv = new Ajv({ strict: false, validateFormats: false });
    const schema = (n: number) => ({ type: 'object', properties: { response: { $ref: '#/components/schemas/ErrorResponse' } }, required: ['response'], paths, components, n });
    ajv.addSchema(schema(1), 'first');
    const firstWalk = reads.n;
    expect(firstWalk).toBeGreaterThan(1000); // the whole contract, once
    for (let i = 2; i <= 20; i++) ajv.addSchema(schema(i), `op-${i}`);
    expect(reads.n).toBe(firstWalk); // not again
    const validate = ajv.getSchema('op-7')!;
    expect(validate({ response: { error: { code: 'invalid_request', message: 'm', type: 'invalid_request_error', param: null } } })).toBe(true);
    expect(validate({ response: { error: { message: 'no code' } } })).toBe(false);
  });

  it('registers the same ids and anchors as Ajv unpatched, and still refuses a bad anchor or a duplicate id', () => {
    trimValidatorStartup();
    const sameModule = createRequire(import.meta.url)('ajv/dist/compile/resolve') === ajvResolveModule();
    expect(sameModule).toBe(true); // the module this patches is the one Ajv loads
    // An id and an anchor inside `components`: the walk is Ajv's own, as before.
    const withIds = {
      components: { schemas: { Named: { $id: 'https://example.test/named', type: 'string' }, Anchored: { $anchor: 'here', type: 'integer' } } },
      properties: { a: { $ref: 'https://example.test/named' }, b: { $ref: '#here' } },
    };
    const ajv = new Ajv({ strict: false });
    ajv.addSchema(withIds, 'with-ids');
    expect(Object.keys(ajv.refs)).toEqual(expect.arrayContaining(['https://example.test/named']));
    const validate = ajv.getSchema('with-ids')!;
    expect(validate({ a: 'text', b: 3 })).toBe(true);
    expect(validate({ a: 3, b: 3 })).toBe(false);
    expect(validate({ a: 'text', b: 'x' })).toBe(false);
    expect(() => new Ajv({ strict: false }).addSchema({ components: { schemas: { X: { $anchor: '1bad' } } } }, 'bad')).toThrow(/invalid anchor/);
    expect(() =>
      new Ajv({ strict: false }).addSchema({ paths: { a: { $id: 'https://example.test/twice', type: 'string' } }, properties: { b: { $id: 'https://example.test/twice', type: 'number' } } }, 'dup'),
    ).toThrow(/more than one schema/);
  });
});
