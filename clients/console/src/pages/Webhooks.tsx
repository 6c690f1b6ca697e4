/** Webhook deliveries (state, account, created range), each linking to its task (where it is re-delivered). */
import { Button, Group, Select, Stack, Table, TextInput, Title } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { api, call, type WebhookDelivery } from '../api.ts';
import { Link } from '../router.tsx';
import { ErrorAlert, Pager, compact, fromLocalInput, useCursorPages, useLoad, when } from '../ui.tsx';
import { StatusBadge } from './Accounts.tsx';

type State = WebhookDelivery['status'];
const STATES: State[] = ['pending', 'delivered', 'failed', 'gone'];

export function WebhooksPage() {
  const [draft, setDraft] = useState({ status: '', account_id: '', after: '', before: '' });
  const [filter, setFilter] = useState<{ status?: State[]; account_id?: string; created_after?: string; created_before?: string }>({});
  const key = JSON.stringify(filter);
  const pages = useCursorPages(key);
  const list = useLoad(() => call(api.GET('/admin/v1/webhook-deliveries', { params: { query: { limit: 25, cursor: pages.cursor, ...filter } } })), [key, pages.cursor]);
  return (
    <Stack>
      <Title order={1} size="h2">
        Webhook deliveries
      </Title>
      <form
        aria-label="Webhook filters"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          setFilter(compact({ status: draft.status ? [draft.status as State] : undefined, account_id: draft.account_id.trim(), created_after: fromLocalInput(draft.after), created_before: fromLocalInput(draft.before) }));
        }}
      >
        <Group align="flex-end" wrap="wrap">
          <Select label="State" w={150} data={[{ value: '', label: 'Any state' }, ...STATES.map((s) => ({ value: s, label: s }))]} value={draft.status} onChange={(v) => setDraft({ ...draft, status: v ?? '' })} allowDeselect={false} />
          <TextInput label="Account id" value={draft.account_id} onChange={(e) => setDraft({ ...draft, account_id: e.currentTarget.value })} />
          <TextInput type="datetime-local" label="Created after" value={draft.after} onChange={(e) => setDraft({ ...draft, after: e.currentTarget.value })} />
          <TextInput type="datetime-local" label="Created before" value={draft.before} onChange={(e) => setDraft({ ...draft, before: e.currentTarget.value })} />
          <Button type="submit">Apply filters</Button>
        </Group>
      </form>
      <ErrorAlert error={list.error} title="Could not list webhook deliveries" />
      <Table.ScrollContainer minWidth={900}>
        <Table striped aria-label="Webhook deliveries">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Task</Table.Th>
              <Table.Th>Event</Table.Th>
              <Table.Th>State</Table.Th>
              <Table.Th>URL</Table.Th>
              <Table.Th>Attempts</Table.Th>
              <Table.Th>Last result</Table.Th>
              <Table.Th>Next attempt</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((w) => {
              const last = w.attempts[w.attempts.length - 1];
              return (
                <Table.Tr key={w.webhook_id}>
                  <Table.Td>
                    <Link to={`/tasks/${w.task_id}`}>
                      <code>{w.task_id}</code>
                    </Link>
                  </Table.Td>
                  <Table.Td>{w.event_type}</Table.Td>
                  <Table.Td>
                    <StatusBadge status={w.status} />
                  </Table.Td>
                  <Table.Td style={{ wordBreak: 'break-all' }}>{w.url}</Table.Td>
                  <Table.Td>{w.attempts.length}</Table.Td>
                  <Table.Td>{last ? (last.status_code ? `HTTP ${last.status_code}` : `${last.error_class || 'error'}: ${last.error ?? ''}`) : '—'}</Table.Td>
                  <Table.Td>{when(w.next_attempt_at)}</Table.Td>
                </Table.Tr>
              );
            })}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={7}>No webhook deliveries match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="Webhook deliveries" />
    </Stack>
  );
}
