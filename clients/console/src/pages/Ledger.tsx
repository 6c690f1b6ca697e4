/** Ledger entries (filters of GET /admin/v1/ledger) and the table other pages reuse. */
import { Button, Group, MultiSelect, Stack, Table, TextInput, Title } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { api, call, type LedgerEntry } from '../api.ts';
import { allowedList, applyFilters, filterUrl, toLocalInput } from '../filters.ts';
import { Link, useLocation } from '../router.tsx';
import { ErrorAlert, Pager, compact, credits, fromLocalInput, useCursorPages, useLoad, when } from '../ui.tsx';

type Kind = LedgerEntry['kind'];
export type LedgerFilter = {
  account_id?: string;
  api_key_id?: string;
  task_id?: string;
  kind?: Kind[];
  created_after?: string;
  created_before?: string;
};
const KINDS: Kind[] = ['grant', 'debit', 'hold', 'capture', 'release'];

export function LedgerTable({ filter }: { filter: LedgerFilter }) {
  const key = JSON.stringify(filter);
  const pages = useCursorPages(key);
  const list = useLoad(() => call(api.GET('/admin/v1/ledger', { params: { query: { limit: 25, cursor: pages.cursor, ...compact(filter) } } })), [key, pages.cursor]);
  return (
    <Stack gap="xs">
      <ErrorAlert error={list.error} title="Could not list ledger entries" />
      <Table.ScrollContainer minWidth={800}>
        <Table striped aria-label="Ledger entries">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>When</Table.Th>
              <Table.Th>Kind</Table.Th>
              <Table.Th ta="right">Amount</Table.Th>
              <Table.Th ta="right">Balance change</Table.Th>
              <Table.Th>Account</Table.Th>
              <Table.Th>Task</Table.Th>
              <Table.Th>Reason</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((e) => (
              <Table.Tr key={e.id}>
                <Table.Td>{when(e.created_at)}</Table.Td>
                <Table.Td>{e.kind}</Table.Td>
                <Table.Td ta="right">{credits(e.amount)}</Table.Td>
                <Table.Td ta="right">{credits(e.balance_change)}</Table.Td>
                <Table.Td>
                  <Link to={`/accounts/${e.account_id}`}>
                    <code>{e.account_id}</code>
                  </Link>
                </Table.Td>
                <Table.Td>{e.task_id ? <Link to={`/tasks/${e.task_id}`}><code>{e.task_id}</code></Link> : '—'}</Table.Td>
                <Table.Td>{e.reason ?? '—'}</Table.Td>
              </Table.Tr>
            ))}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={7}>No ledger entries match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="Ledger" />
    </Stack>
  );
}

/** The page's filter, from its query (what Apply wrote, or a link such as `?account_id=…&kind=grant`). */
function ledgerFilterOf(search: URLSearchParams): LedgerFilter {
  const kind = allowedList(search, 'kind', KINDS);
  return compact({
    account_id: search.get('account_id')?.trim(),
    api_key_id: search.get('api_key_id')?.trim(),
    task_id: search.get('task_id')?.trim(),
    kind: kind.length ? kind : undefined,
    created_after: search.get('created_after') ?? undefined,
    created_before: search.get('created_before') ?? undefined,
  });
}

export function LedgerPage() {
  const { search } = useLocation();
  // Built from the URL, like the form's fields: the shell mounts this page afresh for each query.
  const filter = ledgerFilterOf(search);
  const [draft, setDraft] = useState({
    account_id: filter.account_id ?? '',
    api_key_id: filter.api_key_id ?? '',
    task_id: filter.task_id ?? '',
    kind: filter.kind ?? [],
    after: toLocalInput(filter.created_after ?? null),
    before: toLocalInput(filter.created_before ?? null),
  });
  // A nonce that lists the same filter again (Apply with nothing changed).
  const [again, setAgain] = useState(0);
  // Apply writes the filters into the URL: Back from a task, or a reload, lists the same entries.
  const apply = (e: FormEvent) => {
    e.preventDefault();
    applyFilters(
      filterUrl('/ledger', {
        account_id: draft.account_id,
        api_key_id: draft.api_key_id,
        task_id: draft.task_id,
        kind: draft.kind,
        created_after: fromLocalInput(draft.after),
        created_before: fromLocalInput(draft.before),
      }),
      () => setAgain((n) => n + 1),
    );
  };
  const set = (k: keyof typeof draft) => (v: string | string[]) => setDraft((d) => ({ ...d, [k]: v }));
  return (
    <Stack>
      <Title order={1} size="h2">
        Ledger
      </Title>
      <form onSubmit={apply} aria-label="Ledger filters">
        <Group align="flex-end" wrap="wrap">
          <TextInput label="Account id" value={draft.account_id} onChange={(e) => set('account_id')(e.currentTarget.value)} />
          <TextInput label="API key id" value={draft.api_key_id} onChange={(e) => set('api_key_id')(e.currentTarget.value)} />
          <TextInput label="Task id" value={draft.task_id} onChange={(e) => set('task_id')(e.currentTarget.value)} />
          <MultiSelect label="Kind" placeholder="Any kind" data={KINDS} value={draft.kind} onChange={set('kind')} clearable w={260} />
          <TextInput type="datetime-local" label="Created after (local time)" value={draft.after} onChange={(e) => set('after')(e.currentTarget.value)} />
          <TextInput type="datetime-local" label="Created before (local time)" value={draft.before} onChange={(e) => set('before')(e.currentTarget.value)} />
          <Button type="submit">Apply filters</Button>
        </Group>
      </form>
      <LedgerTable key={again} filter={filter} />
    </Stack>
  );
}
