/** The authenticated caller of a request, attached by the security handler of the validator. */
import type { Request, Response } from 'express';
import type { AuthContext } from '../services/auth.service.ts';

const AUTH = Symbol('mediagate.auth');

type WithAuth = { [AUTH]?: AuthContext };

export function setAuth(req: Request, auth: AuthContext): void {
  (req as Request & WithAuth)[AUTH] = auth;
}

export function hasAuth(req: Request): boolean {
  return (req as Request & WithAuth)[AUTH] !== undefined;
}

/** The caller of an operation secured by `apiKey`; throws if the pipeline did not authenticate. */
export function authOf(req: Request): AuthContext {
  const auth = (req as Request & WithAuth)[AUTH];
  if (!auth) throw new Error('request was not authenticated; is the operation secured by apiKey?');
  return auth;
}

/** `Cache-Control: no-store` for responses that must never be cached. */
export function noStore(res: Response): void {
  res.setHeader('Cache-Control', 'no-store');
}
