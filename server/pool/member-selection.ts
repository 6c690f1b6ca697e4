/**
 * Picks the group member that serves a request: the highest priority tier first, then a weighted
 * random choice inside the tier. `random` is injectable so tests are exact.
 */
export interface SelectableMember {
  id: string;
  priority: number;
  weight: number;
}

export function pickMember<M extends SelectableMember>(candidates: readonly M[], random: () => number = Math.random): M | undefined {
  if (candidates.length === 0) return undefined;
  const top = Math.max(...candidates.map((c) => c.priority));
  const tier = candidates.filter((c) => c.priority === top);
  const total = tier.reduce((sum, c) => sum + c.weight, 0);
  let r = random() * total;
  for (const c of tier) {
    r -= c.weight;
    if (r < 0) return c;
  }
  return tier[tier.length - 1];
}
