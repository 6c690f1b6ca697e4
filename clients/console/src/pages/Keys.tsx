/** API keys: list (by account, pages), create with group and quota (the full key shown once), rename a key or move it to another group, edit its limits, revoke. */
import { Alert, Button, Card, CopyButton, Group, Modal, NumberInput, Select, Stack, Table, Text, TextInput, Title } from '@mantine/core';
import { useMemo, useState, type FormEvent } from 'react';
import { api, call, type ApiKey, type ApiKeyCreated, type Group as BackendGroup } from '../api.ts';
import { changedFields } from '../changes.ts';
import { Link, useLocation } from '../router.tsx';
import { ConfirmButton, ErrorAlert, LimitInput, Pager, credits, limitDraft, limitText, limitValue, numberField, useAction, useCursorPages, useLoad, when, type LimitDraft } from '../ui.tsx';
import { StatusBadge } from './Accounts.tsx';

export function KeysPage() {
  const { search } = useLocation();
  const [accountDraft, setAccountDraft] = useState(search.get('account_id') ?? '');
  const [accountId, setAccountId] = useState(accountDraft);
  const pages = useCursorPages(accountId);
  const list = useLoad(
    () => call(api.GET('/admin/v1/api-keys', { params: { query: { limit: 25, cursor: pages.cursor, account_id: accountId || undefined } } })),
    [accountId, pages.cursor],
  );
  const [created, setCreated] = useState<ApiKeyCreated | null>(null);
  const [actionError, setActionError] = useState<unknown>(null);
  const [editing, setEditing] = useState<ApiKey | null>(null);
  const [renaming, setRenaming] = useState<ApiKey | null>(null);
  // Every group, for the group column's names and the "move to group" choice.
  const groups = useLoad(allGroups, []);
  const groupNames = useMemo(() => new Map((groups.data ?? []).map((g) => [g.id, g.name])), [groups.data]);
  const setActive = async (k: ApiKey, is_active: boolean) => {
    setActionError(null);
    try {
      await call(api.PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: k.id } }, body: { is_active } }));
      await list.reload();
    } catch (err) {
      setActionError(err);
    }
  };
  return (
    <Stack>
      <Title order={1} size="h2">
        API keys
      </Title>
      <CreateKey
        defaultAccount={accountId}
        groups={groups}
        onCreated={(k) => {
          setCreated(k);
          void list.reload();
        }}
      />
      {created && (
        <Alert color="green" variant="light" title={`Key “${created.name}” created`} role="status" withCloseButton onClose={() => setCreated(null)} closeButtonLabel="Dismiss the new key">
          <Text size="sm" mb="xs">
            Copy it now: this is the only time the full key is shown.
          </Text>
          <Group gap="xs" wrap="nowrap">
            <Text component="code" data-testid="new-api-key" style={{ wordBreak: 'break-all' }}>
              {created.key}
            </Text>
            <CopyButton value={created.key}>{({ copied, copy }) => <Button size="xs" variant="default" onClick={copy}>{copied ? 'Copied' : 'Copy key'}</Button>}</CopyButton>
          </Group>
        </Alert>
      )}
      <form
        aria-label="API key filters"
        onSubmit={(e) => {
          e.preventDefault();
          setAccountId(accountDraft.trim());
        }}
      >
        <Group align="flex-end">
          <TextInput label="Account id" placeholder="Any account" value={accountDraft} onChange={(e) => setAccountDraft(e.currentTarget.value)} />
          <Button type="submit" variant="default">
            Apply filter
          </Button>
        </Group>
      </form>
      <ErrorAlert error={list.error} title="Could not list API keys" />
      <ErrorAlert error={actionError} title="The key could not be changed" />
      <Table.ScrollContainer minWidth={1000}>
        <Table striped aria-label="API keys">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Key</Table.Th>
              <Table.Th>Account</Table.Th>
              <Table.Th>Group</Table.Th>
              <Table.Th ta="right">Quota</Table.Th>
              <Table.Th ta="right">Used</Table.Th>
              <Table.Th>Limits (per minute / in flight)</Table.Th>
              <Table.Th>Last used</Table.Th>
              <Table.Th>State</Table.Th>
              <Table.Th>Actions</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((k) => (
              <Table.Tr key={k.id}>
                <Table.Td>{k.name}</Table.Td>
                <Table.Td>
                  <code>
                    {k.key_prefix}…{k.last_four}
                  </code>
                </Table.Td>
                <Table.Td maw={150}>
                  <Link to={`/accounts/${k.account_id}`}>
                    <code style={{ overflowWrap: 'anywhere' }}>{k.account_id}</code>
                  </Link>
                </Table.Td>
                <Table.Td maw={150}>
                  <Link to={`/groups/${k.group_id}`}>
                    {groupNames.has(k.group_id) && (
                      <>
                        {groupNames.get(k.group_id)}
                        <br />
                      </>
                    )}
                    <code style={{ overflowWrap: 'anywhere' }}>{k.group_id}</code>
                  </Link>
                </Table.Td>
                <Table.Td ta="right">{k.unlimited ? 'unlimited' : credits(k.credit_limit)}</Table.Td>
                <Table.Td ta="right">{credits(k.credits_used)}</Table.Td>
                <Table.Td>
                  {limitText(k.requests_per_minute)} / {limitText(k.max_in_flight)}
                </Table.Td>
                <Table.Td>{k.last_used_at ? when(k.last_used_at) : 'never'}</Table.Td>
                <Table.Td miw={96}>
                  <StatusBadge status={k.is_active ? 'active' : 'revoked'} />
                </Table.Td>
                <Table.Td>
                  <Stack gap={4} align="flex-start">
                    <Button size="xs" variant="default" onClick={() => setRenaming(k)} aria-label={`Rename or move key ${k.name}`}>
                      Rename or move
                    </Button>
                    <Button size="xs" variant="default" onClick={() => setEditing(k)} aria-label={`Edit limits of key ${k.name}`}>
                      Edit limits
                    </Button>
                    {k.is_active ? (
                      <ConfirmButton
                        size="xs"
                        color="red"
                        variant="outline"
                        title="Revoke this key?"
                        message={`Requests with ${k.key_prefix}…${k.last_four} (“${k.name}”) are refused from now on.`}
                        confirmLabel="Revoke key"
                        onConfirm={() => setActive(k, false)}
                        aria-label={`Revoke key ${k.name}`}
                      >
                        Revoke
                      </ConfirmButton>
                    ) : (
                      <Button size="xs" variant="default" onClick={() => void setActive(k, true)} aria-label={`Reactivate key ${k.name}`}>
                        Reactivate
                      </Button>
                    )}
                  </Stack>
                </Table.Td>
              </Table.Tr>
            ))}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={10}>No API keys match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="API keys" />
      <Modal opened={editing !== null} onClose={() => setEditing(null)} title={editing ? `Limits of key ${editing.name}` : ''} closeButtonProps={{ 'aria-label': 'Close' }} centered>
        {editing && (
          <EditKeyLimits
            apiKey={editing}
            onSaved={() => {
              setEditing(null);
              void list.reload();
            }}
          />
        )}
      </Modal>
      <Modal opened={renaming !== null} onClose={() => setRenaming(null)} title={renaming ? `Key ${renaming.name}` : ''} closeButtonProps={{ 'aria-label': 'Close' }} centered>
        {renaming && (
          <RenameOrMoveKey
            apiKey={renaming}
            groups={groups}
            onSaved={() => {
              setRenaming(null);
              void list.reload();
            }}
          />
        )}
      </Modal>
    </Stack>
  );
}

type Groups = ReturnType<typeof useLoad<BackendGroup[]>>;

/** A group choice among every group (searchable: there may be hundreds). */
function groupOptions(groups: Groups, current?: string): { value: string; label: string }[] {
  const options = (groups.data ?? []).map((g) => ({ value: g.id, label: g.name }));
  // A group created after the list was read is still shown by its id rather than as an empty choice.
  if (current && !options.some((o) => o.value === current)) options.unshift({ value: current, label: current });
  return options;
}

/** A key's name and group (PATCH /admin/v1/api-keys/{key_id}); the account of a key cannot change. */
function RenameOrMoveKey({ apiKey, groups, onSaved }: { apiKey: ApiKey; groups: Groups; onSaved: () => void }) {
  const [name, setName] = useState(apiKey.name);
  const [groupId, setGroupId] = useState<string>(apiKey.group_id);
  const save = useAction(async () => {
    const body = changedFields({ name: apiKey.name, group_id: apiKey.group_id }, { name, group_id: groupId });
    const updated = await call(api.PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: apiKey.id } }, body }));
    onSaved();
    return updated;
  });
  const moving = groupId !== apiKey.group_id;
  return (
    <form aria-label={`Rename or move key ${apiKey.name}`} onSubmit={(e: FormEvent) => (e.preventDefault(), void save.run())}>
      <Stack gap="sm">
        <Text size="sm">
          <code>
            {apiKey.key_prefix}…{apiKey.last_four}
          </code>{' '}
          of account <code>{apiKey.account_id}</code>. The key itself does not change.
        </Text>
        <TextInput label="Key name" required value={name} onChange={(e) => setName(e.currentTarget.value)} />
        <Select
          label="Group"
          description="The backend group whose members serve this key's requests."
          data={groupOptions(groups, apiKey.group_id)}
          value={groupId}
          onChange={(v) => v && setGroupId(v)}
          searchable
          nothingFoundMessage="No group has that name"
          allowDeselect={false}
        />
        {moving && (
          <Text size="sm" fw={600} data-testid="key-move-notice">
            New generations of this key go to the new group's members, and only the models they serve are offered; tasks running now keep their member.
          </Text>
        )}
        <Group justify="flex-end">
          <Button type="submit" loading={save.pending}>
            Save key
          </Button>
        </Group>
        <ErrorAlert error={groups.error} title="Could not list groups" />
        <ErrorAlert error={save.error} title="Could not save the key" />
      </Stack>
    </form>
  );
}

/** A key's credit quota, requests per minute and generations in flight (PATCH /admin/v1/api-keys/{key_id}). */
function EditKeyLimits({ apiKey, onSaved }: { apiKey: ApiKey; onSaved: () => void }) {
  const [quota, setQuota] = useState<number | string>(apiKey.unlimited ? '' : (apiKey.credit_limit ?? ''));
  const [rpm, setRpm] = useState<LimitDraft>(limitDraft(apiKey.requests_per_minute));
  const [inFlight, setInFlight] = useState<LimitDraft>(limitDraft(apiKey.max_in_flight));
  const save = useAction(async () => {
    const body = changedFields(
      { credit_limit: apiKey.credit_limit, requests_per_minute: apiKey.requests_per_minute, max_in_flight: apiKey.max_in_flight },
      {
        credit_limit: numberField(quota, 'Credit quota'),
        requests_per_minute: limitValue(rpm, 'Requests per minute'),
        max_in_flight: limitValue(inFlight, 'Generations in flight'),
      },
    );
    const updated = await call(api.PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: apiKey.id } }, body }));
    onSaved();
    return updated;
  });
  return (
    <form aria-label={`Edit the limits of key ${apiKey.name}`} onSubmit={(e: FormEvent) => (e.preventDefault(), void save.run())}>
      <Stack gap="sm">
        <Text size="sm">
          <code>
            {apiKey.key_prefix}…{apiKey.last_four}
          </code>{' '}
          of account <code>{apiKey.account_id}</code>. New limits apply to the next requests.
        </Text>
        <NumberInput label="Credit quota" description={`Empty: unlimited. Used so far: ${credits(apiKey.credits_used)}.`} min={0} value={quota} onChange={setQuota} />
        <LimitInput label="Requests per minute" value={rpm} onChange={setRpm} max={1_000_000} />
        <LimitInput label="Generations in flight" value={inFlight} onChange={setInFlight} max={100_000} />
        <Group justify="flex-end">
          <Button type="submit" loading={save.pending}>
            Save limits
          </Button>
        </Group>
        <ErrorAlert error={save.error} title="Could not save the key's limits" />
      </Stack>
    </form>
  );
}

/** Every group, page by page (a page holds at most 100). */
async function allGroups(): Promise<BackendGroup[]> {
  const out: BackendGroup[] = [];
  let cursor: string | undefined;
  do {
    const page = await call(api.GET('/admin/v1/groups', { params: { query: { limit: 100, cursor } } }));
    out.push(...page.data);
    cursor = page.next_cursor ?? undefined;
  } while (cursor);
  return out;
}

function CreateKey({ defaultAccount, groups, onCreated }: { defaultAccount: string; groups: Groups; onCreated: (k: ApiKeyCreated) => void }) {
  const [accountId, setAccountId] = useState(defaultAccount);
  const [name, setName] = useState('');
  const [groupId, setGroupId] = useState<string | null>(null);
  const [limit, setLimit] = useState<number | string>('');
  const [rpm, setRpm] = useState<LimitDraft>(limitDraft('default'));
  const [inFlight, setInFlight] = useState<LimitDraft>(limitDraft('default'));
  const create = useAction(async () =>
    call(
      api.POST('/admin/v1/api-keys', {
        body: {
          account_id: accountId.trim(),
          name,
          group_id: groupId ?? undefined,
          credit_limit: numberField(limit, 'Credit quota'),
          requests_per_minute: limitValue(rpm, 'Requests per minute'),
          max_in_flight: limitValue(inFlight, 'Generations in flight'),
        },
      }),
    ),
  );
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    const k = await create.run();
    if (k) {
      setName('');
      onCreated(k);
    }
  };
  return (
    <Card withBorder component="form" onSubmit={submit} aria-label="Create an API key">
      <Title order={2} size="h4" mb="sm">
        Create an API key
      </Title>
      <Group align="flex-end" wrap="wrap">
        <TextInput label="Account id" required value={accountId} onChange={(e) => setAccountId(e.currentTarget.value)} w={280} />
        <TextInput label="Key name" required value={name} onChange={(e) => setName(e.currentTarget.value)} />
        <Select
          label="Group"
          placeholder="The default group"
          data={(groups.data ?? []).map((g) => ({ value: g.id, label: g.name }))}
          value={groupId}
          onChange={setGroupId}
          searchable
          nothingFoundMessage="No group has that name"
          clearable
          w={220}
        />
        <NumberInput label="Credit quota" description="Empty: unlimited." min={0} value={limit} onChange={setLimit} w={160} />
        <LimitInput label="Requests per minute" value={rpm} onChange={setRpm} max={1_000_000} />
        <LimitInput label="Generations in flight" value={inFlight} onChange={setInFlight} max={100_000} />
        <Button type="submit" loading={create.pending}>
          Create key
        </Button>
      </Group>
      <ErrorAlert error={groups.error} title="Could not list groups" />
      <ErrorAlert error={create.error} title="Could not create the key" />
    </Card>
  );
}
