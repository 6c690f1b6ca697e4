import { describe, expect, it } from 'vitest';
import { followOrder, pickMember } from '../../server/pool/member-selection.ts';

const member = (id: string, priority: number, weight: number) => ({ id, priority, weight });

/** A random source that returns the given values in turn. */
const sequence = (...values: number[]) => {
  let i = 0;
  return () => values[i++ % values.length]!;
};

describe('pickMember', () => {
  it('returns undefined without candidates', () => {
    expect(pickMember([])).toBeUndefined();
  });

  it('only picks from the highest priority tier', () => {
    const candidates = [member('low', 0, 100), member('high-a', 10, 1), member('high-b', 10, 1)];
    const picked = new Set(Array.from({ length: 50 }, (_, i) => pickMember(candidates, () => i / 50)!.id));
    expect(picked).toEqual(new Set(['high-a', 'high-b']));
  });

  it('splits a tier in proportion to weight (exact with an injected random)', () => {
    const candidates = [member('a', 5, 1), member('b', 5, 3)];
    // Total weight 4: [0, 1) is a, [1, 4) is b.
    expect(pickMember(candidates, sequence(0))!.id).toBe('a');
    expect(pickMember(candidates, sequence(0.2499))!.id).toBe('a');
    expect(pickMember(candidates, sequence(0.25))!.id).toBe('b');
    expect(pickMember(candidates, sequence(0.9999))!.id).toBe('b');
    const counts = { a: 0, b: 0 };
    for (let i = 0; i < 4000; i++) counts[pickMember(candidates, () => i / 4000)!.id as 'a' | 'b']++;
    expect(counts).toEqual({ a: 1000, b: 3000 });
  });
});

describe('followOrder', () => {
  const ids = (members: { id: string }[]) => members.map((m) => m.id);

  it('keeps an order drawn before, whatever the weights would draw now', () => {
    const candidates = [member('heavy', 5, 3), member('light', 5, 1), member('spare', 0, 1)];
    // This random would put heavy first in a new draw: the drawn order wins.
    expect(ids(followOrder(candidates, ['light', 'heavy', 'spare'], sequence(0)))).toEqual(['light', 'heavy', 'spare']);
  });

  it('keeps priority tiers first and places members the draw did not know after the known ones of their tier', () => {
    const candidates = [member('b', 5, 1), member('new', 5, 100), member('a', 5, 1), member('promoted', 9, 1)];
    expect(ids(followOrder(candidates, ['a', 'promoted', 'b', 'gone'], sequence(0)))).toEqual(['promoted', 'a', 'b', 'new']);
  });
});
