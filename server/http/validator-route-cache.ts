/**
 * express-openapi-validator 5.6 finds a request's operation by compiling the path pattern of every
 * route it tries with path-to-regexp, on every request, until one matches (`lookupRoute` in its
 * openapi.metadata.js): about 0.15 ms of each request here, with this contract's routes. Upstream
 * PR cdimascio/express-openapi-validator#1217 caches the compiled matchers; until a release has it,
 * the validator's own copy of path-to-regexp gets a `pathToRegexp` that compiles each pattern once.
 *
 * Safe because the validator only reads what it gets back (`regexp.exec`, `keys[].name`), the
 * regexps carry no `g`/`y` flag (so `exec` keeps no state), and path-to-regexp's own `match` (the
 * one Express's router uses) calls its internal function, not the export.
 */
import { requireFromValidator } from './validator-startup.ts';

type Compiled = { regexp: RegExp; keys: { name: string }[] };
type PathToRegexp = (path: unknown, options?: Record<string, unknown>) => Compiled;

/** Patterns come from the contract (a few dozen); the bound only keeps an unexpected caller from growing it. */
const MAX_PATTERNS = 1024;

/** The compiled patterns, once installed. */
let cache: Map<string, Compiled> | undefined;

/** Installs the cache (once per process); returns the module it patched, for tests. */
export function cacheValidatorRouteMatchers(): { pathToRegexp: PathToRegexp } {
  const module = requireFromValidator('path-to-regexp') as { pathToRegexp: PathToRegexp };
  if (cache) return module;
  const compile = module.pathToRegexp;
  const compiled = new Map<string, Compiled>();
  module.pathToRegexp = (path, options) => {
    const key = keyOf(path, options);
    if (key === undefined) return compile(path, options);
    let matcher = compiled.get(key);
    if (!matcher) {
      matcher = compile(path, options);
      if (compiled.size < MAX_PATTERNS) compiled.set(key, matcher);
    }
    return matcher;
  };
  cache = compiled;
  return module;
}

/** How many patterns the cache holds (for tests: the validator's lookups went through it). */
export function cachedPatterns(): number {
  return cache?.size ?? 0;
}

/** The cache key of a string pattern compiled with no options but `sensitive` and `strict` (what the validator passes); otherwise none. */
function keyOf(path: unknown, options: Record<string, unknown> | undefined): string | undefined {
  if (typeof path !== 'string') return undefined;
  if (options === undefined) return `--${path}`;
  for (const name in options) if (name !== 'sensitive' && name !== 'strict') return undefined;
  return `${options.sensitive === true ? 's' : '-'}${options.strict === true ? 't' : '-'}${path}`;
}
