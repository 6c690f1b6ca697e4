/** Ledger entries (filters of GET /admin/v1/ledger) and the table other pages reuse. */
import { Button, Group, Select, Stack, Table, TextInput, Title } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { api, call, type LedgerEntry } from '../api.ts';
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

export function LedgerPage() {
  const { search } = useLocation();
  const [draft, setDraft] = useState({
    account_id: search.get('account_id') ?? '',
    api_key_id: search.get('api_key_id') ?? '',
    task_id: search.get('task_id') ?? '',
    kind: '',
    after: '',
    before: '',
  });
  const [filter, setFilter] = useState<LedgerFilter>(compact({ account_id: draft.account_id, api_key_id: draft.api_key_id, task_id: draft.task_id }));
  const apply = (e: FormEvent) => {
    e.preventDefault();
    setFilter(
      compact({
        account_id: draft.account_id.trim(),
        api_key_id: draft.api_key_id.trim(),
        task_id: draft.task_id.trim(),
        kind: draft.kind ? [draft.kind as Kind] : undefined,
        created_after: fromLocalInput(draft.after),
        created_before: fromLocalInput(draft.before),
      }),
    );
  };
  const set = (k: keyof typeof draft) => (v: string) => setDraft((d) => ({ ...d, [k]: v }));
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
          <Select label="Kind" data={[{ value: '', label: 'Any kind' }, ...KINDS.map((k) => ({ value: k, label: k }))]} value={draft.kind} onChange={(v) => set('kind')(v ?? '')} allowDeselect={false} w={150} />
          <TextInput type="datetime-local" label="Created after" value={draft.after} onChange={(e) => set('after')(e.currentTarget.value)} />
          <TextInput type="datetime-local" label="Created before" value={draft.before} onChange={(e) => set('before')(e.currentTarget.value)} />
          <Button type="submit">Apply filters</Button>
        </Group>
      </form>
      <LedgerTable filter={filter} />
    </Stack>
  );
}
