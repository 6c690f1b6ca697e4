// Text output of the admin CLI: aligned tables and key/value lines (the JSON form is the API object itself).

export type Row = Record<string, unknown>;

/** What a command returns: printed as `json` with --json, else as `text`. */
export interface Output {
  json: unknown;
  text: string;
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
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)));
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
