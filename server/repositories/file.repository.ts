/** Rows of stored media files. */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

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
}

export class FileRepository {
  constructor(private readonly db: Kysely<DB>) {}

  async insert(row: FileRow): Promise<void> {
    await this.db.insertInto('files').values(row).execute();
  }

  find(id: string): Promise<FileRow | undefined> {
    return this.db
      .selectFrom('files')
      .select(['id', 'accountId', 'purpose', 'contentType', 'bytes', 'storageKey', 'width', 'height', 'taskId'])
      .where('id', '=', id)
      .executeTakeFirst();
  }

  listForTask(taskId: string, purpose: string): Promise<FileRow[]> {
    return this.db
      .selectFrom('files')
      .select(['id', 'accountId', 'purpose', 'contentType', 'bytes', 'storageKey', 'width', 'height', 'taskId'])
      .where('taskId', '=', taskId)
      .where('purpose', '=', purpose)
      .execute();
  }

  async delete(id: string): Promise<void> {
    await this.db.deleteFrom('files').where('id', '=', id).execute();
  }
}
