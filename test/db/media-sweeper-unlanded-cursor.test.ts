/**
 * The unlanded phase's cursor keeps a row's created_at with PostgreSQL's microseconds: every file
 * row one statement writes (a group-committed batch of completions, n images each) shares one
 * now(), and a cursor rounded to milliseconds sat before the rows it had read, so a run read the
 * same batch again and again for its whole budget (the rows after it never checked).
 */
import { Writable } from 'node:stream';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { createLogger } from '../../server/logger.ts';
import { FileRepository } from '../../server/repositories/file.repository.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import type { MediaStore } from '../../server/storage/media-store.ts';
import { createAccount } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

it('checks each of 250 outputs written by one statement once, and goes past them', async () => {
  const { id: accountId } = await createAccount(t.db);
  await sql`insert into files (id, account_id, purpose, content_type, bytes, storage_key, created_at)
    select 'file_un' || lpad(g::text, 6, '0'), ${accountId}, 'image_output', 'image/png', 10,
           'image_output/un/file_un' || lpad(g::text, 6, '0'), date_trunc('milliseconds', now()) - interval '30 minutes' + interval '123 microseconds'
    from generate_series(1, 250) g`.execute(t.db);
  const statted = new Map<string, number>();
  let sweeper!: MediaSweeper;
  const store = {
    stat: async (key: string) => {
      statted.set(key, (statted.get(key) ?? 0) + 1);
      // A spinning run is stopped rather than left to its budget.
      if ([...statted.values()].reduce((a, b) => a + b, 0) >= 1000) sweeper.stop();
      return { key, bytes: 10, modifiedAt: new Date() };
    },
    list: async () => [],
    delete: async () => undefined,
  } as unknown as MediaStore;
  const log = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
  sweeper = new MediaSweeper({ files: new FileRepository(t.db), sweepers: new SweeperRepository(t.db), store, tx: createTransactor(t.db, log), log });
  await sweeper.run();
  const mine = [...statted.entries()].filter(([key]) => key.startsWith('image_output/un/'));
  expect(mine).toHaveLength(250);
  expect(Math.max(...mine.map(([, n]) => n))).toBe(1);
});
