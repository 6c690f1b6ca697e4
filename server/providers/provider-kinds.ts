/**
 * The one list of provider kinds (a unit test keeps it equal to the contract's `AdminProvider` enum
 * and to the database's check constraint), with what a member of each needs. No adapter is
 * imported here: the adapter toolkit (upstream-http.ts) reads the default base URLs, and the
 * registry of adapters (registry.ts) imports the adapters, which import the toolkit.
 */
export const PROVIDER_KINDS = ['local', 'openai', 'gemini', 'ark', 'kling', 'minimax', 'dashscope', 'fal', 'replicate'] as const;
export type ProviderKind = (typeof PROVIDER_KINDS)[number];

export interface ProviderDefinition {
  /** Credential names a member must have (none: the provider runs on this machine). */
  credentials: readonly string[];
  /** Base URL when the member sets none. */
  defaultBaseUrl: string | null;
  /** The kinds of model its adapters run (registry.ts has an adapter for each; a unit test keeps the two equal). */
  kinds: readonly ('image' | 'video')[];
}

const BOTH = ['image', 'video'] as const;

export const PROVIDERS: Record<ProviderKind, ProviderDefinition> = {
  local: { credentials: [], defaultBaseUrl: null, kinds: BOTH },
  openai: { credentials: ['api_key'], defaultBaseUrl: 'https://api.openai.com/v1', kinds: BOTH },
  gemini: { credentials: ['api_key'], defaultBaseUrl: 'https://generativelanguage.googleapis.com/v1beta', kinds: BOTH },
  ark: { credentials: ['api_key'], defaultBaseUrl: 'https://ark.ap-southeast.bytepluses.com/api/v3', kinds: BOTH },
  kling: { credentials: ['access_key', 'secret_key'], defaultBaseUrl: 'https://api-singapore.klingai.com', kinds: BOTH },
  // Global; China: https://api.minimaxi.com.
  minimax: { credentials: ['api_key'], defaultBaseUrl: 'https://api.minimax.io', kinds: ['video'] },
  // Singapore; Beijing: https://dashscope.aliyuncs.com, US: https://dashscope-us.aliyuncs.com (key, region and model must match).
  dashscope: { credentials: ['api_key'], defaultBaseUrl: 'https://dashscope-intl.aliyuncs.com', kinds: ['video'] },
  fal: { credentials: ['api_key'], defaultBaseUrl: 'https://queue.fal.run', kinds: BOTH },
  replicate: { credentials: ['api_token'], defaultBaseUrl: 'https://api.replicate.com/v1', kinds: BOTH },
};

export function isProviderKind(value: string): value is ProviderKind {
  return (PROVIDER_KINDS as readonly string[]).includes(value);
}
