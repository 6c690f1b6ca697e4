/**
 * Metrics that must not lie or hang: the operator gauges of a scrape while their read gets no
 * answer (a frozen database, a saturated pool), and the upstream call metrics of MemberHealth —
 * every call counted by outcome, its duration and in-flight count ended before the health writes.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { createMetrics, registerOperatorGauges, type OperatorGaugeSource } from '../../server/metrics.ts';
import { MemberHealth } from '../../server/pool/member-health.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import type { MemberHealthRepository } from '../../server/repositories/member-health.repository.ts';

type Stats = Awaited<ReturnType<OperatorGaugeSource>>;

const stats = (creditsHeld: number): Stats => ({ creditsHeld, holdsHeld: 1, unfinished: [], needsAttention: 0, oldestNeedsAttentionSeconds: 0 });

/** A scrape, and whether it has answered yet. */
function scrape(registry: ReturnType<typeof createMetrics>['registry']) {
  const state: { text: string | undefined } = { text: undefined };
  void registry.metrics().then((text) => (state.text = text));
  return state;
}

const heldCredits = (text: string | undefined) => /^mediagate_credits_held (\S+)$/m.exec(text ?? '')?.[1];

describe('the operator gauges while their read gets no answer', () => {
  afterEach(() => vi.useRealTimers());

  it('answer within the timeout with the last values, and a later scrape is not held by the stuck read either', async () => {
    vi.useFakeTimers();
    const { registry } = createMetrics({ defaultMetrics: false });
    const reads: { resolve: (s: Stats) => void }[] = [];
    const source = vi.fn<OperatorGaugeSource>(() => new Promise<Stats>((resolve) => reads.push({ resolve })));
    registerOperatorGauges(registry, source, 1_500);

    const first = scrape(registry);
    await vi.advanceTimersByTimeAsync(0);
    reads[0]!.resolve(stats(2_000_000));
    await vi.advanceTimersByTimeAsync(0);
    expect(heldCredits(first.text)).toBe('2');

    // The database freezes: this read never answers.
    const second = scrape(registry);
    await vi.advanceTimersByTimeAsync(1_499);
    expect(second.text).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(heldCredits(second.text)).toBe('2');

    // The next scrape shares the stuck read, with a timeout of its own.
    const third = scrape(registry);
    await vi.advanceTimersByTimeAsync(1_500);
    expect(heldCredits(third.text)).toBe('2');
    expect(source).toHaveBeenCalledTimes(2);

    // The read answers at last; the scrape after it reads again and shows the new values.
    reads[1]!.resolve(stats(5_000_000));
    await vi.advanceTimersByTimeAsync(0);
    const fourth = scrape(registry);
    await vi.advanceTimersByTimeAsync(0);
    reads[2]!.resolve(stats(7_000_000));
    await vi.advanceTimersByTimeAsync(0);
    expect(heldCredits(fourth.text)).toBe('7');
    expect(source).toHaveBeenCalledTimes(3);
  });
});

describe('MemberHealth upstream call metrics', () => {
  const account = { memberId: 'mem_metrics', provider: 'openai' } as UpstreamAccount;
  const labels = { provider: 'openai', member: 'mem_metrics' };

  /** A repository whose writes wait until the test lets them go (`release`); `entered` once one is reached. */
  function gatedRepo() {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let entered!: () => void;
    const reached = new Promise<void>((resolve) => (entered = resolve));
    const wait = async <T>(value: T) => {
      entered();
      await gate;
      return value;
    };
    const repo = {
      recordFailure: vi.fn(() => wait({ consecutiveFailures: 1, counted: true })),
      recordSuccesses: vi.fn(() => wait(undefined)),
      releaseProbe: vi.fn(() => wait(undefined)),
    };
    return { repo: repo as unknown as MemberHealthRepository, calls: repo, reached, release };
  }

  async function values(metrics: ReturnType<typeof createMetrics>) {
    const requests = (await metrics.upstreamRequests.get()).values.filter((v) => v.labels.member === labels.member).map((v) => [v.labels.outcome, v.value]);
    const inFlight = (await metrics.upstreamInFlight.get()).values.find((v) => v.labels.member === labels.member)?.value;
    const durations = (await metrics.upstreamDuration.get()).values.find((v) => v.metricName === 'mediagate_upstream_request_duration_seconds_count' && v.labels.member === labels.member)?.value ?? 0;
    return { requests: Object.fromEntries(requests), inFlight, durations };
  }

  it('a 429 is counted, timed and out of flight before its health is written', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const { repo, calls, reached, release } = gatedRepo();
    const health = new MemberHealth(repo, metrics, createLogger('silent'));
    const call = health.observe(account, () => Promise.reject(new ProviderError('rate_limited', 'slow down')));
    await reached;
    // Its one write (the strike and the backoff in one statement) is waiting: the metrics are already in.
    expect(calls.recordFailure).toHaveBeenCalledTimes(1);
    expect(await values(metrics)).toEqual({ requests: { rate_limited: 1 }, inFlight: 0, durations: 1 });
    release();
    await expect(call).rejects.toThrow('slow down');
    expect(calls.recordFailure).toHaveBeenCalledTimes(1);
    expect(await values(metrics)).toEqual({ requests: { rate_limited: 1 }, inFlight: 0, durations: 1 });
  });

  it('a call that ends without an answer about the member is counted: aborted by its caller, or error', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const { repo, release } = gatedRepo();
    release();
    const health = new MemberHealth(repo, metrics, createLogger('silent'));
    const caller = new AbortController();
    caller.abort(new Error('client disconnected'));
    await expect(health.observe(account, () => Promise.reject(caller.signal.reason), undefined, caller.signal)).rejects.toThrow('client disconnected');
    await expect(health.observeAccepted(account, () => Promise.reject(new DOMException('The operation was aborted', 'AbortError')))).rejects.toThrow('aborted');
    await expect(health.observeAccepted(account, () => Promise.reject(new TypeError('a bug in the gateway')))).rejects.toThrow('a bug');
    await expect(health.observe(account, () => Promise.resolve('ok'))).resolves.toBe('ok');
    expect(await values(metrics)).toEqual({ requests: { aborted: 2, error: 1, ok: 1 }, inFlight: 0, durations: 4 });
    await health.stop();
  });
});
