// Text output of the admin CLI: aligned tables and key/value lines (the JSON form is the API object itself).

export type Row = Record<string, unknown>;

/** What a command returns: printed as `json` with --json, else as `text`; or a result it prints itself. */
export type Output = Printed | Streamed;

export interface Printed {
  json: unknown;
  text: string;
  print?: never;
}

/**
 * A result too large to hold (a usage report of 100,000s of rows): `print` writes it while it is
 * read, in pieces, each printed as a line of its own (`out` adds the line end), `json` as --json
 * asks. A failure midway ends the output where it is; runAdmin then says so and exits 1.
 */
export interface Streamed {
  print(out: (text: string) => void, json: boolean): Promise<void>;
  json?: never;
  text?: never;
}

function cell(value: unknown): string {
  if (value === null || value === undefined) return '-';
  if (Array.isArray(value)) return value.join(',');
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

export function table(rows: Row[], columns: string[]): string {
  if (rows.length === 0) return '(none)';
  const cells = rows.map((r) => columns.map((c) => cell(r[c])));
  // A loop, not Math.max(...cells): a spread passes one argument per row, past the stack's limit for 100,000s.
  const widths = columns.map((c) => c.length);
  for (const row of cells) for (const [i, value] of row.entries()) widths[i] = Math.max(widths[i]!, value.length);
  const line = (values: string[]) => values.map((v, i) => v.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(columns), ...cells.map(line)].join('\n');
}

export function lines(obj: Row): string {
  const width = Math.max(...Object.keys(obj).map((k) => k.length));
  return Object.entries(obj)
    .map(([k, v]) => `${k.padEnd(width)}  ${cell(v)}`)
    .join('\n');
}

export function page(result: { data: unknown[]; next_cursor: string | null }, columns: string[]): Output {
  const text = table(result.data as Row[], columns) + (result.next_cursor ? `\n(more: --cursor ${result.next_cursor})` : '');
  return { json: result, text };
}

/** One API object, printed as key/value lines. */
export function one(obj: object): Output {
  return { json: obj, text: lines(obj as Row) };
}
