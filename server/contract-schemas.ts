/**
 * Schemas of the bundled contract (generated/openapi.json, the document the server's validator
 * reads), compiled by Ajv as express-openapi-validator compiles request bodies: JSON Schema 2020-12
 * (an OpenAPI 3.1 contract), `strict: false` (OpenAPI keywords such as `examples`), no type
 * coercion, defaults filled in, nothing removed. Two users check a body exactly as the validator
 * would, without it: the admin CLI, before it calls a service (scripts/admin/contract.ts), and the
 * image generation fast path (http/generation-fast-path.ts).
 *
 * A `format` the validator knows and Ajv does not would be let through here unchecked (Ajv only
 * warns), so compiling a schema that names one throws instead: such a change to the contract is
 * noticed where the schema is compiled, not in production.
 */
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import formats from 'ajv-formats';
import { loadOpenApiDocument, type OpenApiDocument } from './openapi.ts';

const compilers = new WeakMap<OpenApiDocument, Ajv2020>();
let bundled: OpenApiDocument | undefined;

function compilerFor(spec: OpenApiDocument): Ajv2020 {
  let ajv = compilers.get(spec);
  if (!ajv) {
    ajv = new Ajv2020({
      strict: false,
      strictNumbers: true,
      strictTuples: true,
      allowUnionTypes: false,
      validateSchema: false,
      coerceTypes: false,
      useDefaults: true,
      removeAdditional: false,
      validateFormats: true,
      logger: {
        log: () => undefined,
        warn: (...args: unknown[]) => {
          if (String(args[0]).includes('unknown format')) throw new Error(`contract schema: ${String(args[0])}`);
        },
        error: (...args: unknown[]) => console.error(...args),
      },
    });
    // The formats the validator checks (`validateFormats: true` in app.ts: ajv-formats, fast mode).
    formats.default(ajv, { mode: 'fast' });
    ajv.addSchema(spec as object, 'contract');
    compilers.set(spec, ajv);
  }
  return ajv;
}

/** `components/schemas/<name>` of `spec` (the bundled contract by default), compiled once per document. */
export function contractSchema(name: string, spec: OpenApiDocument = (bundled ??= loadOpenApiDocument())): ValidateFunction {
  const validate = compilerFor(spec).getSchema(`contract#/components/schemas/${name}`);
  if (!validate) throw new Error(`the contract has no schema ${name}`);
  return validate;
}
