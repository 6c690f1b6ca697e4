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

/**
 * `candidates` in an order drawn before (`drawn`, member ids in that order), so that one draw decides
 * a piece of work however often it is routed. Priority tiers still come first (a member whose
 * priority changed meanwhile moves with it); members the draw did not know (added since) follow the
 * known ones of their tier in a weighted order of their own.
 */
export function followOrder<M extends SelectableMember>(candidates: readonly M[], drawn: readonly string[], random: () => number = Math.random): M[] {
  const rank = new Map(drawn.map((id, i) => [id, i]));
  const unknown = orderMembers(
    candidates.filter((c) => !rank.has(c.id)),
    random,
  );
  unknown.forEach((c, i) => rank.set(c.id, drawn.length + i));
  return [...candidates].sort((a, b) => b.priority - a.priority || rank.get(a.id)! - rank.get(b.id)!);
}
