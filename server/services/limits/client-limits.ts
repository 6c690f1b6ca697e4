/**
 * A client's own limits (design §10): requests per minute and generations in flight, per API key
 * and per account. Stored per row as `requests_per_minute` / `max_in_flight`: NULL follows the
 * operator's default (DEFAULT_KEY_RPM, …), 0 is no limit, N is N. The admin API says the same as
 * `"default"`, `null` and N.
 */
import { MAX_IN_FLIGHT, MAX_REQUESTS_PER_MINUTE, type ClientLimits } from '../../config.ts';
import { ApiError, badRequest, returningRateToken } from '../../errors.ts';

/** The limits of a key and of its account, as they apply to a request (`null`: no limit). */
export interface RequestLimits {
  key: ClientLimits;
  account: ClientLimits;
}

export const NO_LIMITS: RequestLimits = {
  key: { requestsPerMinute: null, maxInFlight: null },
  account: { requestsPerMinute: null, maxInFlight: null },
};

/** What a row says: the operator's default, no limit, or a number. */
export type LimitSetting = number | null | 'default';

/** A stored value as the admin API shows it. */
export function settingOf(stored: number | null): LimitSetting {
  return stored === null ? 'default' : stored === 0 ? null : stored;
}

/**
 * An admin API value as stored (`undefined`: unchanged), checked as the contract says (the CLI
 * calls the services without the API's validator): `400 invalid_request` naming the field.
 */
export function storedOf(setting: LimitSetting | undefined, param: 'requests_per_minute' | 'max_in_flight'): number | null | undefined {
  if (setting === undefined) return undefined;
  if (setting === 'default') return null;
  if (setting === null) return 0;
  const max = param === 'requests_per_minute' ? MAX_REQUESTS_PER_MINUTE : MAX_IN_FLIGHT;
  if (!Number.isInteger(setting) || setting < 1 || setting > max) {
    throw badRequest('invalid_request', `'${param}' must be a whole number from 1 to ${max}, null (no limit) or "default" (the operator's default).`, param);
  }
  return setting;
}

/** The limit that applies: the row's own, else the operator's default. */
export function effectiveLimit(stored: number | null, fallback: number | null): number | null {
  return stored === null ? fallback : stored === 0 ? null : stored;
}

/** Seconds a client is told to wait when a cap on generations in flight refused it: one may end any moment. */
export const IN_FLIGHT_RETRY_AFTER_SECONDS = 1;

/** `429 too_many_in_flight`, naming whose cap it is. */
export function tooManyInFlight(who: 'key' | 'account', cap: number): ApiError {
  const whose = who === 'key' ? 'This API key' : "This API key's account";
  return new ApiError(
    429,
    'too_many_in_flight',
    `${whose} already has ${cap} generation${cap === 1 ? '' : 's'} in flight, its limit; retry when one of them has finished.`,
    null,
    {},
    { 'Retry-After': String(IN_FLIGHT_RETRY_AFTER_SECONDS) },
  );
}

/** `429 rate_limited`, naming whose limit it is. */
export function rateLimited(who: 'key' | 'account', perMinute: number, retryAfterMs: number): ApiError {
  const whose = who === 'key' ? 'This API key' : "This API key's account";
  const seconds = Math.max(1, Math.ceil(retryAfterMs / 1000));
  return new ApiError(
    429,
    'rate_limited',
    `${whose} has used its ${perMinute} request${perMinute === 1 ? '' : 's'} per minute (generations, uploads and webhook tests); retry in ${seconds} s.`,
    null,
    {},
    { 'Retry-After': String(seconds) },
  );
}

/** The in-flight caps the credit hold statement checks (LedgerRepository.holdAndInsertTask). */
export function inFlightCapsOf(auth: { limits: RequestLimits }): { key: number | null; account: number | null } {
  return { key: auth.limits.key.maxInFlight, account: auth.limits.account.maxInFlight };
}

/** The 429 of a hold the in-flight gate refused. */
export function inFlightRefusal(outcome: 'key_too_many_in_flight' | 'account_too_many_in_flight', auth: { limits: RequestLimits }, withInputs: boolean): ApiError {
  const err = outcome === 'key_too_many_in_flight' ? tooManyInFlight('key', auth.limits.key.maxInFlight ?? 0) : tooManyInFlight('account', auth.limits.account.maxInFlight ?? 0);
  // A request with media inputs read, stored, fetched and decoded them before its hold: its token
  // stays spent, the rate is what bounds how often a key makes the server do that.
  return withInputs ? err : returningRateToken(err);
}
