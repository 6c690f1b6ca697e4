/**
 * Two things express-openapi-validator 5.6 computes once per validator, at start, only to throw
 * them away: with this contract ~0.55 s of CPU at every start (a CPU profile of a built server's
 * start, 28 Nov 2026: Ajv was 0.70 s of a 4.6 s process life; 0.33 s after this), paid by every
 * server process the tests start as well. Both are patched here, once per process:
 *
 * - Its contract preparation (`SchemaPreprocessor`) resolves each `$ref` it meets with
 *   `ajv.getSchema(ref).schema`: Ajv compiles the whole referenced schema to answer, only for the
 *   schema's source to be read back, in an Ajv instance the validator then drops. For a
 *   `#/components/schemas/<name>` ref that source is the contract's own object (the validator's Ajv
 *   is given each component schema by reference, `createAjv` in its framework/ajv, and Ajv keeps the
 *   object it is given): those refs are read from the contract; any other ref goes its way.
 * - `OpenAPISchemaValidator` compiles the OpenAPI meta-schema when it is constructed, also with
 *   `validateApiSpec: false` (ours: the contract is linted by Redocly), when nothing validates
 *   with it: it is compiled on its first use instead.
 *
 * test/unit/validator-startup.test.ts checks both against the validator's own behaviour.
 */
import { createRequire } from 'node:module';

const PREFIX = '#/components/schemas/';

type Preprocessor = { apiDoc?: { components?: { schemas?: Record<string, unknown> } }; resolveSchema(schema: unknown): unknown };
type SchemaValidator = { validate(doc: unknown): { errors: unknown[] } };
type SchemaValidatorClass = new (opts: { version: string; validateApiSpec: boolean }) => SchemaValidator;

let installed = false;

/** `require` as express-openapi-validator's own modules resolve (its files, its copies of dependencies). */
export function requireFromValidator(path: string): unknown {
  return createRequire(createRequire(import.meta.url).resolve('express-openapi-validator'))(path);
}

/** The validator's SchemaPreprocessor class (for tests). */
export function schemaPreprocessorClass(): new (apiDoc: unknown, ajvOptions: unknown, responseOptions: unknown) => Preprocessor & { ajv: { getSchema(ref: string): { schema: unknown } | undefined } } {
  return (requireFromValidator('./middlewares/parsers/schema.preprocessor.js') as { SchemaPreprocessor: never }).SchemaPreprocessor;
}

/** The validator's module of OpenAPISchemaValidator (for tests). */
export function schemaValidatorModule(): { OpenAPISchemaValidator: SchemaValidatorClass } {
  return requireFromValidator('./framework/openapi.schema.validator.js') as { OpenAPISchemaValidator: SchemaValidatorClass };
}

/** Installs both (once per process). */
export function trimValidatorStartup(): void {
  if (installed) return;
  const proto = (schemaPreprocessorClass() as unknown as { prototype: Preprocessor }).prototype;
  const resolve = proto.resolveSchema;
  proto.resolveSchema = function (this: Preprocessor, schema: unknown) {
    const ref = (schema as { $ref?: unknown } | null | undefined)?.$ref;
    if (typeof ref === 'string' && ref.startsWith(PREFIX)) {
      const name = ref.slice(PREFIX.length);
      const schemas = this.apiDoc?.components?.schemas;
      if (schemas && !/[/~%]/.test(name) && Object.hasOwn(schemas, name)) return schemas[name];
    }
    return resolve.call(this, schema);
  };

  // The framework reads the class off this module object each time it constructs one.
  const module = schemaValidatorModule();
  const Compiled = module.OpenAPISchemaValidator;
  module.OpenAPISchemaValidator = class LazyOpenAPISchemaValidator implements SchemaValidator {
    readonly #opts: { version: string; validateApiSpec: boolean };
    #compiled: SchemaValidator | undefined;
    constructor(opts: { version: string; validateApiSpec: boolean }) {
      this.#opts = opts;
    }
    validate(doc: unknown) {
      this.#compiled ??= new Compiled(this.#opts);
      return this.#compiled.validate(doc);
    }
  };
  installed = true;
}
