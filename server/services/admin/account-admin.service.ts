/** Admin rules for accounts: create (with an initial grant), list, get, update, grant/debit credits. */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, badRequest, conflict, paymentRequired } from '../../errors.ts';
import type { Transactor } from '../../db/transaction.ts';
import type { AccountRepository, AdjustmentKeyRow } from '../../repositories/account.repository.ts';
import { newId } from '../../lib/ids.ts';
import { fromCredits, MICRO, toCredits } from '../../lib/money.ts';
import { toAdminAccount, toAdminLedgerEntry, type AdminAccount } from './admin-mappers.ts';
import { storedOf } from '../limits/client-limits.ts';
import { decodeCreatedAtCursor, encodeCreatedAtCursor, pageSize, splitPage } from './cursor.ts';

type Schemas = components['schemas'];
export type AccountCreateInput = Omit<Schemas['AdminAccountCreate'], 'status'> & { status?: Schemas['AdminAccountStatus'] };
export type AccountUpdateInput = Schemas['AdminAccountUpdate'];
export type CreditAdjustmentInput = Schemas['AdminCreditAdjustment'];

export const INITIAL_CREDITS_REASON = 'initial credits';

export const accountNotFound = (param: string | null = null) => new ApiError(404, 'account_not_found', 'No account has this id.', param);

/**
 * The most credits an account's balance or total earned can reach: Number.MAX_SAFE_INTEGER
 * micro-credits (db/database.ts), written out exactly (as a number it would print as …740992).
 */
const MAX_ACCOUNT_CREDITS = `${Math.floor(Number.MAX_SAFE_INTEGER / MICRO)}.${String(Number.MAX_SAFE_INTEGER % MICRO).padStart(6, '0')}`;

/** Decimal credits -> micro-credits, or `400 invalid_request` naming the field. */
export function microCredits(credits: number, param: string): number {
  const micro = fromCredits(credits);
  if (micro === undefined && Math.abs(credits) * MICRO >= Number.MAX_SAFE_INTEGER) {
    throw badRequest('invalid_request', `'${param}' is too large: at most ${MAX_ACCOUNT_CREDITS} credits.`, param);
  }
  if (micro === undefined) throw badRequest('invalid_request', `'${param}' must be a number of credits with at most 6 fractional digits.`, param);
  return micro;
}

export class AccountAdminService {
  constructor(
    private readonly accounts: AccountRepository,
    private readonly tx: Transactor,
  ) {}

  async create(input: AccountCreateInput): Promise<AdminAccount> {
    const initial = microCredits(input.initial_credits ?? 0, 'initial_credits');
    if (initial < 0) throw badRequest('invalid_request', "'initial_credits' must not be negative.", 'initial_credits');
    const row = await this.tx.run(async (trx) => {
      const account = await this.accounts.insert(
        { id: newId('acct'), name: input.name, status: input.status ?? 'active', balance: initial, requestsPerMinute: storedOf(input.requests_per_minute, 'requests_per_minute'), maxInFlight: storedOf(input.max_in_flight, 'max_in_flight') },
        trx,
      );
      if (!account) throw conflict('conflict', `An account named '${input.name}' already exists.`, {}, 'name');
      if (initial > 0) await this.accounts.insertLedgerEntry({ accountId: account.id, kind: 'grant', amount: initial, reason: INITIAL_CREDITS_REASON }, trx);
      return account;
    });
    return toAdminAccount(row);
  }

  async list(opts: { limit?: number; cursor?: string; status?: Schemas['AdminAccountStatus'] }): Promise<Schemas['AdminAccountList']> {
    const limit = pageSize(opts.limit);
    const after = opts.cursor === undefined ? undefined : decodeCreatedAtCursor('accounts', opts.cursor);
    const rows = await this.accounts.list({ limit: limit + 1, status: opts.status, after });
    const { page, last } = splitPage(rows, limit);
    return { data: page.map(toAdminAccount), next_cursor: last ? encodeCreatedAtCursor('accounts', last) : null };
  }

  async get(id: string): Promise<AdminAccount> {
    const row = await this.accounts.findById(id);
    if (!row) throw accountNotFound();
    return toAdminAccount(row);
  }

  /** Looks an account up by id, or else by its unique name (CLI convenience). */
  async resolve(idOrName: string): Promise<AdminAccount> {
    const row = (await this.accounts.findById(idOrName)) ?? (await this.accounts.findByName(idOrName));
    if (!row) throw new ApiError(404, 'account_not_found', `No account has the id or name '${idOrName}'.`);
    return toAdminAccount(row);
  }

  async update(id: string, input: AccountUpdateInput): Promise<AdminAccount> {
    if (Object.values(input).every((v) => v === undefined)) {
      throw badRequest('invalid_request', 'Send at least one of name, status, output_retention_days, input_retention_days, requests_per_minute and max_in_flight.');
    }
    if (input.name !== undefined) {
      const holder = await this.accounts.findByName(input.name);
      if (holder && holder.id !== id) throw conflict('conflict', `An account named '${input.name}' already exists.`, {}, 'name');
    }
    const row = await this.accounts.update(id, {
      name: input.name,
      status: input.status,
      outputRetentionDays: input.output_retention_days,
      inputRetentionDays: input.input_retention_days,
      requestsPerMinute: storedOf(input.requests_per_minute, 'requests_per_minute'),
      maxInFlight: storedOf(input.max_in_flight, 'max_in_flight'),
    });
    if (!row) throw accountNotFound();
    return toAdminAccount(row);
  }

  /**
   * A grant (amount > 0) or a debit (amount < 0) and its ledger entry, in one transaction. The
   * debit is one guarded UPDATE (`balance >= amount`), so concurrent debits never overdraw; the
   * grant is one too, so concurrent grants never take the balance or total earned past what an
   * account can hold (MAX_ACCOUNT_CREDITS).
   *
   * With an `idempotency_key` the transaction first claims the key (account, key): a retry of an
   * adjustment that was applied (its answer lost, a button clicked again) finds the key and is
   * answered the original entry, applying nothing; a twin sent at the same time waits on the key
   * for the first's commit, then does the same; an attempt that was refused rolls its claim back,
   * so its retry applies.
   */
  async adjustCredits(id: string, input: CreditAdjustmentInput): Promise<Schemas['AdminCreditAdjustmentResult']> {
    const signed = microCredits(input.amount, 'amount');
    if (signed === 0) throw badRequest('invalid_request', "'amount' must not be zero.", 'amount');
    const amount = Math.abs(signed);
    const kind = signed > 0 ? 'grant' : 'debit';
    const key = input.idempotency_key;
    const done = await this.tx.run(async (trx) => {
      // Before the account's row is locked: a twin waits on the key, not on the account.
      const entryId = key === undefined ? undefined : await this.accounts.claimAdjustmentKey({ accountId: id, idempotencyKey: key, amount: signed, reason: input.reason }, trx);
      if (key !== undefined && entryId === undefined) return { earlier: await this.accounts.findAdjustmentKey(id, key, trx) };
      const updated = kind === 'grant' ? await this.accounts.grant(id, amount, trx) : await this.accounts.debit(id, amount, trx);
      if (!updated) {
        if (!(await this.accounts.findById(id))) throw accountNotFound();
        if (kind === 'grant') {
          throw badRequest('invalid_request', `The grant would take the account's balance or total earned past ${MAX_ACCOUNT_CREDITS} credits, the most an account can hold; nothing was changed.`, 'amount');
        }
        throw paymentRequired('insufficient_balance', 'The debit is larger than the available balance of the account.');
      }
      const ledger = await this.accounts.insertLedgerEntry({ id: entryId, accountId: id, kind, amount, reason: input.reason }, trx);
      return { account: updated, entry: ledger };
    });
    if ('earlier' in done) return this.replay(id, signed, input.reason, done.earlier);
    return { account: toAdminAccount(done.account), entry: toAdminLedgerEntry(done.entry), replayed: false };
  }

  /** The answer to a retry under an idempotency key the account already used: the account now and the original entry, or 409 for another adjustment. */
  private async replay(id: string, signed: number, reason: string, earlier: AdjustmentKeyRow | undefined): Promise<Schemas['AdminCreditAdjustmentResult']> {
    if (!earlier) throw accountNotFound();
    if (earlier.amount !== signed || earlier.reason !== reason) {
      throw conflict(
        'idempotency_conflict',
        `This 'idempotency_key' was already used on this account for an adjustment with another amount or reason (ledger entry led_${earlier.ledgerEntryId}, ${toCredits(earlier.amount)} credits); nothing was changed. Send a new 'idempotency_key' for a new adjustment.`,
        {},
        'idempotency_key',
      );
    }
    const [account, entry] = await Promise.all([this.accounts.findById(id), this.accounts.findLedgerEntry(earlier.ledgerEntryId, this.tx.single)]);
    // Neither goes away: accounts are never deleted, ledger entries are append-only.
    if (!account || !entry) throw new Error(`credit adjustment key of account ${id} names ledger entry ${earlier.ledgerEntryId}, which was not found`);
    return { account: toAdminAccount(account), entry: toAdminLedgerEntry(entry), replayed: true };
  }
}
