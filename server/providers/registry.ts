/**
 * The adapters this build has for each provider kind (the kinds themselves: provider-kinds.ts).
 *
 * Adding a provider: see docs/ARCHITECTURE.md, "How to add a provider".
 */
import { join } from 'node:path';
import { ArkImageProvider } from './ark/ark-image.provider.ts';
import { ArkVideoProvider } from './ark/ark-video.provider.ts';
import { DashScopeVideoProvider } from './dashscope/dashscope-video.provider.ts';
import { FalImageProvider } from './fal/fal-image.provider.ts';
import { FalVideoProvider } from './fal/fal-video.provider.ts';
import { GeminiImageProvider } from './gemini/gemini-image.provider.ts';
import { GeminiVideoProvider } from './gemini/gemini-video.provider.ts';
import { klingAdapters } from './kling/kling-adapters.ts';
import { LocalImageProvider } from './local/local-image.provider.ts';
import { LocalVideoProvider } from './local/local-video.provider.ts';
import { MiniMaxVideoProvider } from './minimax/minimax-video.provider.ts';
import { OpenAIImageProvider } from './openai/openai-image.provider.ts';
import { OpenAIVideoProvider } from './openai/openai-video.provider.ts';
import { ReplicateImageProvider } from './replicate/replicate-image.provider.ts';
import { ReplicateVideoProvider } from './replicate/replicate-video.provider.ts';
import type { ImageProvider, VideoProvider } from './types.ts';

export { PROVIDER_KINDS, PROVIDERS, isProviderKind, type ProviderDefinition, type ProviderKind } from './provider-kinds.ts';
import { PROVIDER_KINDS, PROVIDERS, isProviderKind, type ProviderKind } from './provider-kinds.ts';

export interface ProviderAdapters {
  image?: ImageProvider;
  video?: VideoProvider;
}

/** The adapters of this process, by provider kind. */
export class ProviderRegistry {
  constructor(private readonly adapters: Partial<Record<ProviderKind, ProviderAdapters>>) {}

  image(kind: string): ImageProvider | undefined {
    return isProviderKind(kind) ? this.adapters[kind]?.image : undefined;
  }

  video(kind: string): VideoProvider | undefined {
    return isProviderKind(kind) ? this.adapters[kind]?.video : undefined;
  }

  /** Kinds with an adapter for `capability`: members of other kinds cannot serve it here. */
  kindsFor(capability: 'image' | 'video'): ProviderKind[] {
    return PROVIDER_KINDS.filter((kind) => this.adapters[kind]?.[capability] !== undefined);
  }

  /** Kinds that need no credentials to run. */
  credentialFreeKinds(): ProviderKind[] {
    return PROVIDER_KINDS.filter((kind) => PROVIDERS[kind].credentials.length === 0);
  }
}

export interface ProviderOptions {
  /** Scratch space of the local video renderer. */
  mediaDir: string;
  /** Simulated upstream latency of the local providers (demos, crash tests). */
  localRenderDelayMs: number;
  /** Poll interval of upstream video jobs; undefined: each adapter's own (OpenAI: 10 s). */
  videoPollIntervalMs?: number;
}

/** The adapters of this build; `overrides` replace some (tests inject failing or slow fakes). */
export function createProviderRegistry(options: ProviderOptions, overrides: Partial<Record<ProviderKind, ProviderAdapters>> = {}): ProviderRegistry {
  const builtIn: Partial<Record<ProviderKind, ProviderAdapters>> = {
    local: { image: new LocalImageProvider(), video: new LocalVideoProvider(join(options.mediaDir, 'tmp'), options.localRenderDelayMs) },
    openai: { video: new OpenAIVideoProvider(options.videoPollIntervalMs), image: new OpenAIImageProvider() },
    gemini: { image: new GeminiImageProvider(), video: new GeminiVideoProvider(options.videoPollIntervalMs) },
    ark: { image: new ArkImageProvider(), video: new ArkVideoProvider(options.videoPollIntervalMs) },
    kling: klingAdapters(options.videoPollIntervalMs),
    dashscope: { video: new DashScopeVideoProvider(options.videoPollIntervalMs) },
    minimax: { video: new MiniMaxVideoProvider(options.videoPollIntervalMs) },
    fal: { image: new FalImageProvider(), video: new FalVideoProvider(options.videoPollIntervalMs) },
    replicate: { image: new ReplicateImageProvider(), video: new ReplicateVideoProvider(options.videoPollIntervalMs) },
  };
  const merged = { ...builtIn };
  for (const [kind, adapters] of Object.entries(overrides) as [ProviderKind, ProviderAdapters][]) merged[kind] = { ...builtIn[kind], ...adapters };
  return new ProviderRegistry(merged);
}
