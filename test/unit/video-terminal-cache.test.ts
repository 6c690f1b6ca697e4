/**
 * The terminal video tasks a poll keeps in memory (VideoService.get): an invalidation heard while a
 * poll's read is in flight is not undone by that read. The read may have seen the row before its
 * change; keeping it would serve the old row, a deleted video's URL say, for a minute.
 */
import { describe, expect, it } from 'vitest';
import type { PolledVideoTaskRow } from '../../server/repositories/video-task.repository.ts';
import type { AuthContext } from '../../server/services/auth.service.ts';
import { VideoService } from '../../server/services/video/video.service.ts';

const completed = {
  id: 'vid_x', accountId: 'acct_a', status: 'completed', model: 'm', durationSeconds: 4, aspectRatio: '16:9', resolution: '720p',
  generateAudio: false, billingKind: 'snapshot', billingMode: 'per_second', unitPrice: 1_000_000, quotedCredits: 4_000_000, actualCredits: 4_000_000,
  inputMode: 'text', inputFileIds: [], referenceVideos: [], referenceAudios: [], createdAt: new Date(), completedAt: new Date(),
  outputFileId: 'file_out', errorCode: null, errorMessage: null, mediaExpiresAt: null,
} as unknown as PolledVideoTaskRow;

describe('terminal video tasks kept by polls', () => {
  it('a row read before an invalidation is not kept after it: the next poll reads the row again', async () => {
    let stored = completed; // what the database holds
    let queries = 0;
    let release!: () => void;
    let gate: Promise<void> | undefined;
    const tasks = {
      async findForAccount(id: string, accountId: string) {
        queries++;
        const snapshot = stored; // the statement's snapshot, taken when it starts
        if (gate) await gate;
        return snapshot.id === id && snapshot.accountId === accountId ? snapshot : undefined;
      },
    };
    const files = { downloadUrl: async (id: string) => `https://gateway.test/v1/files/${id}?signature=x` };
    const videos = new VideoService({ keepTerminalTasks: 100, tasks, files } as never);
    const auth = { apiKeyId: 'key_a', accountId: 'acct_a', groupId: 'g' } as AuthContext;

    // Kept as usual: the second poll makes no query.
    await videos.get(auth, 'vid_x');
    await videos.get(auth, 'vid_x');
    expect(queries).toBe(1);

    // A poll whose read started before the owner deleted the video; the delete's invalidation comes first.
    videos.invalidateCaches();
    gate = new Promise((r) => (release = r));
    const inFlight = videos.get(auth, 'vid_x');
    stored = { ...completed, outputFileId: null };
    videos.invalidateCaches();
    release();
    gate = undefined;
    await inFlight; // that one answer may show the row as it was when it was read

    const later = await videos.get(auth, 'vid_x');
    expect(queries).toBe(3);
    expect(later.video_url).toBeUndefined();
    // And that fresh row is kept again.
    await videos.get(auth, 'vid_x');
    expect(queries).toBe(3);
  });
});
