/**
 * The console's only back end: the admin API, through openapi-fetch typed by the types generated
 * from the same OpenAPI document as the server (clients/typescript/generated/api.ts), so a contract
 * change that breaks a page fails `npm run typecheck`. The admin token lives in sessionStorage:
 * it is gone when the browser session ends.
 */
import createClient, { type Middleware } from 'openapi-fetch';
import type { components, paths } from '../../typescript/generated/api.ts';

export type Schemas = components['schemas'];
export type Account = Schemas['AdminAccount'];
export type ApiKey = Schemas['AdminApiKey'];
export type ApiKeyCreated = Schemas['AdminApiKeyCreated'];
export type Group = Schemas['AdminGroup'];
export type Member = Schemas['AdminGroupMember'];
export type CatalogModel = Schemas['AdminCatalogModel'];
export type PriceRow = Schemas['AdminPriceRow'];
export type Task = Schemas['AdminTask'];
export type TaskSummary = Schemas['AdminTaskSummary'];
export type TaskStatus = Schemas['AdminTaskStatus'];
export type LedgerEntry = Schemas['AdminLedgerEntry'];
export type WebhookDelivery = Schemas['AdminWebhookDelivery'];
export type UsageReport = Schemas['AdminUsageReport'];
export type UsageRow = Schemas['AdminUsageRow'];
export type UsageDimension = Schemas['AdminUsageDimension'];
export type Provider = Schemas['AdminProvider'];
export type CapabilitySwitch = Schemas['AdminCapabilitySwitch'];

const TOKEN_KEY = 'mediagate.adminToken';

export function storedToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}
export function storeToken(token: string): void {
  sessionStorage.setItem(TOKEN_KEY, token);
}
export function forgetToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** Called when the API answers 401 to a signed-in console (the token was changed or is wrong). */
let onUnauthorized: () => void = () => {};
export function setUnauthorizedHandler(handler: () => void): void {
  onUnauthorized = handler;
}

const auth: Middleware = {
  onRequest({ request }) {
    const token = storedToken();
    if (token) request.headers.set('Authorization', `Bearer ${token}`);
    return request;
  },
  onResponse({ response }) {
    if (response.status === 401 && storedToken()) onUnauthorized();
    return response;
  },
};

// The contract's array filters (status, kind, group_by) are `style: form, explode: false`: a,b,c.
export const api = createClient<paths>({ baseUrl: window.location.origin, querySerializer: { array: { style: 'form', explode: false } } });
api.use(auth);

/** An error the admin API answered (or a network failure), with the API's own code and message. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly code: string | null,
    message: string,
    readonly requestId?: string,
  ) {
    super(message);
  }
}

interface ErrorBody {
  error?: { message?: string; code?: string | null; request_id?: string };
}

/** Turns an openapi-fetch result into its data, or throws the API's error as an ApiFailure. */
export async function call<T>(promise: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  let result: { data?: T; error?: unknown; response: Response };
  try {
    result = await promise;
  } catch (err) {
    throw new ApiFailure(0, 'network_error', `The server could not be reached: ${(err as Error).message}`);
  }
  if (result.response.ok) return result.data as T;
  const body = (result.error ?? {}) as ErrorBody;
  const message = body.error?.message ?? `The server answered HTTP ${result.response.status} without an error message.`;
  throw new ApiFailure(result.response.status, body.error?.code ?? null, message, body.error?.request_id ?? result.response.headers.get('X-Request-Id') ?? undefined);
}

/** Checks a token by one cheap admin call; true when the server accepts it. */
export async function tokenAccepted(token: string): Promise<{ ok: true } | { ok: false; failure: ApiFailure }> {
  try {
    const res = await fetch(new URL('/admin/v1/capability-switches', window.location.origin), { headers: { Authorization: `Bearer ${token}` } });
    if (res.ok) return { ok: true };
    const body = (await res.json().catch(() => ({}))) as ErrorBody;
    return { ok: false, failure: new ApiFailure(res.status, body.error?.code ?? null, body.error?.message ?? `HTTP ${res.status}`) };
  } catch (err) {
    return { ok: false, failure: new ApiFailure(0, 'network_error', `The server could not be reached: ${(err as Error).message}`) };
  }
}

export const PROVIDERS: Provider[] = ['local', 'openai', 'gemini', 'ark', 'kling', 'minimax', 'dashscope', 'fal', 'replicate'];
export const TASK_STATUSES: TaskStatus[] = ['queued', 'in_progress', 'processing', 'needs_attention', 'completed', 'failed'];
