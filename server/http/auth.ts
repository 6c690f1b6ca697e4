/** The authenticated caller of a request, attached by the security handler of the validator. */
import type { Request, Response } from 'express';
import type { AuthContext } from '../services/auth.service.ts';

const AUTH = Symbol('mediagate.auth');

type WithAuth = { [AUTH]?: AuthContext };

export function setAuth(req: Request, auth: AuthContext): void {
  (req as Request & WithAuth)[AUTH] = auth;
}

// Any request object: typed operation requests (numeric query parameters) included.
export function hasAuth(req: object): boolean {
  return (req as WithAuth)[AUTH] !== undefined;
}

/** The caller of an operation secured by `apiKey`; throws if the pipeline did not authenticate. */
export function authOf(req: object): AuthContext {
  const auth = (req as WithAuth)[AUTH];
  if (!auth) throw new Error('request was not authenticated; is the operation secured by apiKey?');
  return auth;
}

/** `Cache-Control: no-store` for responses that must never be cached. */
export function noStore(res: Response): void {
  res.setHeader('Cache-Control', 'no-store');
}
