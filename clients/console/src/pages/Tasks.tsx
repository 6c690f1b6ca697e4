/** Tasks: the listing's filters and pages; one task with its whole story, its output media, settlement and webhook re-delivery. */
import { Anchor, Button, Card, Code, Group, MultiSelect, Select, SimpleGrid, Stack, Table, Text, TextInput, Textarea, Title } from '@mantine/core';
import { useRef, useState, type FormEvent } from 'react';
import { PROVIDERS, TASK_STATUSES, api, call, type Provider, type Task, type TaskStatus } from '../api.ts';
import { allowedList, allowedValue, applyFilters, filterUrl, toLocalInput } from '../filters.ts';
import { Link, useLocation } from '../router.tsx';
import { ConfirmButton, ErrorAlert, Pager, compact, credits, fromLocalInput, useAction, useCursorPages, useLoad, when } from '../ui.tsx';
import { StatusBadge } from './Accounts.tsx';

interface TaskFilter {
  kind?: 'image' | 'video';
  status?: TaskStatus[];
  account_id?: string;
  api_key_id?: string;
  model?: string;
  member_id?: string;
  provider?: Provider;
  created_after?: string;
  created_before?: string;
}

const KINDS = ['image', 'video'] as const;

/** The listing's filter, from the page's query (what Apply wrote, or a link). */
function taskFilterOf(search: URLSearchParams): TaskFilter {
  const status = allowedList(search, 'status', TASK_STATUSES);
  return compact({
    kind: allowedValue(search, 'kind', KINDS) || undefined,
    status: status.length ? status : undefined,
    account_id: search.get('account_id')?.trim(),
    api_key_id: search.get('api_key_id')?.trim(),
    model: search.get('model')?.trim(),
    member_id: search.get('member_id')?.trim(),
    provider: allowedValue(search, 'provider', PROVIDERS) || undefined,
    created_after: search.get('created_after') ?? undefined,
    created_before: search.get('created_before') ?? undefined,
  });
}

export function TasksPage() {
  const { search } = useLocation();
  // Built from the URL, like the form's fields: the shell mounts this page afresh for each query.
  const filter = taskFilterOf(search);
  const [draft, setDraft] = useState({
    kind: filter.kind ?? '',
    status: filter.status ?? [],
    account_id: filter.account_id ?? '',
    api_key_id: filter.api_key_id ?? '',
    model: filter.model ?? '',
    member_id: filter.member_id ?? '',
    provider: filter.provider ?? '',
    after: toLocalInput(filter.created_after ?? null),
    before: toLocalInput(filter.created_before ?? null),
  });
  const key = JSON.stringify(filter);
  const pages = useCursorPages(key);
  const list = useLoad(() => call(api.GET('/admin/v1/tasks', { params: { query: { limit: 25, cursor: pages.cursor, ...filter } } })), [key, pages.cursor], 10_000);
  // Apply writes the filters into the URL: Back from a task, or a reload, lists the same tasks.
  const apply = () =>
    applyFilters(
      filterUrl('/tasks', {
        kind: draft.kind,
        status: draft.status,
        account_id: draft.account_id,
        api_key_id: draft.api_key_id,
        model: draft.model,
        member_id: draft.member_id,
        provider: draft.provider,
        created_after: fromLocalInput(draft.after),
        created_before: fromLocalInput(draft.before),
      }),
      () => (pages.page > 1 ? pages.first() : void list.reload()),
    );
  const set = (k: keyof typeof draft) => (v: unknown) => setDraft((d) => ({ ...d, [k]: v }));
  return (
    <Stack>
      <Title order={1} size="h2">
        Tasks
      </Title>
      <form
        aria-label="Task filters"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          apply();
        }}
      >
        <Group align="flex-end" wrap="wrap" gap="sm">
          <Select label="Kind" w={130} data={[{ value: '', label: 'Any kind' }, { value: 'image', label: 'Image' }, { value: 'video', label: 'Video' }]} value={draft.kind} onChange={(v) => set('kind')(v ?? '')} allowDeselect={false} />
          <MultiSelect label="Status" placeholder="Any status" w={260} data={TASK_STATUSES} value={draft.status} onChange={set('status')} clearable />
          <TextInput label="Account id" value={draft.account_id} onChange={(e) => set('account_id')(e.currentTarget.value)} />
          <TextInput label="API key id" value={draft.api_key_id} onChange={(e) => set('api_key_id')(e.currentTarget.value)} />
          <TextInput label="Model" value={draft.model} onChange={(e) => set('model')(e.currentTarget.value)} />
          <TextInput label="Member id" value={draft.member_id} onChange={(e) => set('member_id')(e.currentTarget.value)} />
          <Select label="Provider" w={150} data={[{ value: '', label: 'Any provider' }, ...PROVIDERS.map((p) => ({ value: p, label: p }))]} value={draft.provider} onChange={(v) => set('provider')(v ?? '')} allowDeselect={false} />
          <TextInput type="datetime-local" label="Created after (local time)" value={draft.after} onChange={(e) => set('after')(e.currentTarget.value)} />
          <TextInput type="datetime-local" label="Created before (local time)" value={draft.before} onChange={(e) => set('before')(e.currentTarget.value)} />
          <Button type="submit">Apply filters</Button>
        </Group>
      </form>
      <ErrorAlert error={list.error} title="Could not list tasks" />
      <Table.ScrollContainer minWidth={1000}>
        <Table striped highlightOnHover aria-label="Tasks">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Task</Table.Th>
              <Table.Th>Status</Table.Th>
              <Table.Th>Model</Table.Th>
              <Table.Th>Account</Table.Th>
              <Table.Th>Provider</Table.Th>
              <Table.Th ta="right">Held</Table.Th>
              <Table.Th ta="right">Captured</Table.Th>
              <Table.Th>Created</Table.Th>
              <Table.Th>Error</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((t) => (
              <Table.Tr key={t.id} data-task-id={t.id}>
                <Table.Td>
                  <Link to={`/tasks/${t.id}`}>
                    <code>{t.id}</code>
                  </Link>
                </Table.Td>
                <Table.Td>
                  <StatusBadge status={t.status} />
                </Table.Td>
                <Table.Td>{t.model}</Table.Td>
                <Table.Td>
                  <Link to={`/accounts/${t.account_id}`}>
                    <code>{t.account_id}</code>
                  </Link>
                </Table.Td>
                <Table.Td>{t.provider ?? '—'}</Table.Td>
                <Table.Td ta="right">{credits(t.held_credits)}</Table.Td>
                <Table.Td ta="right">{credits(t.captured_credits)}</Table.Td>
                <Table.Td>{when(t.created_at)}</Table.Td>
                <Table.Td maw={280}>
                  <Text size="xs">{t.error?.message ?? t.last_error?.message ?? '—'}</Text>
                </Table.Td>
              </Table.Tr>
            ))}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={9}>No tasks match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="Tasks" />
    </Stack>
  );
}

function Field({ label, children }: { label: string; children: React.ReactNode }) {
  return (
    <div>
      <Text size="xs" c="dark.6" fw={600} tt="uppercase">
        {label}
      </Text>
      <Text size="sm" component="div" style={{ overflowWrap: 'anywhere' }}>
        {children}
      </Text>
    </div>
  );
}

export function TaskDetailPage({ id }: { id: string }) {
  const finished = (t: Task | undefined) => t !== undefined && (t.status === 'completed' || t.status === 'failed');
  const [refresh, setRefresh] = useState<number | undefined>(3000);
  const task = useLoad(
    async () => {
      const t = await call(api.GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } }));
      if (finished(t)) setRefresh(undefined);
      return t;
    },
    [id, refresh],
    refresh,
  );
  const t = task.data;
  return (
    <Stack>
      <Text size="sm">
        <Link to="/tasks">Tasks</Link> / {id}
      </Text>
      <ErrorAlert error={task.error} title="Could not load the task" />
      {t && (
        <>
          <Group justify="space-between">
            <Title order={1} size="h2">
              {t.kind === 'video' ? 'Video' : 'Image'} task <code>{t.id}</code>
            </Title>
            <StatusBadge status={t.status} />
          </Group>
          <Card withBorder>
            <SimpleGrid cols={{ base: 1, xs: 2, md: 4 }}>
              <Field label="Model">{t.model}</Field>
              <Field label="Account">
                <Link to={`/accounts/${t.account_id}`}>{t.account_id}</Link>
              </Field>
              <Field label="API key">{t.api_key_id}</Field>
              <Field label="Member">
                {t.member_id ?? '—'} {t.provider ? `(${t.provider})` : ''}
              </Field>
              <Field label="Upstream job">{t.upstream_job_id ?? '—'}</Field>
              <Field label="Worker attempt">{t.attempt}</Field>
              <Field label="Created">{when(t.created_at)}</Field>
              <Field label="Finished">{when(t.completed_at)}</Field>
              <Field label="Deadline">{when(t.deadline_at)}</Field>
              <Field label="Error">{t.error ? `${t.error.code ?? 'error'}: ${t.error.message}` : '—'}</Field>
              <Field label="Last retried error">{t.last_error ? `${t.last_error.message} (${when(t.last_error.at)})` : '—'}</Field>
              <Field label="Settled by operator">{t.settled_reason ?? '—'}</Field>
            </SimpleGrid>
          </Card>
          {t.kind === 'image' && t.status === 'needs_attention' && <SettleTask task={t} onSettled={task.setData} />}
          <Outputs task={t} />
          <Title order={2} size="h3">
            Story
          </Title>
          <SimpleGrid cols={{ base: 1, md: 2 }}>
            <Card withBorder aria-label="Quote">
              <Title order={3} size="h5" mb="xs">
                Quote
              </Title>
              <Text size="sm">
                {t.quote.billing_kind === 'legacy'
                  ? 'Accepted before quotes were recorded (legacy): unit price unknown.'
                  : `${credits(t.quote.unit_price)} ${t.quote.mode === 'per_second' ? 'per second' : 'per item'} × ${t.quote.units} = ${credits(t.quote.quoted_credits)} quoted`}
              </Text>
              <Text size="sm">Actual: {credits(t.quote.actual_credits)} credits</Text>
            </Card>
            <Card withBorder aria-label="Credit hold">
              <Title order={3} size="h5" mb="xs">
                Credit hold
              </Title>
              {t.hold ? (
                <Text size="sm">
                  {t.hold.status}: {credits(t.hold.amount)} held, {credits(t.hold.captured)} captured, {credits(t.hold.released)} released
                  {t.hold.settled_at ? ` (settled ${when(t.hold.settled_at)})` : ''}
                </Text>
              ) : (
                <Text size="sm">No hold: the task was free.</Text>
              )}
            </Card>
          </SimpleGrid>
          <Title order={3} size="h4">
            Upstream attempts
          </Title>
          <Table.ScrollContainer minWidth={800}>
            <Table striped aria-label="Upstream attempts">
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>Started</Table.Th>
                  <Table.Th>Step</Table.Th>
                  <Table.Th>Member</Table.Th>
                  <Table.Th>Upstream job</Table.Th>
                  <Table.Th>Outcome</Table.Th>
                  <Table.Th ta="right">Duration</Table.Th>
                  <Table.Th>Error</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {t.attempts.map((a, i) => (
                  <Table.Tr key={i}>
                    <Table.Td>{when(a.started_at)}</Table.Td>
                    <Table.Td>{a.step}</Table.Td>
                    <Table.Td>
                      {a.member_id ?? '—'} {a.provider ? `(${a.provider})` : ''}
                    </Table.Td>
                    <Table.Td>{a.upstream_job_id ?? '—'}</Table.Td>
                    <Table.Td>{a.outcome}</Table.Td>
                    <Table.Td ta="right">{a.duration_ms} ms</Table.Td>
                    <Table.Td>{a.error ?? '—'}</Table.Td>
                  </Table.Tr>
                ))}
                {t.attempts.length === 0 && (
                  <Table.Tr>
                    <Table.Td colSpan={7}>No upstream call recorded yet.</Table.Td>
                  </Table.Tr>
                )}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
          <Title order={3} size="h4">
            Ledger entries
          </Title>
          <Table.ScrollContainer minWidth={600}>
            <Table striped aria-label="Task ledger entries">
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>When</Table.Th>
                  <Table.Th>Kind</Table.Th>
                  <Table.Th ta="right">Amount</Table.Th>
                  <Table.Th ta="right">Balance change</Table.Th>
                  <Table.Th>Reason</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {t.ledger.map((e) => (
                  <Table.Tr key={e.id}>
                    <Table.Td>{when(e.created_at)}</Table.Td>
                    <Table.Td>{e.kind}</Table.Td>
                    <Table.Td ta="right">{credits(e.amount)}</Table.Td>
                    <Table.Td ta="right">{credits(e.balance_change)}</Table.Td>
                    <Table.Td>{e.reason ?? '—'}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
          <Webhook task={t} onChanged={() => void task.reload()} />
        </>
      )}
    </Stack>
  );
}

type Output = Task['outputs'][number];

/** How long a signed output URL is kept while the page refreshes the task (a new one on every read would reload the player). */
const KEEP_URL_MS = 5 * 60_000;

/** The output URLs, one per file, kept across the page's refreshes for KEEP_URL_MS. */
function useKeptUrls(outputs: Output[]): (o: Output) => string {
  const kept = useRef(new Map<string, { url: string; at: number }>());
  const now = Date.now();
  for (const o of outputs) {
    const k = kept.current.get(o.file_id);
    if (!k || now - k.at > KEEP_URL_MS) kept.current.set(o.file_id, { url: o.url, at: now });
  }
  return (o) => kept.current.get(o.file_id)?.url ?? o.url;
}

function bytesText(n: number): string {
  return n >= 1_048_576 ? `${(n / 1_048_576).toFixed(1)} MB` : n >= 1024 ? `${Math.round(n / 1024)} KB` : `${n} bytes`;
}

/** The task's stored media in the page: an image preview or a video player each, with a download link. */
function Outputs({ task }: { task: Task }) {
  const urlOf = useKeptUrls(task.outputs);
  const unfinished = task.status === 'queued' || task.status === 'in_progress' || task.status === 'processing';
  return (
    <Stack gap="xs" aria-label="Outputs" component="section">
      <Title order={2} size="h3">
        Output
      </Title>
      {task.outputs.length === 0 ? (
        <Text size="sm">
          {unfinished
            ? 'Nothing yet: the task has not finished.'
            : task.status === 'completed'
              ? 'No stored output: retention removed it, or the account deleted it.'
              : 'No stored output.'}
        </Text>
      ) : (
        <SimpleGrid cols={{ base: 1, sm: task.outputs.length > 1 ? 2 : 1, lg: task.outputs.length > 1 ? 3 : 1 }}>
          {task.outputs.map((o, i) => {
            const url = urlOf(o);
            const what = `${task.kind === 'video' ? 'Video' : `Image ${i + 1}`} of task ${task.id}`;
            const size = o.width && o.height ? `${o.width}×${o.height}, ` : '';
            return (
              <Card withBorder key={o.file_id} data-output-id={o.file_id} maw={task.outputs.length === 1 ? 720 : undefined}>
                {o.content_type.startsWith('video/') ? (
                  <video controls preload="metadata" src={url} aria-label={what} style={{ width: '100%', maxHeight: 480, background: '#000' }} />
                ) : o.content_type.startsWith('image/') ? (
                  <img src={url} alt={`${what}${size ? ` (${size.slice(0, -2)})` : ''}`} loading="lazy" style={{ width: '100%', height: 'auto', maxHeight: 480, objectFit: 'contain' }} />
                ) : null}
                <Group justify="space-between" mt="xs" gap="xs">
                  <Text size="xs" style={{ overflowWrap: 'anywhere' }}>
                    <code>{o.file_id}</code> · {o.content_type}, {size}
                    {bytesText(o.bytes)}
                    {o.expires_at ? ` · kept until ${when(o.expires_at)}` : ''}
                  </Text>
                  <Anchor href={url} download size="sm" aria-label={`Download ${what.charAt(0).toLowerCase()}${what.slice(1)}`}>
                    Download
                  </Anchor>
                </Group>
              </Card>
            );
          })}
        </SimpleGrid>
      )}
    </Stack>
  );
}

function SettleTask({ task, onSettled }: { task: Task; onSettled: (t: Task) => void }) {
  const [outcome, setOutcome] = useState<'completed' | 'refunded'>('refunded');
  const [reason, setReason] = useState('');
  // A refund still captures the images the client received (the contract's `delivered_credits`).
  const refundCaptures = task.delivered_credits ?? 0;
  const refundReleases = Math.max(0, Math.round((task.held_credits - refundCaptures) * 1e6) / 1e6);
  const settle = useAction(async () => {
    const t = await call(api.POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: task.id } }, body: { outcome, reason } }));
    onSettled(t);
    return t;
  });
  return (
    <Card withBorder aria-label="Settle this task" style={{ borderColor: 'var(--mantine-color-orange-7)' }}>
      <Title order={2} size="h4" mb="xs">
        Settle this task
      </Title>
      <Text size="sm" mb="sm">
        An image was produced but could not be recorded: {credits(task.held_credits)} credits stay held until you decide. Completed captures them all; refunded
        {refundCaptures > 0
          ? ` still captures ${credits(refundCaptures)} for the images the client already received and releases the other ${credits(refundReleases)} to the account.`
          : ' releases them to the account.'}
      </Text>
      <Group align="flex-end">
        <Select
          label="Outcome"
          data={[
            { value: 'refunded', label: 'Refund (release the credits)' },
            { value: 'completed', label: 'Completed (capture the credits)' },
          ]}
          value={outcome}
          onChange={(v) => v && setOutcome(v as typeof outcome)}
          allowDeselect={false}
          w={300}
        />
        <Textarea label="Reason" value={reason} onChange={(e) => setReason(e.currentTarget.value)} required autosize minRows={1} w={320} />
        <ConfirmButton
          color="orange"
          disabled={reason.trim() === ''}
          title="Settle the task?"
          message={
            outcome === 'refunded'
              ? `Release ${credits(refundReleases)} credits to ${task.account_id}${refundCaptures > 0 ? ` (${credits(refundCaptures)} stay captured for the images already delivered)` : ''}? This cannot be undone.`
              : `Capture ${credits(task.held_credits)} credits from ${task.account_id}? This cannot be undone.`
          }
          confirmLabel={outcome === 'refunded' ? 'Refund' : 'Complete'}
          onConfirm={() => settle.run()}
        >
          Settle task
        </ConfirmButton>
      </Group>
      <ErrorAlert error={settle.error} title="The task could not be settled" />
    </Card>
  );
}

function Webhook({ task, onChanged }: { task: Task; onChanged: () => void }) {
  const redeliver = useAction(async () => {
    const result = await call(api.POST('/admin/v1/tasks/{task_id}/webhook/redeliver', { params: { path: { task_id: task.id } } }));
    onChanged();
    return result;
  });
  const w = task.webhook;
  return (
    <Stack gap="xs">
      <Title order={3} size="h4">
        Webhook
      </Title>
      {!w ? (
        <Text size="sm">{task.kind === 'image' ? 'Image tasks send no webhook.' : 'No webhook: the task has no callback_url, or has not finished.'}</Text>
      ) : (
        <>
          <Text size="sm">
            {w.event_type} to <Code>{w.url}</Code>: <StatusBadge status={w.status} /> {w.delivered_at ? `delivered ${when(w.delivered_at)}` : w.next_attempt_at ? `next attempt ${when(w.next_attempt_at)}` : ''}
          </Text>
          <Table.ScrollContainer minWidth={700}>
            <Table striped aria-label="Webhook attempts">
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>Attempted</Table.Th>
                  <Table.Th>HTTP status</Table.Th>
                  <Table.Th>Error</Table.Th>
                  <Table.Th ta="right">Latency</Table.Th>
                  <Table.Th>Next retry</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {w.attempts.map((a, i) => (
                  <Table.Tr key={i}>
                    <Table.Td>{when(a.attempted_at)}</Table.Td>
                    <Table.Td>{a.status_code ?? '—'}</Table.Td>
                    <Table.Td>{a.error ? `${a.error_class ? `${a.error_class}: ` : ''}${a.error}` : '—'}</Table.Td>
                    <Table.Td ta="right">{a.latency_ms} ms</Table.Td>
                    <Table.Td>{when(a.next_retry_at)}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        </>
      )}
      {task.kind === 'video' && (
        <Group>
          <ConfirmButton variant="outline" title="Re-deliver the webhook?" message={`The ${w?.event_type ?? 'finished'} event is sent again to the task's callback URL.`} confirmLabel="Re-deliver" onConfirm={() => redeliver.run()}>
            Re-deliver webhook
          </ConfirmButton>
        </Group>
      )}
      <ErrorAlert error={redeliver.error} title="The webhook could not be re-delivered" />
    </Stack>
  );
}
