/** Webhook deliveries (state, account, created range), each linking to its task (where it is re-delivered). */
import { Button, Group, MultiSelect, Stack, Table, TextInput, Title } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { api, call, type WebhookDelivery } from '../api.ts';
import { allowedList, applyFilters, filterUrl, toLocalInput } from '../filters.ts';
import { Link, useLocation } from '../router.tsx';
import { ErrorAlert, Pager, compact, fromLocalInput, useCursorPages, useLoad, when } from '../ui.tsx';
import { StatusBadge } from './Accounts.tsx';

type State = WebhookDelivery['status'];
const STATES: State[] = ['pending', 'delivered', 'failed', 'gone'];

type WebhookFilter = { status?: State[]; account_id?: string; created_after?: string; created_before?: string };

/** The listing's filter, from the page's query (what Apply wrote, or a link such as `?status=failed,gone`). */
function webhookFilterOf(search: URLSearchParams): WebhookFilter {
  const status = allowedList(search, 'status', STATES);
  return compact({
    status: status.length ? status : undefined,
    account_id: search.get('account_id')?.trim(),
    created_after: search.get('created_after') ?? undefined,
    created_before: search.get('created_before') ?? undefined,
  });
}

export function WebhooksPage() {
  const { search } = useLocation();
  // Built from the URL, like the form's fields: the shell mounts this page afresh for each query.
  const filter = webhookFilterOf(search);
  const [draft, setDraft] = useState({
    status: filter.status ?? [],
    account_id: filter.account_id ?? '',
    after: toLocalInput(filter.created_after ?? null),
    before: toLocalInput(filter.created_before ?? null),
  });
  const key = JSON.stringify(filter);
  const pages = useCursorPages(key);
  const list = useLoad(() => call(api.GET('/admin/v1/webhook-deliveries', { params: { query: { limit: 25, cursor: pages.cursor, ...filter } } })), [key, pages.cursor]);
  // Apply writes the filters into the URL: Back from a task, or a reload, lists the same deliveries.
  const apply = () =>
    applyFilters(
      filterUrl('/webhooks', { status: draft.status, account_id: draft.account_id, created_after: fromLocalInput(draft.after), created_before: fromLocalInput(draft.before) }),
      () => (pages.page > 1 ? pages.first() : void list.reload()),
    );
  return (
    <Stack>
      <Title order={1} size="h2">
        Webhook deliveries
      </Title>
      <form
        aria-label="Webhook filters"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          apply();
        }}
      >
        <Group align="flex-end" wrap="wrap">
          <MultiSelect label="State" placeholder="Any state" w={260} data={STATES} value={draft.status} onChange={(v) => setDraft({ ...draft, status: v as State[] })} clearable />
          <TextInput label="Account id" value={draft.account_id} onChange={(e) => setDraft({ ...draft, account_id: e.currentTarget.value })} />
          <TextInput type="datetime-local" label="Created after (local time)" value={draft.after} onChange={(e) => setDraft({ ...draft, after: e.currentTarget.value })} />
          <TextInput type="datetime-local" label="Created before (local time)" value={draft.before} onChange={(e) => setDraft({ ...draft, before: e.currentTarget.value })} />
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
