/** Builds the workers of a process from its context (main.ts and tests). */
import { join } from 'node:path';
import type { AppContext } from '../context.ts';
import { LocalVideoProvider } from '../providers/local/local-video.provider.ts';
import type { VideoProvider } from '../providers/video-provider.ts';
import { RoutingRepository } from '../repositories/routing.repository.ts';
import { VideoTaskEngine } from './video-task-engine.ts';

export function createVideoProviders(ctx: AppContext): Map<string, VideoProvider> {
  return new Map<string, VideoProvider>([['local', new LocalVideoProvider(join(ctx.config.mediaDir, 'tmp'), ctx.config.localRenderDelayMs)]]);
}

export function createVideoTaskEngine(ctx: AppContext, providers = createVideoProviders(ctx)): VideoTaskEngine {
  return new VideoTaskEngine({
    db: ctx.db,
    tasks: ctx.repositories.videoTasks,
    ledger: ctx.repositories.ledger,
    routing: new RoutingRepository(ctx.db),
    files: ctx.services.files,
    providers,
    log: ctx.log.child({ component: 'video-task-engine' }),
    options: { leaseMs: ctx.config.taskLeaseMs, pollMs: ctx.config.taskPollMs, concurrency: ctx.config.workerConcurrency },
  });
}
