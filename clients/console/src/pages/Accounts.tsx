/** Accounts: list (status filter, pages), create; one account: edit, grant or deduct credits, ledger, keys. */
import { Badge, Button, Card, Group, NumberInput, SegmentedControl, Select, SimpleGrid, Stack, Table, Text, TextInput, Title } from '@mantine/core';
import { useRef, useState, type FormEvent } from 'react';
import { ApiFailure, api, call, type Account } from '../api.ts';
import { changedFields } from '../changes.ts';
import { Link, navigate } from '../router.tsx';
import { ConfirmButton, ErrorAlert, LimitInput, Pager, STATUS_COLORS, credits, limitDraft, limitText, limitValue, numberField, parseNumber, useAction, useCursorPages, useLoad, when, type LimitDraft } from '../ui.tsx';
import { LedgerTable } from './Ledger.tsx';

export function AccountsPage() {
  const [status, setStatus] = useState<'' | 'active' | 'suspended'>('');
  const pages = useCursorPages(status);
  const list = useLoad(
    () => call(api.GET('/admin/v1/accounts', { params: { query: { limit: 25, cursor: pages.cursor, status: status || undefined } } })),
    [status, pages.cursor],
  );
  return (
    <Stack>
      <Title order={1} size="h2">
        Accounts
      </Title>
      <CreateAccount onCreated={(a) => navigate(`/accounts/${a.id}`)} />
      <Group align="flex-end">
        <Select
          label="Status"
          data={[
            { value: '', label: 'Any status' },
            { value: 'active', label: 'Active' },
            { value: 'suspended', label: 'Suspended' },
          ]}
          value={status}
          onChange={(v) => setStatus((v ?? '') as typeof status)}
          allowDeselect={false}
          w={200}
        />
      </Group>
      <ErrorAlert error={list.error} title="Could not list accounts" />
      <Table.ScrollContainer minWidth={700}>
        <Table striped highlightOnHover aria-label="Accounts">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Id</Table.Th>
              <Table.Th>Status</Table.Th>
              <Table.Th ta="right">Balance</Table.Th>
              <Table.Th ta="right">Spent</Table.Th>
              <Table.Th>Created</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((a) => (
              <Table.Tr key={a.id}>
                <Table.Td>
                  <Link to={`/accounts/${a.id}`}>{a.name}</Link>
                </Table.Td>
                <Table.Td>
                  <code>{a.id}</code>
                </Table.Td>
                <Table.Td>
                  <StatusBadge status={a.status} />
                </Table.Td>
                <Table.Td ta="right">{credits(a.balance)}</Table.Td>
                <Table.Td ta="right">{credits(a.total_spent)}</Table.Td>
                <Table.Td>{when(a.created_at)}</Table.Td>
              </Table.Tr>
            ))}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={6}>No accounts match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="Accounts" />
    </Stack>
  );
}

export function StatusBadge({ status }: { status: string }) {
  const color = STATUS_COLORS[status] ?? 'gray';
  return (
    <Badge variant="light" color={color} c="dark.9">
      {status.replace('_', ' ')}
    </Badge>
  );
}

function CreateAccount({ onCreated }: { onCreated: (a: Account) => void }) {
  const [name, setName] = useState('');
  const [initial, setInitial] = useState<number | string>('');
  const create = useAction(async () =>
    call(api.POST('/admin/v1/accounts', { body: { name, initial_credits: numberField(initial, 'Initial credits') ?? undefined } })),
  );
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    const a = await create.run();
    if (a) onCreated(a);
  };
  return (
    <Card withBorder component="form" onSubmit={submit} aria-label="Create an account">
      <Title order={2} size="h4" mb="sm">
        Create an account
      </Title>
      <Group align="flex-end">
        <TextInput label="Account name" required value={name} onChange={(e) => setName(e.currentTarget.value)} w={260} />
        <NumberInput label="Initial credits" min={0} value={initial} onChange={setInitial} w={180} />
        <Button type="submit" loading={create.pending}>
          Create account
        </Button>
      </Group>
      <ErrorAlert error={create.error} title="Could not create the account" />
    </Card>
  );
}

export function AccountDetailPage({ id }: { id: string }) {
  const account = useLoad(() => call(api.GET('/admin/v1/accounts/{account_id}', { params: { path: { account_id: id } } })), [id]);
  const [ledgerVersion, setLedgerVersion] = useState(0);
  // Each save refills the settings form from the saved account.
  const [saves, setSaves] = useState(0);
  const a = account.data;
  return (
    <Stack>
      <Text size="sm">
        <Link to="/accounts">Accounts</Link> / {id}
      </Text>
      <ErrorAlert error={account.error} title="Could not load the account" />
      {a && (
        <>
          <Group justify="space-between">
            <Title order={1} size="h2">
              {a.name}
            </Title>
            <StatusBadge status={a.status} />
          </Group>
          <SimpleGrid cols={{ base: 1, sm: 3 }}>
            <Stat label="Balance" value={credits(a.balance)} testId="account-balance" />
            <Stat label="Total granted" value={credits(a.total_earned)} />
            <Stat label="Total spent" value={credits(a.total_spent)} />
          </SimpleGrid>
          <Text size="sm">
            Limits: {limitText(a.requests_per_minute)} requests per minute, {limitText(a.max_in_flight)} generations in flight.
          </Text>
          <Group gap="md">
            <Link to={`/keys?account_id=${encodeURIComponent(a.id)}`}>API keys of this account</Link>
            <Link to={`/tasks?account_id=${encodeURIComponent(a.id)}`}>Tasks of this account</Link>
            <Link to={`/usage?account_id=${encodeURIComponent(a.id)}`}>Usage of this account</Link>
          </Group>
          <SimpleGrid cols={{ base: 1, md: 2 }}>
            <AdjustCredits
              account={a}
              onDone={(next) => {
                account.setData(next);
                setLedgerVersion((v) => v + 1);
              }}
            />
            <EditAccount
              key={saves}
              account={a}
              onSaved={(next) => {
                account.setData(next);
                setSaves((n) => n + 1);
              }}
            />
          </SimpleGrid>
          <Title order={2} size="h3">
            Ledger
          </Title>
          <LedgerTable key={ledgerVersion} filter={{ account_id: a.id }} />
        </>
      )}
    </Stack>
  );
}

export function Stat({ label, value, testId }: { label: string; value: string; testId?: string }) {
  return (
    <Card withBorder padding="sm">
      <Text size="xs" c="dark.6" tt="uppercase" fw={600}>
        {label}
      </Text>
      <Text size="xl" fw={700} data-testid={testId}>
        {value}
      </Text>
    </Card>
  );
}

/**
 * A new idempotency key: a UUID. `crypto.randomUUID` exists only in secure contexts (https,
 * localhost), and the console is also served over plain http on a private address.
 */
function newIdempotencyKey(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6]! & 0x0f) | 0x40; // version 4
  b[8] = (b[8]! & 0x3f) | 0x80; // RFC 4122 variant
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A failure that does not say whether the adjustment was applied: no answer (network), or a 5xx (an answer lost with the commit is 503). */
function outcomeUnknown(error: unknown): boolean {
  return error instanceof ApiFailure && (error.status === 0 || error.status >= 500);
}

function AdjustCredits({ account, onDone }: { account: Account; onDone: (a: Account) => void }) {
  const [direction, setDirection] = useState<'grant' | 'deduct'>('grant');
  const [amount, setAmount] = useState<number | string>('');
  const [reason, setReason] = useState('');
  // One idempotency key per adjustment the operator means: submitted again with the same values
  // (after any failure, or a second click while the first is in flight) it sends the same key, so
  // the server applies it at most once; other values, or a success, take a new key.
  const attempt = useRef<{ values: string; key: string } | null>(null);
  const value = parseNumber(amount);
  const adjust = useAction(async () => {
    if (value === null || !(value > 0)) throw new Error('Enter a positive number of credits.');
    const body = { amount: direction === 'grant' ? value : -value, reason };
    const values = JSON.stringify([account.id, body.amount, body.reason]);
    if (attempt.current?.values !== values) attempt.current = { values, key: newIdempotencyKey() };
    const result = await call(
      api.POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: account.id } }, body: { ...body, idempotency_key: attempt.current.key } }),
    );
    attempt.current = null;
    setAmount('');
    setReason('');
    onDone(result.account);
    return result;
  });
  const valid = value !== null && value > 0 && reason.trim() !== '';
  const form = (
    <Stack gap="xs">
      <SegmentedControl
        aria-label="Grant or deduct"
        value={direction}
        onChange={(v) => setDirection(v as typeof direction)}
        data={[
          { value: 'grant', label: 'Grant' },
          { value: 'deduct', label: 'Deduct' },
        ]}
      />
      <NumberInput label="Credits" min={0} value={amount} onChange={setAmount} error={Number.isNaN(value) ? `“${amount}” is not a number.` : undefined} required />
      <TextInput label="Reason" description="Recorded in the ledger." value={reason} onChange={(e) => setReason(e.currentTarget.value)} required />
    </Stack>
  );
  return (
    <Card withBorder component="form" aria-label="Grant or deduct credits" onSubmit={(e: FormEvent) => (e.preventDefault(), direction === 'grant' && valid && void adjust.run())}>
      <Title order={2} size="h4" mb="sm">
        Grant or deduct credits
      </Title>
      {form}
      <Group mt="sm">
        {direction === 'grant' ? (
          <Button type="submit" disabled={!valid} loading={adjust.pending}>
            Grant credits
          </Button>
        ) : (
          <ConfirmButton
            color="red"
            disabled={!valid}
            title="Deduct credits?"
            message={`Deduct ${amount} credits from ${account.name} (balance ${credits(account.balance)})?`}
            confirmLabel="Deduct"
            onConfirm={() => adjust.run()}
          >
            Deduct credits
          </ConfirmButton>
        )}
      </Group>
      {outcomeUnknown(adjust.error) ? (
        <>
          <ErrorAlert error={adjust.error} title="The outcome of the adjustment is unknown" />
          <Text size="sm" mt="xs" data-testid="adjust-outcome-unknown">
            It may have been applied. Submitting the same adjustment again is safe: it will not be applied twice. Change the amount or reason only for a
            different adjustment.
          </Text>
        </>
      ) : (
        <ErrorAlert error={adjust.error} title="The adjustment was refused" />
      )}
    </Card>
  );
}

/** The members of an account this form edits, in the API's terms (AdminAccountUpdate). */
function settingsOf(a: Account) {
  return {
    name: a.name,
    status: a.status,
    output_retention_days: a.output_retention_days ?? null,
    input_retention_days: a.input_retention_days ?? null,
    requests_per_minute: a.requests_per_minute,
    max_in_flight: a.max_in_flight,
  };
}

function EditAccount({ account, onSaved }: { account: Account; onSaved: (a: Account) => void }) {
  // The copy this form was filled from, what a save compares with: the page's copy also changes when
  // credits are granted, and that answer may carry another operator's changes this form does not show.
  const [loaded] = useState(account);
  const [name, setName] = useState(loaded.name);
  const [status, setStatus] = useState(loaded.status);
  const [outputDays, setOutputDays] = useState<number | string>(loaded.output_retention_days ?? '');
  const [inputDays, setInputDays] = useState<number | string>(loaded.input_retention_days ?? '');
  const [rpm, setRpm] = useState<LimitDraft>(limitDraft(loaded.requests_per_minute));
  const [inFlight, setInFlight] = useState<LimitDraft>(limitDraft(loaded.max_in_flight));
  const save = useAction(async () => {
    const body = changedFields(settingsOf(loaded), {
      name,
      status,
      output_retention_days: numberField(outputDays, 'Output retention (days)'),
      input_retention_days: numberField(inputDays, 'Input retention (days)'),
      requests_per_minute: limitValue(rpm, 'Requests per minute'),
      max_in_flight: limitValue(inFlight, 'Generations in flight'),
    });
    const updated = await call(api.PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: loaded.id } }, body }));
    onSaved(updated);
    return updated;
  });
  const submit = () => void save.run();
  const suspending = status === 'suspended' && loaded.status !== 'suspended';
  return (
    <Card withBorder component="form" aria-label="Edit the account" onSubmit={(e: FormEvent) => (e.preventDefault(), !suspending && submit())}>
      <Title order={2} size="h4" mb="sm">
        Settings and limits
      </Title>
      <Stack gap="xs">
        <TextInput label="Name" value={name} onChange={(e) => setName(e.currentTarget.value)} required />
        <Select label="Status" data={['active', 'suspended']} value={status} onChange={(v) => v && setStatus(v as typeof status)} allowDeselect={false} />
        <NumberInput label="Output retention (days)" description="Empty: the server's default." min={1} value={outputDays} onChange={setOutputDays} />
        <NumberInput label="Input retention (days)" description="Empty: the server's default." min={1} value={inputDays} onChange={setInputDays} />
        <LimitInput label="Requests per minute" value={rpm} onChange={setRpm} max={1_000_000} />
        <LimitInput label="Generations in flight" value={inFlight} onChange={setInFlight} max={100_000} />
      </Stack>
      <Group mt="sm">
        {suspending ? (
          <ConfirmButton color="red" title="Suspend the account?" message={`${account.name}'s keys stop working until it is active again.`} confirmLabel="Suspend" onConfirm={submit}>
            Save
          </ConfirmButton>
        ) : (
          <Button type="submit" loading={save.pending}>
            Save
          </Button>
        )}
      </Group>
      <ErrorAlert error={save.error} title="Could not save the account" />
    </Card>
  );
}
