import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// files.orientation: the EXIF orientation the stored bytes carry (1 to 8; 1 is upright as stored),
// recorded when the gateway inspects an image it stores (an upload's confirmation, an input's
// inspection). An input stored turned (a phone's JPEG, 6 or 8) is handed to adapters that send the
// stored file as an upright copy (FileService.mediaInputs), and this column tells which rows need
// one without decoding every input on every task step. Null: not known (rows written before this
// migration, outputs); read from the file's header once when an adapter first needs it, and recorded.
const statements: string[] = [
  `alter table files add column orientation smallint`,
  `alter table files add constraint files_orientation_check check (orientation between 1 and 8)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
