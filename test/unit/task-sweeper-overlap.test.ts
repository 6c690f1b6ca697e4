/**
 * The task sweeper's run, with strict fakes of its repositories and runners: one run per process at
 * a time (the next 30-second tick joins the run in progress), claims no larger than their lease can
 * see cancelled, a task that cannot be ended logged and passed over, and a stop honoured between
 * tasks.
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import type { ImageTaskRow } from '../../server/repositories/image-task.repository.ts';
import type { LedgerRepository } from '../../server/repositories/ledger.repository.ts';
import type { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import type { TaskSweepRepository } from '../../server/repositories/task-sweep.repository.ts';
import type { VideoTaskRow } from '../../server/repositories/video-task.repository.ts';
import { TaskSweeper, type TaskSweeperDeps } from '../../server/services/tasks/task-sweeper.ts';
import { CANCEL_TOTAL_MS, type VideoRunner } from '../../server/services/video/video-runner.ts';

interface Script {
  videos?: string[];
  images?: string[];
  holds?: string[];
  /** Called for each video task the sweeper ends; throws to fail it. */
  expire?: (id: string) => Promise<boolean>;
  endInterrupted?: (id: string) => Promise<boolean>;
  /** Resolved before the first claim of videos answers (a run kept in progress). */
  claimGate?: Promise<void>;
}

function sweeperOf(script: Script) {
  const calls: string[] = [];
  const claims: { kind: string; leaseMs: number; limit: number }[] = [];
  const once = (ids: string[] | undefined) => {
    let left = ids ?? [];
    return () => {
      const out = left;
      left = [];
      return out;
    };
  };
  const videos = once(script.videos);
  const images = once(script.images);
  const holds = once(script.holds);
  const sweepers = {
    take: async () => (calls.push('take'), { cursor: null }),
    save: async () => void calls.push('save'),
  } as unknown as SweeperRepository;
  const repo = {
    claimOverdueVideos: async (_owner: string, leaseMs: number, limit: number) => {
      claims.push({ kind: 'videos', leaseMs, limit });
      await script.claimGate;
      return videos().map((id) => ({ id, deadlineAt: new Date(0) }) as VideoTaskRow);
    },
    claimOverdueImages: async (_owner: string, leaseMs: number, _lifetime: number, limit: number) => {
      claims.push({ kind: 'images', leaseMs, limit });
      return images().map((id) => ({ id, runAsync: false }) as ImageTaskRow);
    },
    strandedHolds: async () => holds().map((taskId) => ({ taskId, status: 'failed', capture: 0 })),
  } as unknown as TaskSweepRepository;
  const ledger = { settleForTask: async (taskId: string) => (calls.push(`settle ${taskId}`), true) } as unknown as LedgerRepository;
  const videoRunner = {
    expire: async (task: VideoTaskRow) => (calls.push(`expire ${task.id}`), (script.expire ?? (async () => true))(task.id)),
  } as unknown as VideoRunner;
  const imageRunner = {
    endInterrupted: async (task: ImageTaskRow) => (calls.push(`end ${task.id}`), (script.endInterrupted ?? (async () => true))(task.id)),
    cancelRecorded: async () => {
      throw new Error('not expected: no asynchronous image task here');
    },
  };
  const sweeper = new TaskSweeper({ repo, sweepers, ledger, videoRunner, imageRunner, log: createLogger('silent'), taskMaxLifetimeSeconds: 600 } as unknown as TaskSweeperDeps);
  return { sweeper, calls, claims };
}

describe('the task sweeper', () => {
  it('joins the run in progress rather than starting a second one beside it', async () => {
    let open!: () => void;
    const { sweeper, calls, claims } = sweeperOf({ videos: ['vid_a'], claimGate: new Promise<void>((r) => (open = r)) });
    const first = sweeper.run();
    await new Promise((r) => setTimeout(r, 10));
    const second = sweeper.run();
    open();
    const reports = await Promise.all([first, second]);
    expect(reports).toEqual([
      { videos: 1, images: 0, holds: 0 },
      { videos: 1, images: 0, holds: 0 },
    ]);
    expect(calls.filter((c) => c === 'take')).toHaveLength(1);
    expect(claims.filter((c) => c.kind === 'videos')).toHaveLength(1);
    // Once it ended, the next tick runs afresh.
    expect(await sweeper.run()).toEqual({ videos: 0, images: 0, holds: 0 });
    expect(calls.filter((c) => c === 'take')).toHaveLength(2);
  });

  it('claims no more overdue tasks at once than their lease sees cancelled, one after another', async () => {
    const { sweeper, claims } = sweeperOf({});
    await sweeper.run();
    expect(claims.map((c) => c.kind)).toEqual(['videos', 'images']);
    for (const c of claims) expect(c.limit * CANCEL_TOTAL_MS, c.kind).toBeLessThan(c.leaseMs);
    for (const c of claims) expect(c.limit, c.kind).toBeGreaterThan(0);
  });

  it('logs a task it cannot end and goes on with the rest of the claim, the images and the holds', async () => {
    const { sweeper, calls } = sweeperOf({
      videos: ['vid_bad', 'vid_ok'],
      images: ['img_bad', 'img_ok'],
      holds: ['vid_old'],
      expire: async (id) => {
        if (id === 'vid_bad') throw new Error('the settlement failed');
        return true;
      },
      endInterrupted: async (id) => {
        if (id === 'img_bad') throw new Error('the settlement failed');
        return true;
      },
    });
    expect(await sweeper.run()).toEqual({ videos: 1, images: 1, holds: 1 });
    expect(calls).toEqual(['take', 'expire vid_bad', 'expire vid_ok', 'end img_bad', 'end img_ok', 'settle vid_old', 'save']);
  });

  it('ends nothing more once stopped between two tasks of its claim', async () => {
    let sweeper!: TaskSweeper;
    const made = sweeperOf({
      videos: ['vid_a', 'vid_b'],
      images: ['img_a'],
      holds: ['vid_old'],
      expire: async () => {
        sweeper.stop();
        return true;
      },
    });
    sweeper = made.sweeper;
    expect(await sweeper.run()).toEqual({ videos: 1, images: 0, holds: 0 });
    expect(made.calls).toEqual(['take', 'expire vid_a', 'save']);
  });
});
