/**
 * Three things express-openapi-validator 5.6 computes only to throw them away: the first two once
 * per validator, at start (~0.55 s of CPU at every start with this contract; a CPU profile of a
 * built server's start, 28 Nov 2026: Ajv was 0.70 s of a 4.6 s process life, 0.33 s after this),
 * the third at each operation's first request; paid by every server process the tests start as
 * well. All three are patched here, once per process:
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
 * - Each operation's request schemas and (when responses are validated) each of its responses'
 *   schemas are given to Ajv with the contract's whole `paths` and `components` attached, for
 *   their `$ref`s to resolve. Ajv's `addSchema` walks every schema it is given, every key of it,
 *   for the `$id`s and `$anchor`s it must register (`getSchemaRefs`): the whole contract, again for
 *   every operation and response (test/http: 21 s of 190 s of CPU, 28 Nov 2026). A subtree with
 *   none registers nothing, so `paths` and `components` objects found to have none (walked once,
 *   as Ajv walks them) are left out of that walk; anything else goes Ajv's way.
 *
 * test/unit/validator-startup.test.ts checks all three against the validator's own behaviour.
 */
import { createRequire } from 'node:module';

const PREFIX = '#/components/schemas/';

type Preprocessor = { apiDoc?: { components?: { schemas?: Record<string, unknown> } }; resolveSchema(schema: unknown): unknown };
type SchemaValidator = { validate(doc: unknown): { errors: unknown[] } };
type SchemaValidatorClass = new (opts: { version: string; validateApiSpec: boolean }) => SchemaValidator;

let installed = false;

/** `require` as express-openapi-validator's own modules resolve (its files, its copies of dependencies). */
const validatorRequire = () => createRequire(createRequire(import.meta.url).resolve('express-openapi-validator'));
export function requireFromValidator(path: string): unknown {
  return validatorRequire()(path);
}

type GetSchemaRefs = (this: { opts: { schemaId?: string } }, schema: unknown, baseId?: string) => Record<string, unknown>;
type Traverse = (schema: unknown, opts: { allKeys: boolean }, cb: (sch: Record<string, unknown>) => void) => void;

/** Ajv's module that registers a schema's `$id`s and anchors (`getSchemaRefs`), as the validator's Ajv loads it (for tests). */
export function ajvResolveModule(): { getSchemaRefs: GetSchemaRefs } {
  return requireFromValidator('ajv/dist/compile/resolve') as { getSchemaRefs: GetSchemaRefs };
}

/** The walk `getSchemaRefs` makes: json-schema-traverse as that module requires it. */
function ajvTraverse(): Traverse {
  return createRequire(validatorRequire().resolve('ajv/dist/compile/resolve'))('json-schema-traverse') as Traverse;
}

/** Whether `subtree`, walked as Ajv walks a schema, has no `$id` (or `schemaId`), `$anchor` or `$dynamicAnchor`: per object and id keyword, remembered. */
const withoutIds = new WeakMap<object, Map<string, boolean>>();
function registersNothing(subtree: object, schemaId: string): boolean {
  let known = withoutIds.get(subtree);
  if (!known) withoutIds.set(subtree, (known = new Map()));
  let clean = known.get(schemaId);
  if (clean === undefined) {
    clean = true;
    ajvTraverse()(subtree, { allKeys: true }, (sch) => {
      if (sch[schemaId] !== undefined || sch.$anchor !== undefined || sch.$dynamicAnchor !== undefined) clean = false;
    });
    known.set(schemaId, clean);
  }
  return clean;
}

/** The validator's SchemaPreprocessor class (for tests). */
export function schemaPreprocessorClass(): new (apiDoc: unknown, ajvOptions: unknown, responseOptions: unknown) => Preprocessor & { ajv: { getSchema(ref: string): { schema: unknown } | undefined } } {
  return (requireFromValidator('./middlewares/parsers/schema.preprocessor.js') as { SchemaPreprocessor: never }).SchemaPreprocessor;
}

/** The validator's module of OpenAPISchemaValidator (for tests). */
export function schemaValidatorModule(): { OpenAPISchemaValidator: SchemaValidatorClass } {
  return requireFromValidator('./framework/openapi.schema.validator.js') as { OpenAPISchemaValidator: SchemaValidatorClass };
}

/** Installs all three (once per process). */
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

  // Ajv's walk for ids and anchors leaves out the attached contract when it has none.
  const resolveModule = ajvResolveModule();
  const getSchemaRefs = resolveModule.getSchemaRefs;
  resolveModule.getSchemaRefs = function (schema, baseId) {
    if (schema && typeof schema === 'object' && !Array.isArray(schema)) {
      const { paths, components, ...rest } = schema as Record<string, unknown>;
      const schemaId = this.opts.schemaId ?? '$id';
      const shared = [paths, components].filter((s) => s !== undefined);
      if (shared.length > 0 && shared.every((s) => s !== null && typeof s === 'object' && registersNothing(s, schemaId))) return getSchemaRefs.call(this, rest, baseId);
    }
    return getSchemaRefs.call(this, schema, baseId);
  };
  installed = true;
}
