/** Builds the workers of a process from its context (main.ts and tests). */
import { join } from 'node:path';
import type { AppContext } from '../context.ts';
import { LocalVideoProvider } from '../providers/local/local-video.provider.ts';
import type { VideoProvider } from '../providers/video-provider.ts';
import type { VideoTaskRow } from '../repositories/video-task.repository.ts';
import { TaskEngine } from './task-engine.ts';
import { VideoTaskKind } from './video-task-kind.ts';
import { ImageTaskKind } from './image-task-kind.ts';
import type { ImageTaskRow } from '../repositories/image-task.repository.ts';

export function createVideoProviders(ctx: AppContext): Map<string, VideoProvider> {
  return new Map<string, VideoProvider>([['local', new LocalVideoProvider(join(ctx.config.mediaDir, 'tmp'), ctx.config.localRenderDelayMs)]]);
}

export function createVideoTaskEngine(ctx: AppContext, providers = createVideoProviders(ctx)): TaskEngine<VideoTaskRow> {
  const kind = new VideoTaskKind({
    db: ctx.db,
    tasks: ctx.repositories.videoTasks,
    ledger: ctx.repositories.ledger,
    routing: ctx.repositories.routing,
    files: ctx.services.files,
    providers,
  });
  return new TaskEngine(kind, ctx.log.child({ component: 'video-task-engine' }), {
    leaseMs: ctx.config.taskLeaseMs,
    pollMs: ctx.config.taskPollMs,
    concurrency: ctx.config.workerConcurrency,
  });
}

export function createImageTaskEngine(ctx: AppContext): TaskEngine<ImageTaskRow> {
  return new TaskEngine(new ImageTaskKind(ctx.repositories.imageTasks, ctx.services.images), ctx.log.child({ component: 'image-task-engine' }), {
    leaseMs: ctx.config.taskLeaseMs,
    pollMs: ctx.config.taskPollMs,
    concurrency: ctx.config.workerConcurrency,
  });
}

/** Every engine of a process, started and stopped together. */
export function createWorkers(ctx: AppContext, videoProviders?: Map<string, VideoProvider>) {
  const engines = [createVideoTaskEngine(ctx, videoProviders), createImageTaskEngine(ctx)];
  return {
    start: () => engines.forEach((e) => e.start()),
    wake: () => engines.forEach((e) => e.wake()),
    stop: () => Promise.all(engines.map((e) => e.stop())).then(() => undefined),
  };
}
