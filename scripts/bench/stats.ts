/** Latency summaries and the result tables the bench prints. */

export interface Summary {
  /** Completed operations inside the measured window. */
  count: number;
  seconds: number;
  perSecond: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  errors: number;
}

/** Nearest-rank percentile of sorted values (ms). */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

export function summarize(latenciesMs: number[], seconds: number, errors: number): Summary {
  const sorted = Float64Array.from(latenciesMs).sort();
  return {
    count: sorted.length,
    seconds,
    perSecond: seconds > 0 ? sorted.length / seconds : 0,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: sorted.length ? sorted[sorted.length - 1]! : 0,
    errors,
  };
}

const ms = (v: number) => v.toFixed(2);

/** A fixed-width text table: first column left-aligned, the others right-aligned. */
export function table(header: string[], rows: (string | number)[][]): string {
  const cells = [header, ...rows.map((r) => r.map(String))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join('\n');
}

export const SUMMARY_HEADER = ['', 'ops', 'ops/s', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', 'errors'];

export function summaryRow(label: string, s: Summary): (string | number)[] {
  return [label, s.count, Math.round(s.perSecond), ms(s.p50), ms(s.p90), ms(s.p99), ms(s.max), s.errors];
}
