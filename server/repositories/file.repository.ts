/** Rows of stored media files. */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';

export interface FileRow {
  id: string;
  accountId: string;
  purpose: string;
  contentType: string;
  bytes: number;
  storageKey: string;
  width: number | null;
  height: number | null;
  taskId: string | null;
  /** When the sweeper removes it; null: kept (outputs, and inputs of a task). */
  expiresAt: Date | null;
  /** The name an upload was sent with. */
  filename: string | null;
}

const COLUMNS = ['id', 'accountId', 'purpose', 'contentType', 'bytes', 'storageKey', 'width', 'height', 'taskId', 'expiresAt', 'filename'] as const;

export class FileRepository {
  constructor(private readonly db: Kysely<DB>) {}

  async insert(row: FileRow): Promise<void> {
    await this.db.insertInto('files').values(row).execute();
  }

  /**
   * The rows as a write of a statement that finishes their task (`name as (…)`, see
   * LeasedTasks.finish): inserted only when the task row `t` was finished, else nothing is written.
   */
  insertWithTask(name: string, rows: readonly FileRow[]): RawBuilder<unknown> {
    const json = JSON.stringify(
      rows.map((r) => ({
        id: r.id,
        account_id: r.accountId,
        purpose: r.purpose,
        content_type: r.contentType,
        bytes: r.bytes,
        storage_key: r.storageKey,
        width: r.width,
        height: r.height,
        task_id: r.taskId,
        expires_at: r.expiresAt,
        filename: r.filename,
      })),
    );
    return sql`${sql.id(name)} as (
      insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename)
      select id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename
      from jsonb_populate_recordset(null::files, ${json}::jsonb)
      where exists (select 1 from t)
    )`;
  }

  find(id: string): Promise<FileRow | undefined> {
    return this.db.selectFrom('files').select(COLUMNS).where('id', '=', id).executeTakeFirst();
  }

  /** The rows of `ids`, in that order (a missing one is left out). */
  async findMany(ids: readonly string[]): Promise<FileRow[]> {
    if (ids.length === 0) return [];
    const rows = await this.db.selectFrom('files').select(COLUMNS).where('id', 'in', ids).execute();
    const byId = new Map(rows.map((r) => [r.id, r]));
    return ids.flatMap((id) => byId.get(id) ?? []);
  }

  /** A file of the account that has not expired. */
  findForAccount(id: string, accountId: string): Promise<FileRow | undefined> {
    return this.db
      .selectFrom('files')
      .select(COLUMNS)
      .where('id', '=', id)
      .where('accountId', '=', accountId)
      .where((eb) => eb.or([eb('expiresAt', 'is', null), eb('expiresAt', '>', sql<Date>`now()`)]))
      .executeTakeFirst();
  }

  listForTask(taskId: string, purpose: string): Promise<FileRow[]> {
    return this.db.selectFrom('files').select(COLUMNS).where('taskId', '=', taskId).where('purpose', '=', purpose).execute();
  }

  /** Records an upload's image facts and expiry; returns its creation time. */
  async confirmUpload(id: string, o: { contentType: string; width: number; height: number; expiresAt: Date }): Promise<Date> {
    const row = await this.db.updateTable('files').set(o).where('id', '=', id).returning('createdAt').executeTakeFirstOrThrow();
    return row.createdAt;
  }

  async describeImage(id: string, contentType: string, width: number, height: number): Promise<void> {
    await this.db.updateTable('files').set({ contentType, width, height }).where('id', '=', id).execute();
  }

  /** Removes the rows of inputs among `ids` that no task adopted; returns their storage keys. */
  async deleteUnadopted(ids: readonly string[]): Promise<string[]> {
    if (ids.length === 0) return [];
    const rows = await this.db
      .deleteFrom('files')
      .where('id', 'in', [...ids])
      .where('purpose', '=', 'input')
      .where('taskId', 'is', null)
      .returning('storageKey')
      .execute();
    return rows.map((r) => r.storageKey);
  }

  /**
   * Inside a transaction: locks up to `limit` expired files that no other sweeper holds, and
   * deletes their rows (they disappear when the transaction commits).
   */
  async takeExpired(limit: number, trx: Executor): Promise<{ id: string; storageKey: string }[]> {
    const { rows } = await sql<{ id: string; storageKey: string }>`
      delete from files where id in (
        select id from files where expires_at < now() order by expires_at limit ${limit} for update skip locked
      ) returning id, storage_key as "storageKey"`.execute(trx);
    return rows;
  }

  async delete(id: string): Promise<void> {
    await this.db.deleteFrom('files').where('id', '=', id).execute();
  }
}
