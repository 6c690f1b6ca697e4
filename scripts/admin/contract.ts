// The admin API checks a body twice: its validator against the contract's schema, then the service.
// The CLI calls the same services, so it runs the same first check here: the schema of the bundled
// contract as the validator compiles it (server/contract-schemas.ts), and the same 400 the API answers.
import type { ErrorObject } from 'ajv/dist/2020.js';
import { contractSchema } from '../../server/contract-schemas.ts';
import { ApiError } from '../../server/errors.ts';

/** Request bodies of the admin API that the CLI builds whole (the others are built from typed flags). */
export type AdminBodySchema = 'AdminCatalogModelCreate' | 'AdminCatalogModelUpdate';

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
  const validate = contractSchema(schema);
  if (validate(body)) return;
  const error = validate.errors![0]!;
  const param = paramOf(error);
  const detail = error.message ?? 'invalid';
  throw new ApiError(400, 'invalid_request', param ? `Invalid '${param}': ${detail}.` : `Invalid request: ${detail}.`, param);
}
