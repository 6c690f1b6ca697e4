// The admin API checks a body twice: its validator against the contract's schema, then the service.
// The CLI calls the same services, so it runs the same first check here, on every body it sends: the
// schema of the bundled contract as the validator compiles it (server/contract-schemas.ts), and the
// same 400 the API answers. Without it the CLI stored what the API refuses (a priority of 5000, a
// group named 'Bad Name!'), which the API's listings then could not answer within their schema.
import type { ErrorObject } from 'ajv/dist/2020.js';
import { contractSchema } from '../../server/contract-schemas.ts';
import { ApiError, invalidFieldMessage } from '../../server/errors.ts';

/** Request bodies of the admin API that the CLI sends (`components/schemas/<name>`). */
export type AdminBodySchema =
  | 'AdminAccountCreate'
  | 'AdminAccountUpdate'
  | 'AdminCreditAdjustment'
  | 'AdminApiKeyCreate'
  | 'AdminApiKeyUpdate'
  | 'AdminGroupCreate'
  | 'AdminGroupUpdate'
  | 'AdminGroupMemberCreate'
  | 'AdminGroupMemberUpdate'
  | 'AdminCatalogModelCreate'
  | 'AdminCatalogModelUpdate';

/** The API's `400 invalid_request` for a body: a mistake in what was typed, so exit code 2 (runAdmin), as a bad flag is. */
export class InvalidBody extends ApiError {}

/** `/video/durations/0` + a missing `x` -> `video.durations.0.x`, as the API's error middleware names it. */
function paramOf(error: ErrorObject): string | null {
  const parts = error.instancePath.split('/').filter(Boolean);
  const params = error.params as { missingProperty?: string; additionalProperty?: string };
  const child = params.missingProperty ?? params.additionalProperty;
  if (child !== undefined) parts.push(child);
  return parts.length > 0 ? parts.join('.') : null;
}

function invalid(param: string | null, detail: string): InvalidBody {
  return new InvalidBody(400, 'invalid_request', invalidFieldMessage(param, detail), param);
}

/**
 * Returns `body` when the schema takes it (with the schema's defaults filled in, as the validator
 * fills them); otherwise throws the API's `400 invalid_request` for its first violation, as the
 * validator reports one.
 */
export function checkBody<T>(schema: AdminBodySchema, body: T): T {
  const validate = contractSchema(schema);
  if (!validate(body)) {
    const error = validate.errors![0]!;
    throw invalid(paramOf(error), error.message ?? 'invalid');
  }
  return body;
}
