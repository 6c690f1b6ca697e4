/**
 * The order in which the pool tries a group's members: the highest priority tier first; inside a
 * tier, a weighted random order (each next member drawn in proportion to its weight among those
 * left), so the first choice follows the weights and failover spreads the same way. `random` is
 * injectable so tests are exact.
 */
export interface SelectableMember {
  id: string;
  priority: number;
  weight: number;
}

export function orderMembers<M extends SelectableMember>(candidates: readonly M[], random: () => number = Math.random): M[] {
  const tiers = new Map<number, M[]>();
  for (const c of candidates) tiers.set(c.priority, [...(tiers.get(c.priority) ?? []), c]);
  const ordered: M[] = [];
  for (const priority of [...tiers.keys()].sort((a, b) => b - a)) {
    const left = [...tiers.get(priority)!];
    while (left.length > 0) {
      const total = left.reduce((sum, c) => sum + Math.max(0, c.weight), 0);
      let index = left.length - 1;
      if (total > 0) {
        let r = random() * total;
        index = left.findIndex((c) => (r -= Math.max(0, c.weight)) < 0);
        if (index < 0) index = left.length - 1;
      } else index = Math.floor(random() * left.length);
      ordered.push(left.splice(index, 1)[0]!);
    }
  }
  return ordered;
}

/** The member a request goes to first (the head of `orderMembers`). */
export function pickMember<M extends SelectableMember>(candidates: readonly M[], random: () => number = Math.random): M | undefined {
  return orderMembers(candidates, random)[0];
}
