/**
 * The account pool (design §8): which upstream account (group member) runs a piece of work, and the
 * one place that moves work to the next member when an account fails before accepting it.
 *
 * `route` orders the enabled members of the key's group that serve the model: the highest priority
 * tier first, a weighted random order inside each tier (`orderMembers`), drawn once per piece of
 * work (by `preselect` when the work names its first member on its row, else by `route` itself) and
 * followed for all of it, waits for capacity included: drawing again whenever the head could not be
 * named or taken would favour the members that can (issue 26, item 1). Members whose upstream cannot
 * run the work (`accepts`: a video request one provider kind serving the model refuses, an edit's
 * input an image upstream cannot take) are left out of the draw while another member can run it.
 * It skips members that are cooling down (shared member health) or at their `concurrency_limit`
 * (in-flight work counted in PostgreSQL, so the limit holds across instances), takes slots on the
 * first one left (the caller writes the member and the slots on its task row inside the slot lock),
 * and runs the work there.
 * The limit counts upstream calls: work that would run several calls at once (`slots`) takes as
 * many slots as it wants and the member has free, at least one, and is told how many. A failure
 * the upstream answered or that never reached it (a connection not made, 5xx, 429, rejected
 * credentials, exhausted quota) gives the slot back and moves on, at most MAX_ATTEMPTS members per
 * call; the work decides with `canFailover` whether it still can (a stream that reached the
 * client cannot; a call the upstream may have accepted, `maybeAccepted`, is never moved).
 * With no member free, `route` throws `NoCapacity` (after waiting up to `waitMs` for one).
 *
 * A member whose circuit is open and whose cooldown is over is half-open (member-health.ts): the
 * work that reaches it first claims its probe (one across all instances) before taking slots, and
 * runs as the probe; while the probe runs, every other piece of work treats the member as cooling.
 *
 * The candidates of a group and model (configuration and shared health, one query) are reused for
 * CANDIDATE_CACHE_MS (`POOL_CACHE_TTL_MS`, default 1 s): a failure this instance sees, and any admin change through it, drops them at
 * once, so only what other instances learned (a cooldown, rejected credentials) reaches this one up
 * to CANDIDATE_CACHE_MS late (it then meets the failure itself, at most once per member, and fails
 * over). Concurrency limits are never cached: a member with a limit is always checked under its
 * slot lock.
 *
 * Jobs already accepted upstream always go back to the member that accepted them
 * (`account(memberId)`, cached for a few seconds and dropped with the candidates: a changed or
 * deleted member is seen by running jobs at once where the change is heard, within ACCOUNT_CACHE_MS
 * elsewhere). Each account carries the version of the configuration it was read from, so a call made
 * with the old one (in flight across the change, or from a cache not yet dropped) cannot mark the
 * fixed member's credentials, account or model as failed (member-health.ts).
 */
import type { Executor } from '../db/database.ts';
import type { Transactor } from '../db/transaction.ts';
import { decryptSecret } from '../lib/secret-box.ts';
import { TtlCache } from '../lib/ttl-cache.ts';
import type { Logger } from '../logger.ts';
import { ProviderError } from '../providers/provider-error.ts';
import type { ProviderKind, ProviderRegistry } from '../providers/registry.ts';
import type { UpstreamAccount } from '../providers/types.ts';
import type { UpstreamMapping } from '../providers/kit/mapping.ts';
import type { MemberCandidate, RoutableMember, RoutingRepository } from '../repositories/routing.repository.ts';
import type { MemberHealth, ProbeClaim } from './member-health.ts';
import { followOrder, orderMembers } from './member-selection.ts';

/** How long a member's decrypted account is reused by `account()` (poll steps of thousands of jobs). */
export const ACCOUNT_CACHE_MS = 5000;
/** How long the candidates of a group and model are reused by default (see above; `POOL_CACHE_TTL_MS`). */
export const CANDIDATE_CACHE_MS = 1000;

/** Providers whose members run a catalog model through its operator-written mapping. */
const AGGREGATORS: ReadonlySet<string> = new Set(['fal', 'replicate']);
/** Members one piece of work is tried on before its error is final for this call. */
export const MAX_ATTEMPTS = 3;
/** Suggested wait when every member is at its concurrency limit. */
export const FULL_RETRY_MS = 1000;

/** No member could take the work now: all at their limit (`full`), cooling down, or none at all. */
export class NoCapacity extends Error {
  constructor(
    readonly reason: 'none' | 'full' | 'cooling',
    readonly retryAfterMs: number,
  ) {
    super(reason === 'none' ? 'no member serves this model' : `every member is ${reason === 'full' ? 'at its concurrency limit' : 'cooling down'}`);
    this.name = 'NoCapacity';
  }
}

/** How long a member that refused work with a 429 is put aside (a client told nothing waits 1 s). */
const waitOf = (err: ProviderError): number => err.waitMs ?? 1_000;

/** Errors that say nothing about the request, only about the account: another member may succeed. */
export function isFailover(err: ProviderError): boolean {
  return err.transient || ['auth', 'quota_exhausted', 'misconfigured', 'model_not_open', 'account_disabled'].includes(err.kind);
}

export interface RouteRequest {
  groupId: string;
  model: string;
  capability: 'image' | 'video';
  /**
   * How many slots the work would like on a member of this provider: the upstream calls it would
   * run there at once (default 1). It gets between 1 and that many, as many as the member has free.
   */
  slots?(provider: ProviderKind): number;
  /**
   * Writes the member and the slots taken on the task row (fenced by its attempt) with `db`: the
   * slot lock's transaction for members with a limit, a single statement otherwise; throws (the
   * caller's LeaseLost) when the fence no longer holds.
   */
  take(memberId: string, db: Executor, slots: number): Promise<void>;
  /** Clears the member from the task row after a failed attempt. */
  release(): Promise<void>;
  /** Whether a failure may still move to the next member (default: yes). */
  canFailover?(err: ProviderError): boolean;
  /**
   * Whether the member's upstream can run the work at all (default: yes). The members that cannot
   * are skipped while another one can: neither tried nor counted as full or cooling down. When
   * none can, none is skipped: the work meets its adapter's own refusal, as it would without this.
   */
  accepts?(account: UpstreamAccount): boolean;
  /** Wait up to this long for a member to be free before throwing NoCapacity (default 0). */
  waitMs?: number;
  /**
   * The routing order drawn for this work before (`Preselection.order`): followed instead of a new
   * draw, whatever its head turns out to be (limited, full or cooling).
   */
  order?: readonly string[];
  /**
   * A member already named on the work's row with its slots (`preselect`): tried first, without
   * taking slots again (unless it is cooling down by now; the next member's `take` replaces it).
   */
  first?: Preselected;
  signal?: AbortSignal;
  log: Logger;
}

/** A candidate as cached: its cooldown as a deadline on this process's clock, its account decrypted once. */
interface CachedCandidate extends RoutableMember {
  cooldownUntil: number;
  account: UpstreamAccount;
}

/** A member named for a piece of work before it is routed (`Pool.preselect`). */
export interface Preselected {
  memberId: string;
  slots: number;
}

/** The routing order drawn for a piece of work before its row is written (`Pool.preselect`). */
export interface Preselection {
  /** Member ids in the drawn order: passed to `route` as `order`, so the one draw decides the work. */
  order: string[];
  /** Its head, when the work can name it on its row as the row is written (no concurrency limit). */
  first?: Preselected;
}

type CandidateQuery = Pick<RouteRequest, 'groupId' | 'model' | 'capability' | 'slots'>;

export class Pool {
  private readonly accounts = new TtlCache<UpstreamAccount | undefined>(ACCOUNT_CACHE_MS);
  private readonly candidates: TtlCache<CachedCandidate[]>;
  private readonly mappings: TtlCache<Record<string, unknown>>;
  private readonly random: () => number;

  constructor(
    private readonly routing: RoutingRepository,
    private readonly providers: ProviderRegistry,
    private readonly tx: Transactor,
    readonly health: MemberHealth,
    private readonly secretKey: Buffer,
    options: { candidateCacheMs?: number; random?: () => number } = {},
  ) {
    const ttl = options.candidateCacheMs ?? CANDIDATE_CACHE_MS;
    this.candidates = new TtlCache(ttl);
    this.mappings = new TtlCache(ttl);
    this.random = options.random ?? Math.random;
  }

  /**
   * Runs `work` on a member chosen and failed over as described above, with the slots it took
   * there (at most that many upstream calls at once); returns its result.
   */
  async route<T>(req: RouteRequest, work: (account: UpstreamAccount, slots: number) => Promise<T>): Promise<T> {
    const deadline = Date.now() + (req.waitMs ?? 0);
    let drawn = req.order;
    for (let first = req.first; ; first = undefined) {
      try {
        const members = accepting(await this.loadCandidates(req), req);
        if (members.length === 0) throw new NoCapacity('none', 0);
        const order = drawn ? followOrder(members, drawn, this.random) : orderMembers(members, this.random);
        drawn = order.map((m) => m.id);
        return await this.routeOnce(req, order, first, work);
      } catch (err) {
        if (!(err instanceof NoCapacity) || err.reason === 'none') throw err;
        const left = deadline - Date.now();
        if (left <= 0 || req.signal?.aborted) throw err;
        await new Promise((r) => setTimeout(r, Math.min(left, 100 + this.random() * 150)));
      }
    }
  }

  /** Forgets the cached candidates and accounts (a member failed here, or an admin changed a group). */
  invalidate(): void {
    this.candidates.clear();
    this.mappings.clear();
    // Or the next poll of a running job would still call with the credentials an admin just replaced.
    this.accounts.clear();
  }

  /**
   * How an aggregator member (fal, Replicate) runs a catalog model: the model's mapping for the
   * member's provider (cached like the candidates), or undefined — for every other provider, and
   * for a model that has no mapping for this one (its adapter then refuses the job as the member's
   * misconfiguration).
   */
  async mappingFor(account: UpstreamAccount, model: string): Promise<UpstreamMapping | undefined> {
    if (!AGGREGATORS.has(account.provider)) return undefined;
    const mappings = await this.mappings.get(model, () => this.routing.upstreamMappings(model));
    return mappings[account.provider] as UpstreamMapping | undefined;
  }

  /**
   * Draws the routing order of new work before its row is written. The work passes the order to
   * `route` (`order`), which follows it instead of drawing again, and names `first` (the head among
   * the members not cooling down, when it has no concurrency limit) on its row as the row is written:
   * one statement fewer than `take` after it. A head with a limit is not named: its slots are
   * counted under its slot lock, by `route`, which still tries it first.
   */
  async preselect(req: CandidateQuery & Pick<RouteRequest, 'accepts'>): Promise<Preselection> {
    // Drawn among the members that accept the work, as route draws it.
    const members = accepting(await this.loadCandidates(req), req);
    const now = Date.now();
    // The whole order is drawn (cooling members included, as route draws it): its first member not
    // cooling down is distributed as the head of a draw among those members alone.
    const order = orderMembers(members, this.random);
    const head = order.find((m) => m.cooldownUntil <= now);
    const ids = order.map((m) => m.id);
    // A half-open head is not named either: route claims its probe first.
    if (!head || head.concurrencyLimit !== null || head.circuitOpen) return { order: ids };
    return { order: ids, first: { memberId: head.id, slots: wantedSlots(head, req) } };
  }

  /**
   * The accounts of the members `route` would choose from (before `accepts`), cooling ones
   * included: for a check of the work against each member's upstream before anything is held.
   */
  async serving(req: Pick<RouteRequest, 'groupId' | 'model' | 'capability'>): Promise<UpstreamAccount[]> {
    return (await this.loadCandidates(req)).map((m) => m.account);
  }

  private loadCandidates(req: CandidateQuery): Promise<CachedCandidate[]> {
    return this.candidates.get(`${req.capability}\n${req.groupId}\n${req.model}`, async () => {
      const now = Date.now();
      const members = await this.routing.candidates(req.groupId, req.model, this.providers.kindsFor(req.capability), this.providers.credentialFreeKinds());
      return members.map((m) => ({ ...m, cooldownUntil: now + m.cooldownMs, account: this.toAccount(m) }));
    });
  }

  /** Tries the members in `order` (see the class comment); throws NoCapacity when none could take the work. */
  private async routeOnce<T>(req: RouteRequest, order: CachedCandidate[], first: Preselected | undefined, work: (account: UpstreamAccount, slots: number) => Promise<T>): Promise<T> {
    const now = Date.now();
    const named = first && order.find((m) => m.id === first.memberId);
    // The named member goes first: the members ahead of it in the drawn order were cooling down when it was named.
    const tried = named ? [named, ...order.filter((m) => m !== named)] : order;
    let attempts = 0;
    let full = false;
    let cooldownMs = Number.POSITIVE_INFINITY;
    let lastError: ProviderError | undefined;
    /** Of the members that refused the work with a 429, the one that can take it soonest: what the client is told to wait. */
    let soonest: ProviderError | undefined;
    for (const member of tried) {
      if (attempts >= MAX_ATTEMPTS) break;
      const coolingMs = member.cooldownUntil - now;
      if (coolingMs > 0) {
        cooldownMs = Math.min(cooldownMs, coolingMs);
        continue;
      }
      const admitted = await this.admit(member, member === named ? first : undefined, req);
      if (admitted === 'probing') {
        // Another call (of any instance) is probing it: cooling until that ends.
        cooldownMs = Math.min(cooldownMs, FULL_RETRY_MS);
        continue;
      }
      if (admitted === 'full') {
        full = true;
        continue;
      }
      const { slots, probe } = admitted;
      attempts++;
      const { account } = member;
      try {
        const result = await this.health.observe(account, () => work(account, slots), probe, req.signal);
        // The probe's success closed the circuit: this instance routes there at once too.
        if (probe) this.invalidate();
        return result;
      } catch (err) {
        // What the member's failure taught (recorded by observe) applies to the next request at once.
        if (err instanceof ProviderError && (err.kind === 'misconfigured' || err.kind === 'model_not_open')) await this.health.faultModel(account, req.model, err);
        if (err instanceof ProviderError && isFailover(err)) this.invalidate();
        if (!(err instanceof ProviderError) || !isFailover(err) || !(req.canFailover?.(err) ?? true)) throw err;
        await req.release();
        lastError = err;
        if (err.kind === 'rate_limited' && (!soonest || waitOf(err) < waitOf(soonest))) soonest = err;
        req.log.warn({ memberId: member.id, kind: err.kind, err: err.message }, 'upstream member failed before accepting the work; trying the next member');
      }
    }
    if (lastError) {
      // Every member is rate-limited or cooling: the client can retry when the first of them is free.
      if (lastError.kind !== 'rate_limited' || !soonest) throw lastError;
      // Still the upstream's refusal (calls were made: never NoCapacity, which says none was),
      // told the wait of a member cooling down when it is free sooner.
      if (cooldownMs < waitOf(soonest)) soonest.cooldownMs = cooldownMs;
      throw soonest;
    }
    throw full ? new NoCapacity('full', Math.min(FULL_RETRY_MS, cooldownMs)) : new NoCapacity('cooling', cooldownMs);
  }

  /**
   * Lets the work onto `member`: claims its probe first when it is half-open, then takes its slots
   * (or keeps those already `named` on the work's row). 'probing': another call holds the probe;
   * 'full': no slot is free (a probe claimed is given back).
   */
  private async admit(member: CachedCandidate, named: Preselected | undefined, req: RouteRequest): Promise<{ slots: number; probe?: ProbeClaim } | 'probing' | 'full'> {
    let probe: ProbeClaim | undefined;
    if (member.circuitOpen) {
      const claim = await this.health.claimProbe(member.id);
      // Either way the cached view was behind (a claim's NOTIFY is on its way): it is read again next time.
      if (claim === 'taken' || claim === 'not_open') this.invalidate();
      if (claim === 'taken') return 'probing';
      if (claim !== 'not_open') probe = claim;
    }
    if (named && !probe) return { slots: named.slots };
    let slots: number | 'full';
    try {
      slots = await this.takeSlots(member, req);
    } catch (err) {
      if (probe) await this.health.releaseProbe(probe);
      throw err;
    }
    if (slots !== 'full') return { slots, probe };
    if (probe) await this.health.releaseProbe(probe);
    return 'full';
  }

  /**
   * Takes the slots the work wants on the member, or as many as are free (at least one): at once
   * without a limit, else under the member's slot lock. Returns how many, or 'full' when none is free.
   */
  private async takeSlots(member: RoutableMember, req: RouteRequest): Promise<number | 'full'> {
    const wanted = wantedSlots(member, req);
    const limit = member.concurrencyLimit;
    if (limit === null) {
      await req.take(member.id, this.tx.single, wanted);
      return wanted;
    }
    return this.tx.run(async (trx) => {
      const free = limit - (await this.routing.lockSlots(trx, member.id));
      if (free <= 0) return 'full';
      const slots = Math.min(wanted, free);
      await req.take(member.id, trx, slots);
      return slots;
    });
  }

  /** The account of a member that already holds a job (sticky), or undefined when it was deleted. */
  account(memberId: string): Promise<UpstreamAccount | undefined> {
    // A TtlCache: a read that started before `invalidate` cannot put the old account back after it.
    return this.accounts.get(memberId, async () => {
      const member = await this.routing.find(memberId);
      return member && this.toAccount(member);
    });
  }

  private toAccount(member: MemberCandidate): UpstreamAccount {
    const credentials = member.credentialsCiphertext ? (JSON.parse(decryptSecret(this.secretKey, member.credentialsCiphertext)) as Record<string, string>) : {};
    return {
      memberId: member.id,
      provider: member.provider as UpstreamAccount['provider'],
      baseUrl: member.baseUrl,
      credentials,
      modelMap: member.modelMap ?? {},
      configVersion: member.configVersion,
    };
  }
}

/** The members whose upstream accepts the work (`RouteRequest.accepts`); all of them when none does. */
function accepting<M extends { account: UpstreamAccount }>(members: M[], req: Pick<RouteRequest, 'accepts'>): M[] {
  if (!req.accepts) return members;
  const accepted = members.filter((m) => req.accepts!(m.account));
  return accepted.length > 0 ? accepted : members;
}

/** The slots the work would like on the member: its upstream calls at once (at least 1). */
function wantedSlots(member: RoutableMember, req: Pick<RouteRequest, 'slots'>): number {
  return Math.max(1, Math.floor(req.slots?.(member.provider as ProviderKind) ?? 1));
}

/** The upstream's id for a catalog model on this account (the member's model map, else the same id). */
export function upstreamModelOf(account: UpstreamAccount, model: string): string {
  return account.modelMap[model] ?? model;
}
