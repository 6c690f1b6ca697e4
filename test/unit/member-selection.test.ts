import { describe, expect, it } from 'vitest';
import { pickMember } from '../../server/pool/member-selection.ts';

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
