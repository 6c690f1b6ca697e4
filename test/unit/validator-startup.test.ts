/**
 * What the validator computed at start to throw away (http/validator-startup.ts): its contract
 * preparation reads `#/components/schemas/<name>` refs from the contract instead of compiling them
 * with Ajv, and on every ref of the bundled contract gets the very object Ajv's lookup returns; the
 * OpenAPI meta-schema is compiled on first use, and still refuses an invalid document.
 */
import { describe, expect, it } from 'vitest';
import { schemaPreprocessorClass, schemaValidatorModule, trimValidatorStartup } from '../../server/http/validator-startup.ts';
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
