/**
 * HostSlots (webhook-runner.ts): the cap of webhook deliveries in flight per target host, when a
 * delivery put back comes again (later the more wait for its host, within a bound), and the map of
 * hosts forgetting a host once nothing is in flight or waiting for it.
 */
import { describe, expect, it } from 'vitest';
import { HostSlots, hostOf } from '../../server/services/webhooks/webhook-runner.ts';

/** A clock the test moves by hand. */
function clock(start = 1_000_000) {
  let now = start;
  return { now: () => now, advance: (ms: number) => void (now += ms) };
}

type Turn = ReturnType<HostSlots['take']>;
const slotOf = (t: Turn) => {
  if (!('release' in t)) throw new Error(`expected a slot, was put back for ${t.retryInMs} ms`);
  return t;
};
const delayOf = (t: Turn) => {
  if (!('retryInMs' in t)) throw new Error('expected to be put back, got a slot');
  return t.retryInMs;
};

describe('webhook deliveries per host', () => {
  it('gives at most the cap of slots per host, independently of other hosts, and a released slot again', () => {
    const c = clock();
    const slots = new HostSlots(2, c.now, () => 0);
    const a1 = slotOf(slots.take('slow.example:443'));
    slotOf(slots.take('slow.example:443'));
    expect(delayOf(slots.take('slow.example:443'))).toBeGreaterThanOrEqual(1000);
    // Another host is not held up by the first one's cap.
    slotOf(slots.take('fast.example:443'));
    slotOf(slots.take('fast.example:443'));
    a1.release();
    a1.release(); // twice is once
    slotOf(slots.take('slow.example:443'));
    expect(delayOf(slots.take('slow.example:443'))).toBeGreaterThanOrEqual(1000);
  });

  it('puts back deliveries jittered between 1 and 3 s when none waits for the host', () => {
    for (const random of [0, 0.5, 0.999]) {
      const slots = new HostSlots(1, clock().now, () => random);
      slotOf(slots.take('h:80'));
      const delay = delayOf(slots.take('h:80'));
      expect(delay).toBe(Math.round(1000 + random * 2000));
    }
  });

  it('spreads a backlog over turns a slot apart, so a host that never answers costs few claims a second, up to a bound', () => {
    const c = clock();
    const slots = new HostSlots(4, c.now, () => 0);
    const held = [0, 1, 2, 3].map(() => slotOf(slots.take('dead.example:443')));
    // The host's sends take 10 s (its receiver never answers: the attempt's time limit).
    c.advance(10_000);
    held[0]!.release();
    slotOf(slots.take('dead.example:443'));
    // 1000 deliveries of one account claimed at once for that host: each is given a later turn,
    // 10 s / 4 slots = 2.5 s after the one before, until the turns reach a minute ahead.
    const delays = Array.from({ length: 1000 }, () => delayOf(slots.take('dead.example:443')));
    expect(delays.slice(0, 4)).toEqual([1000, 3500, 6000, 8500]);
    // How many come back within any 10 s: about as many as the host takes (4 per 10 s), not 1000.
    expect(delays.filter((d) => d < 11_000).length).toBe(4);
    // Bounded: a receiver that recovers has its backlog back within about a minute and a half.
    expect(Math.max(...delays)).toBe(61_000);
    const jittered = new HostSlots(1, c.now, () => 0.999);
    slotOf(jittered.take('h:80'));
    for (let i = 0; i < 200; i++) jittered.take('h:80');
    expect(delayOf(jittered.take('h:80'))).toBeLessThanOrEqual(93_000);
  });

  it('forgets a host once nothing is in flight to it and its put-back deliveries\' turns are over', () => {
    const c = clock();
    const slots = new HostSlots(1, c.now, () => 0);
    const a = slotOf(slots.take('a:80'));
    c.advance(100);
    a.release();
    expect(slots.size).toBe(0);

    // A host with deliveries waiting for their turns is kept (its queue goes on) …
    const b = slotOf(slots.take('b:80'));
    for (let i = 0; i < 3; i++) delayOf(slots.take('b:80'));
    b.release();
    expect(slots.size).toBe(1);
    // … and forgotten, once its turns are over, when another host comes (their deliveries went elsewhere).
    c.advance(60_000);
    slotOf(slots.take('c:80')).release();
    expect(slots.size).toBe(0);
  });

  it('names a target by its host and port, lower case, the scheme\'s port when none is given', () => {
    expect(hostOf('https://Hooks.Example.COM/x?y=1')).toBe('hooks.example.com:443');
    expect(hostOf('https://hooks.example.com:443/other')).toBe('hooks.example.com:443');
    expect(hostOf('http://hooks.example.com/x')).toBe('hooks.example.com:80');
    expect(hostOf('http://127.0.0.1:8080/x')).toBe('127.0.0.1:8080');
    expect(hostOf('http://[::1]:9000/')).toBe('[::1]:9000');
    expect(hostOf('not a url')).toBeUndefined();
  });
});
