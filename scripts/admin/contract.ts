// The admin API checks a body twice: its validator against the contract's schema, then the service.
// The CLI calls the same services, so it runs the same first check here: the schema of the bundled
// contract (generated/openapi.json, the document the server's validator reads), compiled by Ajv with
// the options express-openapi-validator uses for request bodies, and the same 400 the API answers.
import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import { ApiError } from '../../server/errors.ts';
import { loadOpenApiDocument } from '../../server/openapi.ts';

/** Request bodies of the admin API that the CLI builds whole (the others are built from typed flags). */
export type AdminBodySchema = 'AdminCatalogModelCreate' | 'AdminCatalogModelUpdate';

let ajv: Ajv2020 | undefined;

function validator(schema: AdminBodySchema): ValidateFunction {
  if (!ajv) {
    // strict: false as the validator has it (OpenAPI keywords such as `examples`); defaults filled in.
    ajv = new Ajv2020({ strict: false, strictNumbers: true, strictTuples: true, useDefaults: true, logger: false });
    ajv.addSchema(loadOpenApiDocument(), 'contract');
  }
  const validate = ajv.getSchema(`contract#/components/schemas/${schema}`);
  if (!validate) throw new Error(`the contract has no schema ${schema}`);
  return validate;
}

/** `/video/durations/0` + a missing `x` -> `video.durations.0.x`, as the API's error middleware names it. */
function paramOf(error: ErrorObject): string | null {
  const parts = error.instancePath.split('/').filter(Boolean);
  const params = error.params as { missingProperty?: string; additionalProperty?: string };
  const child = params.missingProperty ?? params.additionalProperty;
  if (child !== undefined) parts.push(child);
  return parts.length > 0 ? parts.join('.') : null;
}

/** Throws the API's `400 invalid_request` for the first violation of the schema (as the validator reports one). */
export function checkBody(schema: AdminBodySchema, body: unknown): void {
  const validate = validator(schema);
  if (validate(body)) return;
  const error = validate.errors![0]!;
  const param = paramOf(error);
  const detail = error.message ?? 'invalid';
  throw new ApiError(400, 'invalid_request', param ? `Invalid '${param}': ${detail}.` : `Invalid request: ${detail}.`, param);
}
