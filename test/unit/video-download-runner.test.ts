/**
 * The finalize step of VideoRunner (services/video/video-runner.ts) around the download, with
 * strict fakes: the output an earlier attempt left is discarded before the download is opened (a
 * failure there leaves no download open), only while the task is still this attempt's and
 * unfinished (a completed task's output is never deleted); an output cut short, empty, or whose
 * body broke off is a failed download on its own budget, while a failure after the whole body was
 * read (the database) is not taken for one.
 */
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import type { Logger } from '../../server/logger.ts';
import type { UpstreamAccount, VideoContent, VideoProvider } from '../../server/providers/types.ts';
import type { VideoTaskRow } from '../../server/repositories/video-task.repository.ts';
import { LeaseLost } from '../../server/services/tasks/task-runner.ts';
import { VideoRunner } from '../../server/services/video/video-runner.ts';

const MP4 = Buffer.concat([Buffer.from([0, 0, 0, 0x18]), Buffer.from('ftypisom', 'latin1'), Buffer.alloc(100, 1)]);
const account: UpstreamAccount = { memberId: 'mem_1', provider: 'kling', baseUrl: null, credentials: {}, modelMap: {} } as unknown as UpstreamAccount;

function finishedTask(overrides: Partial<VideoTaskRow> = {}): VideoTaskRow {
  return {
    id: 'vid_1',
    accountId: 'acc_1',
    attempt: 3,
    status: 'in_progress',
    deadlineAt: new Date(Date.now() + 3_600_000),
    upstreamJobId: 'job-1',
    upstreamOutput: { url: 'https://cdn.example/v.mp4' },
    memberId: 'mem_1',
    model: 'kling-v3-std',
    prompt: 'a paper boat',
    negativePrompt: null,
    durationSeconds: 5,
    aspectRatio: '16:9',
    resolution: '720p',
    generateAudio: false,
    inputFileIds: [],
    inputMode: 'frames',
    referenceVideos: [],
    referenceAudios: [],
    downloadRetries: 0,
    outputFileId: null,
    ...overrides,
  } as unknown as VideoTaskRow;
}

interface Calls {
  downloads: Readable[];
  discardedLeftovers: number;
  counted: number;
  completed: number;
  /** Stored outputs discarded. */
  discarded: number;
}

/**
 * A runner whose task, as the database has it now, is `current`; `files` overrides the file
 * service's calls; the adapter's download answers `body` (and announces `announced` bytes).
 */
function runner(
  current: Partial<VideoTaskRow>,
  files: { deleteLeftovers?: () => Promise<string[] | undefined>; save?: (stream: Readable) => Promise<unknown> } = {},
  body = MP4,
  announced: number | undefined = body.length,
) {
  const calls: Calls = { downloads: [], discardedLeftovers: 0, counted: 0, completed: 0, discarded: 0 };
  const provider: VideoProvider = {
    pollIntervalMs: 10,
    submit: async () => 'job-1',
    poll: async () => ({ state: 'succeeded', output: {} }),
    download: async (): Promise<VideoContent> => {
      const stream = Readable.from([body]);
      calls.downloads.push(stream);
      return { stream, contentType: 'video/mp4', bytes: announced };
    },
  };
  const video = new VideoRunner({
    tasks: {
      leases: {},
      // As the fenced statement does: only while the task is this attempt's and unfinished.
      deleteUnpublishedOutputs:
        files.deleteLeftovers ??
        (async (fence: { attempt: number }) => {
          const now = finishedTask(current);
          if (now.attempt !== fence.attempt || !['queued', 'in_progress'].includes(now.status)) return undefined;
          calls.discardedLeftovers++;
          return [];
        }),
      countDownloadFailure: async () => ++calls.counted > 0,
    } as never,
    pool: { account: async () => account, health: { observe: (_a: unknown, call: () => Promise<unknown>) => call(), observeAccepted: (_a: unknown, call: () => Promise<unknown>) => call() }, mappingFor: async () => undefined } as never,
    providers: { video: () => provider } as never,
    files: {
      mediaInputs: async () => [],
      discardStored: async () => undefined,
      save: async (_input: unknown, stream: Readable) => (files.save ? files.save(stream) : { id: 'file_1', bytes: (await stream.toArray()).reduce((n, c: Buffer) => n + c.length, 0) }),
      discard: async () => void calls.discarded++,
    } as never,
    settlement: { completeVideo: async () => ++calls.completed > 0 } as never,
    attempts: { insert: async () => undefined } as never,
    maxOutputBytes: 1 << 20,
  });
  return { video, calls };
}

const log = { info() {}, warn() {}, error() {}, debug() {}, child: () => log } as unknown as Logger;
const step = (video: VideoRunner) => video.step(finishedTask(), new AbortController().signal, log).then(
  (result) => ({ result }),
  (err: unknown) => ({ err }),
);

describe('finalize: the output an earlier attempt left', () => {
  it('is discarded before the download: the output is then stored and the task completed', async () => {
    const { video, calls } = runner({});
    expect(await step(video)).toEqual({ result: { done: true } });
    expect([calls.discardedLeftovers, calls.downloads.length, calls.completed]).toEqual([1, 1, 1]);
  });

  it('a failure to discard it (the database, the store) opens no download, or leaves none open', async () => {
    const { video, calls } = runner({}, { deleteLeftovers: async () => Promise.reject(Object.assign(new Error('Connection terminated unexpectedly'), { code: '57P01' })) });
    const { err } = (await step(video)) as { err: Error };
    expect(err.message).toBe('Connection terminated unexpectedly');
    expect(calls.downloads.filter((stream) => !stream.destroyed)).toEqual([]);
    expect(calls.completed).toBe(0);
  });

  it.each([
    ['completed by another worker that took the task over', { attempt: 4, status: 'completed', outputFileId: 'file_9' }],
    ['claimed again by another worker', { attempt: 4 }],
  ] as const)('is never touched once the task is no longer this attempt’s (%s): the step stops as a lost lease', async (_what, current) => {
    const { video, calls } = runner(current);
    const { err } = (await step(video)) as { err: unknown };
    expect(err).toBeInstanceOf(LeaseLost);
    expect([calls.discardedLeftovers, calls.downloads.length, calls.completed]).toEqual([0, 0, 0]);
  });
});

describe('finalize: a failure while storing the output', () => {
  it('after the whole body was read (the database) is rethrown for the engine, not counted as a failed download', async () => {
    const dbDown = Object.assign(new Error('Connection terminated unexpectedly'), { code: '57P01' });
    const { video, calls } = runner({}, {
      save: async (stream) => {
        await stream.toArray();
        throw dbDown;
      },
    });
    expect(await step(video)).toEqual({ err: dbDown });
    expect(calls.counted).toBe(0);
  });

  it.each([
    ['shorter than the adapter announced', MP4.subarray(0, 60), MP4.length, 'the upstream video download ended after 60 of the 112 bytes it announced'],
    ['that is empty', Buffer.alloc(0), undefined, 'the upstream video download answered no bytes'],
  ])('an output %s is a failed download: the stored file is discarded, the failure counted', async (_what, body, announced, reason) => {
    const { video, calls } = runner({}, {}, body, announced);
    const { result } = (await step(video)) as { result: { done: boolean; error: string } };
    expect(result).toMatchObject({ done: false, error: expect.stringContaining(reason) });
    expect([calls.discarded, calls.counted, calls.completed]).toEqual([1, 1, 0]);
  });

  it('of the body itself (the connection reset mid-stream) is a failed download, counted and retried on its own budget', async () => {
    const { video, calls } = runner({}, {
      save: async (stream) => {
        stream.destroy(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }));
        await stream.toArray();
      },
    });
    const { result } = (await step(video)) as { result: { done: boolean; error: string } };
    expect(result).toMatchObject({ done: false, error: expect.stringContaining('the upstream video download broke off before the video was complete') });
    expect([calls.counted, calls.completed]).toEqual([1, 0]);
  });
});
