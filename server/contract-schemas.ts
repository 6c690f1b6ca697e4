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

/** RFC 3339 `date-time`, written as ajv-formats' fast mode matches it (a `T`, seconds, an offset). */
const DATE_TIME = /^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?(?:Z|[+-](\d\d)(?::?(\d\d))?)$/i;
const MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/**
 * An RFC 3339 date-time naming a time that exists: a day of its month (2026-02-30 is not one),
 * hours to 23, minutes and seconds to 59 (`23:59:60`, a leap second, too) and an offset to 23:59.
 * ajv-formats' fast mode only matches the pattern: the impossible rest reached PostgreSQL (a 500) or
 * JavaScript's Date (which rolls Feb 30 to Mar 2). What PostgreSQL still refuses (year 0000, an
 * offset past 15:59) is a 400 by its SQLSTATE (http/error-middleware.ts).
 */
export function isDateTime(text: string): boolean {
  const m = DATE_TIME.exec(text);
  if (!m) return false;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const leapYear = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = month === 2 && leapYear ? 29 : MONTH_DAYS[month - 1];
  return (
    days !== undefined &&
    day >= 1 &&
    day <= days &&
    hour <= 23 &&
    minute <= 59 &&
    (second <= 59 || (hour === 23 && minute === 59 && second === 60)) &&
    Number(m[7] ?? 0) <= 23 &&
    Number(m[8] ?? 0) <= 59
  );
}

/**
 * The formats checked more strictly than ajv-formats' fast mode does, by both the validator (app.ts)
 * and the schemas compiled here: the two must agree.
 */
export const STRICT_FORMATS = { 'date-time': isDateTime };

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
    // The formats the validator checks (`validateFormats: true` in app.ts: ajv-formats, fast mode,
    // then STRICT_FORMATS).
    formats.default(ajv, { mode: 'fast' });
    for (const [name, validate] of Object.entries(STRICT_FORMATS)) ajv.addFormat(name, validate);
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
