/** Admin: the ledger of every account, newest first, with filters (GET /admin/v1/ledger). */
import type { components } from '../../../generated/api.d.ts';
import { badRequest } from '../../errors.ts';
import type { OperatorListsRepository } from '../../repositories/operator-lists.repository.ts';
import { toAdminLedgerEntry } from './admin-mappers.ts';
import { decodeIdCursor, encodeIdCursor, pageSize } from './cursor.ts';

type AdminLedgerEntryList = components['schemas']['AdminLedgerEntryList'];

/** GET /admin/v1/ledger query (validated by the contract). */
export interface LedgerListQuery {
  limit?: number;
  cursor?: string;
  account_id?: string;
  api_key_id?: string;
  task_id?: string;
  kind?: string[];
  created_after?: string;
  created_before?: string;
}

export class LedgerAdminService {
  constructor(private readonly lists: OperatorListsRepository) {}

  async list(query: LedgerListQuery): Promise<AdminLedgerEntryList> {
    const size = pageSize(query.limit);
    const before = query.cursor !== undefined ? decodeIdCursor('ledger', query.cursor) : undefined;
    const rows = await this.lists.ledger(
      {
        ...(query.account_id !== undefined && { accountId: query.account_id }),
        ...(query.api_key_id !== undefined && { apiKeyId: query.api_key_id }),
        ...(query.task_id !== undefined && { taskId: query.task_id }),
        ...(query.kind !== undefined && { kinds: query.kind }),
        ...(query.created_after !== undefined && { createdAfter: query.created_after }),
        ...(query.created_before !== undefined && { createdBefore: query.created_before }),
      },
      size + 1,
      before,
    );
    const page = rows.slice(0, size);
    const last = page.at(-1);
    return { data: page.map(toAdminLedgerEntry), next_cursor: rows.length > size && last ? encodeIdCursor('ledger', last.id) : null };
  }
}
