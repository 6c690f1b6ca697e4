/** Rows of stored media files. */
import { sql, type ExpressionBuilder, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { afterExists, pageConditions, pageOrder, type AccountPage } from './account-pages.ts';

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
  /**
   * The EXIF orientation the stored bytes carry (1: upright as stored), recorded when the image was
   * inspected; absent or null when not known (an output, a row written before it was recorded).
   */
  orientation?: number | null;
}

const COLUMNS = ['id', 'accountId', 'purpose', 'contentType', 'bytes', 'storageKey', 'width', 'height', 'taskId', 'expiresAt', 'filename', 'orientation'] as const;

/**
 * The files of the Files API (GET/DELETE /v1/files…): uploads and generated outputs. Media inputs
 * a request carried inline or by URL (`input`) are copies that belong to their task.
 */
export const LISTED_PURPOSES = ['upload', 'image_output', 'video_output'] as const;
export type ListedPurpose = (typeof LISTED_PURPOSES)[number];

/**
 * What a Files API file is: a listed purpose, not expired, and not an upload whose body is still
 * arriving (or was refused): file-upload.ts records it as application/octet-stream until
 * `confirmUpload` has inspected it.
 */
function listable(eb: ExpressionBuilder<DB, 'files'>) {
  return eb.and([
    eb('purpose', 'in', LISTED_PURPOSES),
    eb('contentType', '<>', 'application/octet-stream'),
    eb.or([eb('expiresAt', 'is', null), eb('expiresAt', '>', sql<Date>`now()`)]),
  ]);
}

/** An expired file's place in the media sweep's walk. */
export interface ExpiredPlace {
  id: string;
  /** expires_at as PostgreSQL writes it (microseconds and offset). */
  expiresAt: string;
}

/** A file of the Files API, with its creation time. */
export type ListedFileRow = FileRow & { createdAt: Date };

/** The task a file is an input of, or the output of, that has not finished yet (it still needs the file). */
export interface FileUser {
  kind: 'video' | 'image';
  taskId: string;
  role: 'input' | 'output';
}

/**
 * CTEs `d` (the files of `ids` deleted, returning id, storage_key, purpose, task_id) and the
 * updates that detach them from the tasks that made them, for one statement.
 */
function deleteDetaching(ids: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`d as (delete from files f where f.id in (${ids}) returning f.id, f.storage_key, f.purpose, f.task_id),
    dv as (update video_tasks t set output_file_id = null from d where d.purpose = 'video_output' and t.id = d.task_id and t.output_file_id = d.id),
    di as (update image_tasks t set result_file_ids = array(select e from unnest(t.result_file_ids) e where e <> all (select id from d))
           where t.id in (select task_id from d where purpose = 'image_output'))`;
}

/** A row as the files table names its columns (JSON for jsonb_populate_record). */
function snakeRow(r: FileRow) {
  return {
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
    orientation: r.orientation ?? null,
  };
}

/**
 * The expiry a new row gets: an output is kept for its account's own retention when the account
 * has one (accounts.output_retention_days), else for what the row says (OUTPUT_RETENTION_DAYS from
 * now, set by FileService); everything else as the row says.
 */
function expiresOf(r: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`coalesce(
    case when ${r}.purpose in ('image_output', 'video_output') then
      now() + (select a.output_retention_days from accounts a where a.id = ${r}.account_id) * interval '1 day' end,
    ${r}.expires_at)`;
}

export class FileRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Writes the row; returns the expiry it got (its account's own retention may differ from the row's). */
  async insert(row: FileRow): Promise<Date | null> {
    const { rows } = await sql<{ expiresAt: Date | null }>`insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename, orientation)
      select r.id, r.account_id, r.purpose, r.content_type, r.bytes, r.storage_key, r.width, r.height, r.task_id, ${expiresOf(sql`r`)}, r.filename, r.orientation
      from jsonb_populate_record(null::files, ${JSON.stringify(snakeRow(row))}::jsonb) r
      returning expires_at as "expiresAt"`.execute(this.db);
    return rows[0]!.expiresAt;
  }

  /**
   * The rows as a write of a statement that finishes their task (`name as (…)`, see
   * LeasedTasks.finish): inserted only when the task row `t` was finished, else nothing is written
   * (`when`: a statement finishing several tasks names the row's own, `r.task_id in (select id from t)`).
   */
  insertWithTask(name: string, rows: readonly FileRow[], when: RawBuilder<boolean> = sql`exists (select 1 from t)`): RawBuilder<unknown> {
    const json = JSON.stringify(rows.map(snakeRow));
    return sql`${sql.id(name)} as (
      insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename, orientation)
      select r.id, r.account_id, r.purpose, r.content_type, r.bytes, r.storage_key, r.width, r.height, r.task_id, ${expiresOf(sql`r`)}, r.filename, r.orientation
      from jsonb_populate_recordset(null::files, ${json}::jsonb) r
      where ${when}
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

  /** A file of the Files API of the account: listed purpose, not expired. */
  findListed(id: string, accountId: string, db: Executor = this.db): Promise<ListedFileRow | undefined> {
    return db
      .selectFrom('files')
      .select([...COLUMNS, 'createdAt'])
      .where('id', '=', id)
      .where('accountId', '=', accountId)
      .where(listable)
      .executeTakeFirst();
  }

  /** One keyset page (`page.limit` rows) of the account's listed files, optionally of one purpose. */
  listForAccount(page: AccountPage, purpose?: ListedPurpose): Promise<ListedFileRow[]> {
    return this.db
      .selectFrom('files')
      .select([...COLUMNS, 'createdAt'])
      .where(pageConditions('files', page))
      .where(listable)
      .$if(purpose !== undefined, (q) => q.where('purpose', '=', purpose!))
      .orderBy(pageOrder('files', page))
      .limit(page.limit)
      .execute();
  }

  /** Whether `id` is a file of the account, listed or not (an `after` that matched nothing). */
  isAccountFile(id: string, accountId: string): Promise<boolean> {
    return afterExists(this.db, 'files', id, accountId);
  }

  /**
   * Inside a deleting transaction: locks the unfinished task a generated file belongs to, first (the
   * house's lock order: a task before its files), and tells whether it is still running. Finished
   * tasks are locked too, so that detaching the file waits for nothing.
   */
  async lockProducingTask(file: Pick<FileRow, 'purpose' | 'taskId'>, trx: Executor): Promise<FileUser | undefined> {
    if (!file.taskId) return undefined;
    if (file.purpose === 'video_output') {
      const task = await trx.selectFrom('videoTasks').select('status').where('id', '=', file.taskId).forUpdate().executeTakeFirst();
      return task && (task.status === 'queued' || task.status === 'in_progress') ? { kind: 'video', taskId: file.taskId, role: 'output' } : undefined;
    }
    if (file.purpose === 'image_output') {
      const task = await trx.selectFrom('imageTasks').select('status').where('id', '=', file.taskId).forUpdate().executeTakeFirst();
      return task?.status === 'processing' ? { kind: 'image', taskId: file.taskId, role: 'output' } : undefined;
    }
    return undefined;
  }

  /**
   * Inside a deleting transaction: locks the file's row (false when it is gone). A task being created
   * with this file adopts it in its hold statement, which locks the row too: taking the lock first
   * makes the next statement see that task, or makes its adoption wait for the delete.
   */
  async lockForDelete(id: string, trx: Executor): Promise<boolean> {
    return (await trx.selectFrom('files').select('id').where('id', '=', id).forUpdate().executeTakeFirst()) !== undefined;
  }

  /** An unfinished task of the account that uses the file as a media input (one is enough). */
  async activeInputUser(id: string, accountId: string, trx: Executor): Promise<FileUser | undefined> {
    const { rows } = await sql<{ kind: 'video' | 'image'; taskId: string }>`
      (select 'video' as kind, id as "taskId" from video_tasks
        where account_id = ${accountId} and status in ('queued', 'in_progress') and ${id} = any(input_file_ids) limit 1)
      union all
      (select 'image', id from image_tasks
        where account_id = ${accountId} and status = 'processing' and (${id} = any(input_file_ids) or mask_file_id = ${id}) limit 1)
      limit 1`.execute(trx);
    const user = rows[0];
    return user && { ...user, role: 'input' };
  }

  /**
   * Deletes the file's row and, in the same statement, detaches it from the task that generated
   * it: a video task's output_file_id is cleared, an image task's result_file_ids loses it, so
   * their lookups no longer name a file that is gone.
   * The storage keys of the file and of the copies that went with it are recorded in
   * pending_deletes by the same statement, and returned: the caller deletes their bytes once the
   * transaction has committed, then `forgetPendingDeletes`; what the store does not delete then is
   * the media sweeper's to retry (`duePendingDeletes`).
   */
  async deleteDetached(file: Pick<FileRow, 'id' | 'purpose' | 'taskId'>, trx: Executor): Promise<string[]> {
    const detach =
      file.purpose === 'video_output' && file.taskId
        ? sql`, v as (update video_tasks set output_file_id = null where id = ${file.taskId} and output_file_id = ${file.id})`
        : file.purpose === 'image_output' && file.taskId
          ? sql`, i as (update image_tasks set result_file_ids = array_remove(result_file_ids, ${file.id}) where id = ${file.taskId})`
          : sql``;
    // The copies made of it to send upstream (FileService.sendableCopy: `<id>png<expiry>`, `<id>jpg<expiry>`) go with it.
    const { rows } = await sql<{ storageKey: string }>`with d as (delete from files where id = ${file.id} returning storage_key),
      c as (delete from files where purpose = 'input' and (starts_with(id, ${`${file.id}png`}) or starts_with(id, ${`${file.id}jpg`})) returning storage_key),
      k as (select storage_key from d union all select storage_key from c),
      p as (insert into pending_deletes (storage_key) select storage_key from k on conflict (storage_key) do nothing)${detach}
      select storage_key as "storageKey" from k`.execute(trx);
    return rows.map((r) => r.storageKey);
  }

  /** Drops the pending deletes of `keys`, whose bytes the store has deleted. */
  async forgetPendingDeletes(keys: readonly string[], db: Executor = this.db): Promise<void> {
    if (keys.length === 0) return;
    await db.deleteFrom('pendingDeletes').where('storageKey', 'in', [...keys]).execute();
  }

  /**
   * Up to `limit` pending deletes whose next attempt is due, oldest first, leaving out rows another
   * transaction holds (a sweeper on another instance); as `expiredAfter`, the locks end with the
   * statement: the store is called holding none.
   */
  async duePendingDeletes(limit: number, db: Executor = this.db): Promise<{ key: string; attempts: number }[]> {
    const { rows } = await sql<{ key: string; attempts: number }>`
      select storage_key as key, attempts from pending_deletes where next_attempt_at <= now()
      order by next_attempt_at, storage_key limit ${limit} for update skip locked`.execute(db);
    return rows;
  }

  /**
   * Puts off the pending deletes the store refused (AccessDenied, an object lock): tried again
   * after a minute, doubling with each refusal up to an hour, their last error kept for an operator.
   */
  async deferPendingDeletes(refused: readonly { key: string; err: string }[], db: Executor = this.db): Promise<void> {
    if (refused.length === 0) return;
    await sql`update pending_deletes p set attempts = p.attempts + 1, last_error = r.err,
        next_attempt_at = now() + least(interval '1 hour', interval '1 minute' * power(2, least(p.attempts, 6)))
      from unnest(${refused.map((r) => r.key)}::text[], ${refused.map((r) => r.err)}::text[]) as r(key, err)
      where p.storage_key = r.key`.execute(db);
  }

  /** Records an upload's image facts and expiry; returns its creation time. */
  async confirmUpload(id: string, o: { contentType: string; width: number; height: number; orientation?: number; expiresAt: Date }): Promise<Date> {
    // Listed from now on (an unconfirmed upload is not), so placed now: a keyset page already past
    // its insert time would otherwise never list it.
    const row = await this.db.updateTable('files').set({ ...o, createdAt: sql`clock_timestamp()` }).where('id', '=', id).returning('createdAt').executeTakeFirstOrThrow();
    return row.createdAt;
  }

  async describeImage(id: string, image: { contentType: string; width: number; height: number; orientation: number }): Promise<void> {
    await this.db.updateTable('files').set(image).where('id', '=', id).execute();
  }

  /** Records the EXIF orientation of a row stored without it (read from its header when first needed). */
  async recordOrientation(id: string, orientation: number): Promise<void> {
    await this.db.updateTable('files').set({ orientation }).where('id', '=', id).execute();
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
   * Up to `limit` expired files after `after` in the sweep's walk (expiry, then id), leaving out rows
   * another transaction holds (a task adopting the file, a DELETE in flight). Its locks end with the
   * statement: the sweep deletes the bytes holding none (a slow or unreachable store must not hold
   * row locks), then the rows with `deleteExpired`. `expiresAt` is the database's text, exact to the
   * microsecond (a Date would round it, and the walk would meet the same row again).
   */
  async expiredAfter(after: ExpiredPlace | undefined, limit: number, db: Executor): Promise<(ExpiredPlace & { storageKey: string })[]> {
    const past = after
      ? sql`and expires_at >= ${after.expiresAt}::timestamptz and (expires_at, id) > (${after.expiresAt}::timestamptz, ${after.id})`
      : sql``;
    const { rows } = await sql<ExpiredPlace & { storageKey: string }>`
      select id, storage_key as "storageKey", expires_at::text as "expiresAt" from files
      where expires_at < now() ${past}
      order by expires_at, id limit ${limit} for update skip locked`.execute(db);
    return rows;
  }

  /**
   * The rows of `ids` that are still expired, deleted and detached as `deleteRows` does; returns how
   * many. A row another sweeper or a client's DELETE removed meanwhile is not counted again; one
   * whose expiry moved since it was read (a task adopted it) is no longer the sweep's to delete.
   */
  async deleteExpired(ids: readonly string[], db: Executor): Promise<number> {
    if (ids.length === 0) return 0;
    const { rows } = await sql<{ n: number }>`with ${deleteDetaching(sql`select id from files where id = any(${[...ids]}::text[]) and expires_at < now()`)}
      select count(*)::int as n from d`.execute(db);
    return rows[0]!.n;
  }

  /**
   * The rows of `ids`, deleted and detached from the tasks that made them (a video loses its output,
   * an image task the image: their lookups answer without those URLs): image outputs whose bytes
   * never landed (a process died while writing them). Expired files go through `deleteExpired`.
   */
  async deleteRows(ids: readonly string[], trx: Executor): Promise<void> {
    if (ids.length === 0) return;
    await sql`with ${deleteDetaching(sql`select unnest(${[...ids]}::text[])`)} select 1`.execute(trx);
  }

  /**
   * Image outputs written between `from` and `to` ago, after (created_at, id) `after`, oldest
   * first: the rows the sweeper checks for bytes that never landed (an answer whose images are
   * stored while its task settles records the rows before the bytes are written). `createdAt` is
   * PostgreSQL's text, microseconds kept: a JavaScript Date's milliseconds would put the cursor
   * before the rows it has read (every row one statement wrote shares its `now()`), and read them again.
   */
  async recentOutputs(after: { createdAt: string; id: string } | undefined, window: { fromMs: number; toMs: number }, limit: number): Promise<{ id: string; storageKey: string; createdAt: string }[]> {
    let query = this.db
      .selectFrom('files')
      .select(['id', 'storageKey', sql<string>`created_at::text`.as('createdAt')])
      .where('purpose', '=', 'image_output')
      .where('createdAt', '>', sql<Date>`now() - ${window.fromMs} * interval '1 millisecond'`)
      .where('createdAt', '<', sql<Date>`now() - ${window.toMs} * interval '1 millisecond'`);
    if (after) query = query.where(sql<boolean>`(created_at, id) > (${after.createdAt}::timestamptz, ${after.id})`);
    return query.orderBy('files.createdAt').orderBy('files.id').limit(limit).execute();
  }

  /** Which of `keys` a file row names. */
  async keysWithRows(keys: readonly string[]): Promise<Set<string>> {
    if (keys.length === 0) return new Set();
    const rows = await this.db.selectFrom('files').select('storageKey').where('storageKey', 'in', [...keys]).execute();
    return new Set(rows.map((r) => r.storageKey));
  }

  async delete(id: string): Promise<void> {
    await this.db.deleteFrom('files').where('id', '=', id).execute();
  }
}
