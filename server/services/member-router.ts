/**
 * Picks the group member that serves a request: the highest priority among enabled members whose
 * provider has an adapter here, then a weighted random choice among equals.
 */
import type { MemberCandidate } from '../repositories/routing.repository.ts';

export function pickMember(candidates: MemberCandidate[], supported: (provider: string) => boolean, random: () => number = Math.random): MemberCandidate | undefined {
  const usable = candidates.filter((c) => supported(c.provider) && (c.provider === 'local' || c.credentialsCiphertext !== null));
  if (usable.length === 0) return undefined;
  const top = Math.max(...usable.map((c) => c.priority));
  const tier = usable.filter((c) => c.priority === top);
  const total = tier.reduce((sum, c) => sum + c.weight, 0);
  let r = random() * total;
  for (const c of tier) {
    r -= c.weight;
    if (r < 0) return c;
  }
  return tier[tier.length - 1];
}
