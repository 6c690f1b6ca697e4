/**
 * The conformance kit every video adapter runs against its fake upstream (docs/ARCHITECTURE.md,
 * "How to add a provider"): the same questions for every upstream, answered through the adapter's
 * own calls (`submit`, `poll`, `download`, `cancel`) over real HTTP to the fake, so that the rest of
 * the gateway (pool, retry policy, settlement) can rely on what an adapter's answers mean:
 *
 *   - a job runs: submit returns an id, polls say running then succeeded, the output streams;
 *   - a first frame reaches the upstream as the image it is (type, and size unless the wire resizes);
 *   - failures are classified by kind: rate limits with their wait, 5xx and unreachable hosts as
 *     retryable, refused credentials as auth, an unknown model or a base URL that redirects as the
 *     member's configuration, a
 *     policy refusal and a failed job as such, an output that is gone as permanent;
 *   - a submit the upstream answered 2xx is maybe accepted whatever else goes wrong (no job id, a
 *     body that is not JSON, too long, or cut off): the job may be running, so it must never be
 *     sent to another member (design §8);
 *   - where the upstream honours one, the task id works as an idempotency key; where the adapter
 *     cancels, a running job is cancelled (features an adapter does not claim get no test).
 *
 * An adapter's test supplies a `VideoConformanceTarget` for its fake and calls
 * `describeVideoConformance`. The fake stays faithful to the upstream; the target only says how to
 * steer it (which prompt makes it fail, which route a fault goes to).
 */
import { randomBytes } from 'node:crypto';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { ProviderError } from '../../server/providers/provider-error.ts';
import { MAX_TEXT_BYTES } from '../../server/providers/upstream-http.ts';
import type { MediaInput, UpstreamAccount, VideoJob, VideoProvider, VideoStatus } from '../../server/providers/types.ts';
import { providerErrorOf } from './api-error.ts';

export type ConformanceRoute = 'submit' | 'poll' | 'download';

export interface VideoConformanceTarget {
  provider: VideoProvider;
  /** An account of the running fake with valid credentials. */
  account(): UpstreamAccount;
  /** An account whose credentials the fake refuses. */
  badAccount(): UpstreamAccount;
  /** A job the upstream accepts (its model, duration, ratio and resolution valid for the fake). */
  job(o?: { prompt?: string; model?: string; firstFrame?: MediaInput; taskId?: string }): VideoJob;
  /** A prompt whose job the fake fails under its content policy, and one it fails otherwise. */
  policyPrompt: string;
  failPrompt: string;
  /** A model id the upstream refuses, and the kind that must make (`misconfigured`, or `model_not_open` where the upstream says so). */
  unknownModel: string;
  unknownModelKind: 'misconfigured' | 'model_not_open';
  /** The next request of `route` gets the fake's rate-limit answer, asking to wait `seconds`. */
  rateLimitNext(route: ConformanceRoute, seconds: number): void;
  /** The next request of `route` gets the fake's 5xx answer. */
  serverErrorNext(route: ConformanceRoute): void;
  /** The finished job's output is gone (an expired link) from now on. */
  expireOutput(jobId: string): void;
  /** What the fake received as the job's first frame. */
  receivedFirstFrame(jobId: string): { mimeType: string; width: number; height: number } | undefined;
  /** Whether the wire sends the first frame at its own size (false: the adapter resizes it to the output size). */
  framesKeepTheirSize: boolean;
  /** The number of jobs the fake has, to check a resubmit created none. */
  jobCount(): number;
  /** Where the adapter cancels: whether the fake's job `jobId` was cancelled. */
  wasCancelled?(jobId: string): boolean;
  /** How long to poll at most before the job should have finished (default 20 s). */
  maxRunMs?: number;
}

/** A stored input as adapters see it, from bytes in memory (the test's own, not the gateway's store). */
export function mediaInputOf(bytes: Buffer, contentType: string, width: number | null = null, height: number | null = null): MediaInput {
  return { contentType, bytes: bytes.length, width, height, open: () => Readable.from([bytes]), url: async () => 'http://127.0.0.1:9/unused' };
}

/** A noise PNG of the given size (incompressible: its bytes are really sent). */
export async function noiseFrame(width: number, height: number): Promise<MediaInput> {
  const png = await sharp(randomBytes(width * height * 3), { raw: { width, height, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
  return mediaInputOf(png, 'image/png', width, height);
}

const never = new AbortController().signal;

/** Polls until the job leaves `running`; returns its last status. */
async function runToEnd(t: VideoConformanceTarget, account: UpstreamAccount, jobId: string, job: VideoJob): Promise<VideoStatus> {
  const deadline = Date.now() + (t.maxRunMs ?? 20_000);
  for (;;) {
    const status = await t.provider.poll(account, jobId, job, never);
    if (status.state !== 'running') return status;
    if (Date.now() > deadline) throw new Error(`job ${jobId} still running after ${t.maxRunMs ?? 20_000} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function bytesOf(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/**
 * What an upstream offers that others do not; the kit checks each one an adapter claims (and
 * registers no test for what it does not).
 */
export interface VideoConformanceFeatures {
  /** The upstream honours the task id as an idempotency key (same task id → the same job). */
  idempotent: boolean;
  /** The adapter cancels jobs (`VideoProvider.cancel`). */
  cancels: boolean;
}

export function describeVideoConformance(name: string, features: VideoConformanceFeatures, target: () => VideoConformanceTarget): void {
  describe(`${name}: video adapter conformance`, () => {
    it('runs a job: submit returns its id, polls say running then succeeded, the output streams as video', async () => {
      const t = target();
      const account = t.account();
      const job = t.job();
      const jobId = await t.provider.submit(account, job, never);
      expect(jobId).toEqual(expect.any(String));
      const first = await t.provider.poll(account, jobId, job, never);
      expect(['running', 'succeeded']).toContain(first.state);
      const done = await runToEnd(t, account, jobId, job);
      expect(done.state).toBe('succeeded');
      const content = await t.provider.download(account, jobId, (done as { output: Record<string, string> }).output, job, never);
      expect(content.contentType).toMatch(/^video\//);
      const bytes = await bytesOf(content.stream);
      expect(bytes.length).toBeGreaterThan(0);
      if (content.bytes !== undefined) expect(bytes.length).toBe(content.bytes);
    });

    it('sends a first frame as the image it is, read from its stream', async () => {
      const t = target();
      const frame = await noiseFrame(640, 360);
      const jobId = await t.provider.submit(t.account(), t.job({ firstFrame: frame }), never);
      const got = t.receivedFirstFrame(jobId);
      expect(got).toBeDefined();
      if (t.framesKeepTheirSize) expect(got).toEqual({ mimeType: 'image/png', width: 640, height: 360 });
      else expect(got!.mimeType).toMatch(/^image\//);
    });

    it('classifies a rate limit with the wait the upstream asked for, on every call', async () => {
      const t = target();
      const account = t.account();
      const job = t.job();
      t.rateLimitNext('submit', 7);
      const submit = await providerErrorOf(t.provider.submit(account, job, never));
      expect([submit.kind, submit.transient]).toEqual(['rate_limited', true]);
      expect(submit.retryAfterMs).toBe(7000);
      const jobId = await t.provider.submit(account, job, never);
      t.rateLimitNext('poll', 3);
      const poll = await providerErrorOf(t.provider.poll(account, jobId, job, never));
      expect([poll.kind, poll.retryAfterMs]).toEqual(['rate_limited', 3000]);
    });

    it('classifies a 5xx on submit, poll and download, and an unreachable upstream, as retryable', async () => {
      const t = target();
      const account = t.account();
      const job = t.job();
      t.serverErrorNext('submit');
      expect((await providerErrorOf(t.provider.submit(account, job, never))).kind).toBe('retryable');
      const jobId = await t.provider.submit(account, job, never);
      t.serverErrorNext('poll');
      expect((await providerErrorOf(t.provider.poll(account, jobId, job, never))).kind).toBe('retryable');
      const done = await runToEnd(t, account, jobId, job);
      t.serverErrorNext('download');
      expect((await providerErrorOf(t.provider.download(account, jobId, (done as { output: Record<string, string> }).output, job, never))).kind).toBe('retryable');
      const unreachable = { ...account, baseUrl: 'http://127.0.0.1:9/v1' };
      const lost = await providerErrorOf(t.provider.submit(unreachable, job, never));
      expect([lost.kind, lost.message]).toEqual(['retryable', expect.stringMatching(/could not be reached/)]);
    });

    it("classifies a base URL that answers with a redirect (moved, or http:// to https://) as the member's configuration, on submit and poll", async () => {
      const t = target();
      const moved = createServer((req, res) => {
        req.resume();
        res.writeHead(308, { location: `https://moved.invalid${req.url}` }).end();
      });
      await new Promise<void>((resolve) => moved.listen(0, '127.0.0.1', resolve));
      try {
        const job = t.job();
        const jobId = await t.provider.submit(t.account(), job, never);
        const account = { ...t.account(), baseUrl: `http://127.0.0.1:${(moved.address() as AddressInfo).port}/v1` };
        expect((await providerErrorOf(t.provider.submit(account, job, never))).kind).toBe('misconfigured');
        // A job already running is not failed for it: the operator can put the base URL right.
        expect((await providerErrorOf(t.provider.poll(account, jobId, job, never))).kind).toBe('misconfigured');
      } finally {
        moved.closeAllConnections();
        moved.close();
      }
    });

    it('marks a submit answered 2xx without a job id, or with a body that cannot be read, as maybe accepted (retried on the same member, never sent to another)', async () => {
      const t = target();
      // No upstream answers so on purpose, so a tiny server stands in for every one of them; each
      // answer is 2xx, so whatever the upstream's envelope, it took the request.
      const answers: Record<string, (res: ServerResponse) => void> = {
        'JSON without an id': (res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'),
        'an HTML page': (res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>OK</body></html>'),
        'a body over the text cap': (res) => res.writeHead(200, { 'content-type': 'application/json' }).end(Buffer.alloc(MAX_TEXT_BYTES + 1, 0x20)),
        'a body cut off': (res) => {
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': '64' });
          res.write('{"id": "job', () => res.socket?.destroy());
        },
      };
      let answer = answers['JSON without an id']!;
      const accepting = createServer((req, res) => {
        req.resume();
        req.once('end', () => answer(res));
      });
      await new Promise<void>((resolve) => accepting.listen(0, '127.0.0.1', resolve));
      try {
        const account = { ...t.account(), baseUrl: `http://127.0.0.1:${(accepting.address() as AddressInfo).port}/v1` };
        const seen: Record<string, [string, boolean]> = {};
        for (const [name, answerWith] of Object.entries(answers)) {
          answer = answerWith;
          const err = await providerErrorOf(t.provider.submit(account, t.job(), never));
          seen[name] = [err.kind, err.maybeAccepted];
        }
        expect(seen).toEqual(Object.fromEntries(Object.keys(answers).map((name) => [name, ['retryable', true]])));
      } finally {
        accepting.closeAllConnections();
        accepting.close();
      }
    });

    it('classifies refused credentials as auth, without quoting them', async () => {
      const t = target();
      const bad = t.badAccount();
      const err = await providerErrorOf(t.provider.submit(bad, t.job(), never));
      expect(err.kind).toBe('auth');
      for (const secret of Object.values(bad.credentials)) expect(err.message).not.toContain(secret);
    });

    it("classifies a model the upstream does not have as the member's configuration, not the request's", async () => {
      const t = target();
      const err = await providerErrorOf(t.provider.submit(t.account(), t.job({ model: t.unknownModel }), never));
      expect(err.kind).toBe(t.unknownModelKind);
    });

    it('reports a job refused under the content policy, and a job that failed, with their reasons', async () => {
      const t = target();
      const account = t.account();
      for (const [prompt, kinds] of [
        [t.policyPrompt, ['policy']],
        [t.failPrompt, ['failed', 'invalid_request']],
      ] as const) {
        const job = t.job({ prompt });
        const jobId = await t.provider.submit(account, job, never);
        const end = await runToEnd(t, account, jobId, job);
        expect(end.state).toBe('failed');
        const error = (end as { error: ProviderError }).error;
        expect(kinds).toContain(error.kind);
        expect(error.message.length).toBeGreaterThan(0);
      }
    });

    it('treats an output that is gone as a permanent failure', async () => {
      const t = target();
      const account = t.account();
      const job = t.job();
      const jobId = await t.provider.submit(account, job, never);
      const done = await runToEnd(t, account, jobId, job);
      t.expireOutput(jobId);
      const err = await providerErrorOf(t.provider.download(account, jobId, (done as { output: Record<string, string> }).output, job, never));
      expect([err.kind, err.transient]).toEqual(['failed', false]);
    });

    if (features.idempotent)
      it('sends the task id as the idempotency key: the same task submitted twice is one job', async () => {
      const t = target();
      const account = t.account();
      const job = t.job({ taskId: `vid_conformance_${randomBytes(6).toString('hex')}` });
      const first = await t.provider.submit(account, job, never);
      const before = t.jobCount();
      const again = await t.provider.submit(account, job, never);
      expect(again).toBe(first);
      expect(t.jobCount()).toBe(before);
    });

    if (features.cancels)
      it('cancels a running job', async () => {
      const t = target();
      expect(t.provider.cancel).toBeTypeOf('function');
      const account = t.account();
      const job = t.job({ prompt: 'a very long job' });
      const jobId = await t.provider.submit(account, job, never);
      await t.provider.cancel!(account, jobId, never);
      expect(t.wasCancelled?.(jobId)).toBe(true);
    });
  });
}
