/**
 * Usage reports: range, granularity, grouping and account; a chart, the table and a CSV download.
 * All in UTC, the range inputs too: the server cuts periods at UTC hours and days, and a local
 * date on a UTC day would name the wrong day east or west of UTC.
 */
import { Button, Checkbox, Group, Select, Stack, Table, Text, TextInput, Title } from '@mantine/core';
import { useMemo, useState, type FormEvent } from 'react';
import { Bar, BarChart, CartesianGrid, Legend, ResponsiveContainer, Tooltip, XAxis, YAxis } from 'recharts';
import { api, call, type UsageDimension, type UsageReport } from '../api.ts';
import { useLocation } from '../router.tsx';
import { ErrorAlert, credits, useAction, useLoad } from '../ui.tsx';

const DIMENSIONS: UsageDimension[] = ['account', 'key', 'model', 'provider'];

/** A `datetime-local` value read as UTC, and back. */
const utcInput = (d: Date) => d.toISOString().slice(0, 16);
const fromUtcInput = (v: string) => new Date(`${v}Z`).toISOString();

/** An instant as the report names its period: `2026-03-10 00:00` (UTC). */
const utcText = (t: number | string) => new Date(t).toISOString().slice(0, 16).replace('T', ' ');

/** The JSON report (the same operation answers CSV when asked with `Accept: text/csv`). */
export function asReport(r: UsageReport | string): UsageReport {
  if (typeof r === 'string') throw new Error('The server answered CSV where the report was expected.');
  return r;
}

export interface UsageQuery {
  from: string;
  to: string;
  granularity: 'hour' | 'day';
  group_by: UsageDimension[];
  account_id?: string;
}

export function usageQuery(q: UsageQuery) {
  return { from: q.from, to: q.to, granularity: q.granularity, group_by: q.group_by, ...(q.account_id ? { account_id: q.account_id } : {}) };
}

/**
 * The report's rows summed per period (whatever they are grouped by), oldest first, for charts:
 * every period of the range, those without usage at zero. Periods are UTC hours or days; the first
 * starts at `from`, as the server's does.
 */
export function byPeriod(report: UsageReport) {
  const unit = report.granularity === 'day' ? 86400_000 : 3600_000;
  const periods = new Map<number, { period: string; spent: number; refunded: number; completed: number; failed: number; inProgress: number; needsAttention: number }>();
  const at = (t: number) => {
    const label = report.granularity === 'day' ? utcText(t).slice(0, 10) : utcText(t).slice(5);
    return periods.get(t) ?? periods.set(t, { period: label, spent: 0, refunded: 0, completed: 0, failed: 0, inProgress: 0, needsAttention: 0 }).get(t)!;
  };
  for (let t = Date.parse(report.from); t < Date.parse(report.to); t = (Math.floor(t / unit) + 1) * unit) at(t);
  for (const r of report.rows) {
    const p = at(Date.parse(r.period_start));
    p.spent += r.credits_spent;
    p.refunded += r.credits_refunded;
    p.completed += r.video_tasks_completed + r.image_tasks_completed;
    p.failed += r.video_tasks_failed + r.image_tasks_failed;
    p.inProgress += r.video_tasks_queued + r.video_tasks_in_progress + r.image_tasks_processing;
    p.needsAttention += r.image_tasks_needs_attention;
  }
  return [...periods.entries()].sort(([a], [b]) => a - b).map(([, p]) => p);
}

export function UsagePage() {
  const { search } = useLocation();
  const now = new Date();
  const [draft, setDraft] = useState({
    from: utcInput(new Date(now.getTime() - 7 * 86400_000)),
    to: utcInput(new Date(now.getTime() + 3600_000)),
    granularity: 'day' as 'hour' | 'day',
    group_by: ['account', 'model'] as UsageDimension[],
    account_id: search.get('account_id') ?? '',
  });
  const toQuery = (d: typeof draft): UsageQuery => ({
    from: fromUtcInput(d.from),
    to: fromUtcInput(d.to),
    granularity: d.granularity,
    group_by: d.group_by.length ? d.group_by : ['account'],
    account_id: d.account_id.trim() || undefined,
  });
  const [query, setQuery] = useState(() => toQuery(draft));
  const report = useLoad((signal) => call(api.GET('/admin/v1/usage', { params: { query: usageQuery(query) }, signal })).then(asReport), [JSON.stringify(query)]);
  const csv = useAction(async () => {
    // Through the API client like every call: its token, its errors, and a 401 signs the console out.
    const blob = await call(api.GET('/admin/v1/usage', { params: { query: usageQuery(query) }, headers: { Accept: 'text/csv' }, parseAs: 'blob' }));
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = `mediagate-usage-${query.from.slice(0, 10)}-${query.to.slice(0, 10)}.csv`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  });
  return (
    <Stack>
      <Title order={1} size="h2">
        Usage
      </Title>
      <form aria-label="Usage report" onSubmit={(e: FormEvent) => (e.preventDefault(), setQuery(toQuery(draft)))}>
        <Group align="flex-end" wrap="wrap">
          <TextInput type="datetime-local" label="From (UTC)" required value={draft.from} onChange={(e) => setDraft({ ...draft, from: e.currentTarget.value })} />
          <TextInput type="datetime-local" label="To (UTC)" required value={draft.to} onChange={(e) => setDraft({ ...draft, to: e.currentTarget.value })} />
          <Select label="Granularity" w={120} data={[{ value: 'day', label: 'Day' }, { value: 'hour', label: 'Hour' }]} value={draft.granularity} onChange={(v) => v && setDraft({ ...draft, granularity: v as 'hour' | 'day' })} allowDeselect={false} />
          <Checkbox.Group label="Group by" value={draft.group_by} onChange={(v) => setDraft({ ...draft, group_by: v as UsageDimension[] })}>
            <Group gap="sm" mt={6}>
              {DIMENSIONS.map((d) => (
                <Checkbox key={d} value={d} label={d} />
              ))}
            </Group>
          </Checkbox.Group>
          <TextInput label="Account id" value={draft.account_id} onChange={(e) => setDraft({ ...draft, account_id: e.currentTarget.value })} />
          <Button type="submit">Run report</Button>
          <Button variant="default" onClick={() => void csv.run()} loading={csv.pending}>
            Download CSV
          </Button>
        </Group>
      </form>
      <ErrorAlert error={report.error} title="Could not run the report" />
      <ErrorAlert error={csv.error} title="Could not download the CSV" />
      {report.data && <UsageChart report={report.data} />}
      {report.data && <UsageTable report={report.data} />}
    </Stack>
  );
}

export function UsageChart({ report, height = 260 }: { report: UsageReport; height?: number }) {
  const data = useMemo(() => byPeriod(report), [report]);
  return (
    <figure style={{ margin: 0 }} aria-label="Credits spent and refunded per period">
      <ResponsiveContainer width="100%" height={height}>
        <BarChart data={data}>
          <CartesianGrid strokeDasharray="3 3" />
          <XAxis dataKey="period" />
          <YAxis />
          <Tooltip />
          <Legend />
          <Bar dataKey="spent" name="Credits spent" fill="#1864ab" />
          <Bar dataKey="refunded" name="Credits refunded" fill="#9a3412" />
        </BarChart>
      </ResponsiveContainer>
      <figcaption>
        <Text size="xs" c="dark.6">
          Credits spent and refunded per {report.granularity}, {utcText(report.from)} to {utcText(report.to)} UTC.
        </Text>
      </figcaption>
    </figure>
  );
}

function UsageTable({ report }: { report: UsageReport }) {
  const dims = report.group_by;
  return (
    <Table.ScrollContainer minWidth={1000}>
      <Table striped aria-label="Usage rows">
        <Table.Thead>
          <Table.Tr>
            <Table.Th>Period (UTC)</Table.Th>
            {dims.includes('account') && <Table.Th>Account</Table.Th>}
            {dims.includes('key') && <Table.Th>Key</Table.Th>}
            {dims.includes('model') && <Table.Th>Model</Table.Th>}
            {dims.includes('provider') && <Table.Th>Provider</Table.Th>}
            <Table.Th ta="right">Spent</Table.Th>
            <Table.Th ta="right">Refunded</Table.Th>
            <Table.Th ta="right">Videos done / failed</Table.Th>
            <Table.Th ta="right">Images done / failed / attention</Table.Th>
            <Table.Th ta="right">Images delivered / requested</Table.Th>
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {report.rows.map((r, i) => (
            <Table.Tr key={i}>
              <Table.Td>{utcText(r.period_start)}</Table.Td>
              {dims.includes('account') && <Table.Td>{r.account_id ?? '—'}</Table.Td>}
              {dims.includes('key') && <Table.Td>{r.api_key_id ?? '—'}</Table.Td>}
              {dims.includes('model') && <Table.Td>{r.model ?? '—'}</Table.Td>}
              {dims.includes('provider') && <Table.Td>{r.provider ?? '—'}</Table.Td>}
              <Table.Td ta="right">{credits(r.credits_spent)}</Table.Td>
              <Table.Td ta="right">{credits(r.credits_refunded)}</Table.Td>
              <Table.Td ta="right">
                {r.video_tasks_completed} / {r.video_tasks_failed}
              </Table.Td>
              <Table.Td ta="right">
                {r.image_tasks_completed} / {r.image_tasks_failed} / {r.image_tasks_needs_attention}
              </Table.Td>
              <Table.Td ta="right">
                {r.images_delivered} / {r.images_requested}
              </Table.Td>
            </Table.Tr>
          ))}
          {report.rows.length === 0 && (
            <Table.Tr>
              <Table.Td colSpan={10}>No usage in this range.</Table.Td>
            </Table.Tr>
          )}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}
