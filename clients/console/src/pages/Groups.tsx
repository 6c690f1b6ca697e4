/** Groups (list, create, edit) and their members: routing settings, enable/disable and live health. */
import { Alert, Badge, Button, Card, Group, JsonInput, Modal, NumberInput, Select, Stack, Switch, Table, Text, TextInput, Textarea, Title, Tooltip } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { ApiFailure, PROVIDERS, api, call, type Member, type Provider, type Schemas } from '../api.ts';
import { changedFields } from '../changes.ts';
import { Link, navigate } from '../router.tsx';
import { ConfirmButton, ErrorAlert, Pager, numberField, requiredNumber, useAction, useCursorPages, useLoad, when } from '../ui.tsx';
import { DefinitionCommands } from './Models.tsx';

export function GroupsPage() {
  const pages = useCursorPages('');
  const list = useLoad(() => call(api.GET('/admin/v1/groups', { params: { query: { limit: 25, cursor: pages.cursor } } })), [pages.cursor]);
  const [name, setName] = useState('');
  const [description, setDescription] = useState('');
  const create = useAction(async () => call(api.POST('/admin/v1/groups', { body: { name, description: description || null } })));
  return (
    <Stack>
      <Title order={1} size="h2">
        Groups &amp; members
      </Title>
      <Card
        withBorder
        component="form"
        aria-label="Create a group"
        onSubmit={async (e: FormEvent) => {
          e.preventDefault();
          const g = await create.run();
          if (g) navigate(`/groups/${g.id}`);
        }}
      >
        <Title order={2} size="h4" mb="sm">
          Create a group
        </Title>
        <Group align="flex-end">
          <TextInput label="Group name" required value={name} onChange={(e) => setName(e.currentTarget.value)} />
          <TextInput label="Description" value={description} onChange={(e) => setDescription(e.currentTarget.value)} w={320} />
          <Button type="submit" loading={create.pending}>
            Create group
          </Button>
        </Group>
        <ErrorAlert error={create.error} title="Could not create the group" />
      </Card>
      <ErrorAlert error={list.error} title="Could not list groups" />
      <Table.ScrollContainer minWidth={600}>
        <Table striped aria-label="Groups">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Id</Table.Th>
              <Table.Th>Description</Table.Th>
              <Table.Th ta="right">Members</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((g) => (
              <Table.Tr key={g.id}>
                <Table.Td>
                  <Link to={`/groups/${g.id}`}>{g.name}</Link>
                </Table.Td>
                <Table.Td>
                  <code>{g.id}</code>
                </Table.Td>
                <Table.Td>{g.description ?? '—'}</Table.Td>
                <Table.Td ta="right">{g.member_count}</Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Pager pages={pages} nextCursor={list.data?.next_cursor} label="Groups" />
    </Stack>
  );
}

/** The models a member is left out for right now (a fault whose `until` has passed is tried again). */
export function activeModelFaults(m: Member, now = Date.now()): Member['health']['model_faults'] {
  return m.health.model_faults.filter((f) => f.until === null || Date.parse(f.until) > now);
}

/**
 * What a member's health says in a few words: `out` when it takes no new work at all, `trouble` when
 * an operator should look at it (out, a circuit not closed, or models it is left out for: clients
 * asking for those get 503 while the badge of a member that serves its other models would say healthy).
 */
export function memberCondition(m: Member, now = Date.now()): { label: string; color: string; out: boolean; trouble: boolean } {
  const h = m.health;
  const faults = activeModelFaults(m, now).length;
  const trouble = h.circuit !== 'closed' || faults > 0;
  if (!m.enabled) return { label: 'disabled', color: 'gray', out: true, trouble: true };
  if (h.credentials_rejected) return { label: 'credentials rejected', color: 'red', out: true, trouble: true };
  if (h.account_disabled) return { label: 'upstream account disabled', color: 'red', out: true, trouble: true };
  if (h.cooldown_until && Date.parse(h.cooldown_until) > now) return { label: `cooling down (${h.cooldown_reason || 'error'})`, color: 'orange', out: true, trouble: true };
  if (h.circuit === 'open') return { label: 'circuit open', color: 'red', out: true, trouble: true };
  if (h.circuit === 'half_open') return { label: 'circuit half-open', color: 'yellow', out: false, trouble };
  if (faults > 0) return { label: `out for ${faults} model${faults === 1 ? '' : 's'}`, color: 'orange', out: false, trouble };
  return { label: 'healthy', color: 'green', out: false, trouble: false };
}

/**
 * Whether "Put back in rotation" applies: an enabled member the pool keeps out (rejected credentials,
 * a disabled upstream account, a cooldown, a circuit not closed) or out for some models. A disabled
 * member is put back by Enable instead.
 */
export function canPutBack(m: Member, now = Date.now()): boolean {
  return m.enabled && memberCondition(m, now).trouble;
}

export function GroupDetailPage({ id }: { id: string }) {
  const group = useLoad(() => call(api.GET('/admin/v1/groups/{group_id}', { params: { path: { group_id: id } } })), [id]);
  // Live health: the members (and their health) are read again every 5 seconds.
  const members = useLoad(() => call(api.GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: id } } })), [id], 5000);
  const [editing, setEditing] = useState<Member | null>(null);
  const [added, setAdded] = useState<Member | null>(null);
  const [actionError, setActionError] = useState<unknown>(null);
  const [putBack, setPutBack] = useState<string | null>(null);
  const setEnabled = async (m: Member, enabled: boolean) => {
    setActionError(null);
    setPutBack(null);
    try {
      await call(api.PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: id, member_id: m.id } }, body: { enabled } }));
      await members.reload();
    } catch (err) {
      setActionError(err);
    }
  };
  // Offered once a member is disabled: the server refuses (409 member_in_use) while tasks still run on it.
  const deleteMember = async (m: Member) => {
    setActionError(null);
    setPutBack(null);
    try {
      await call(api.DELETE('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: id, member_id: m.id } } }));
      setPutBack(`Member “${m.name}” deleted.`);
      await members.reload();
    } catch (err) {
      setActionError(err);
    }
  };
  // The pool keeps a member out (rejected credentials, a disabled upstream account, model faults)
  // until an admin updates it, and any update clears that. An edit with nothing changed sends
  // nothing, so this sends the one field whose value it need not choose: `enabled` as it is now (read
  // again just before, so that a member someone disabled meanwhile stays disabled).
  const putBackInRotation = async (m: Member) => {
    setActionError(null);
    setPutBack(null);
    try {
      const now = (await call(api.GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: id } } }))).data.find((x) => x.id === m.id);
      if (!now) throw new Error(`The member ${m.name} is no longer in this group: reload the page.`);
      const after = await call(api.PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: id, member_id: m.id } }, body: { enabled: now.enabled } }));
      setPutBack(
        after.enabled
          ? `Member “${after.name}” put back in rotation: it takes new work again. If the upstream still refuses it, its next call takes it out again.`
          : `Member “${after.name}” is disabled (since changed by someone else): its faults were cleared, and it takes new work once it is enabled.`,
      );
      await members.reload();
    } catch (err) {
      setActionError(err);
    }
  };
  return (
    <Stack>
      <Text size="sm">
        <Link to="/groups">Groups</Link> / {id}
      </Text>
      <ErrorAlert error={group.error} title="Could not load the group" />
      {group.data && (
        <>
          <Title order={1} size="h2">
            Group {group.data.name}
          </Title>
          <EditGroup key={JSON.stringify(group.data)} id={id} name={group.data.name} description={group.data.description} onSaved={() => void group.reload()} />
        </>
      )}
      <Group justify="space-between">
        <Title order={2} size="h3">
          Members
        </Title>
        <Text size="xs" c="dark.6" aria-live="polite">
          Health refreshed every 5 s{members.loadedAt ? ` · last at ${members.loadedAt.toLocaleTimeString('en-GB')}` : ''}
        </Text>
      </Group>
      <ErrorAlert error={members.error} title="Could not list members" />
      <ErrorAlert error={actionError} title="The member could not be changed" />
      {putBack && (
        <Text size="sm" role="status" data-testid="member-put-back">
          {putBack}
        </Text>
      )}
      <Table.ScrollContainer minWidth={1100}>
        <Table striped aria-label="Members">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Member</Table.Th>
              <Table.Th>Provider</Table.Th>
              <Table.Th ta="right">Priority</Table.Th>
              <Table.Th ta="right">Weight</Table.Th>
              <Table.Th ta="right">Concurrency</Table.Th>
              <Table.Th>Models</Table.Th>
              <Table.Th>Health</Table.Th>
              <Table.Th ta="right">In flight</Table.Th>
              <Table.Th>Cooldown until</Table.Th>
              <Table.Th>Last error</Table.Th>
              <Table.Th>Enabled</Table.Th>
              <Table.Th>Edit</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {members.data?.data.map((m) => {
              const c = memberCondition(m);
              return (
                <Table.Tr key={m.id}>
                  <Table.Td>
                    {m.name}
                    <br />
                    <code style={{ fontSize: 11 }}>{m.id}</code>
                  </Table.Td>
                  <Table.Td>{m.provider}</Table.Td>
                  <Table.Td ta="right">{m.priority}</Table.Td>
                  <Table.Td ta="right">{m.weight}</Table.Td>
                  <Table.Td ta="right">{m.concurrency_limit ?? 'unlimited'}</Table.Td>
                  <Table.Td>
                    {m.models.join(', ')}
                    {Object.keys(m.model_map).length > 0 && (
                      <Text size="xs" c="dark.6">
                        map: {Object.entries(m.model_map as Record<string, unknown>).map(([k, v]) => `${k} → ${String(v)}`).join(', ')}
                      </Text>
                    )}
                  </Table.Td>
                  <Table.Td>
                    {/* Its whole label, never "HE…": the column is as wide as the longest one. */}
                    <Badge variant="light" color={c.color} c="dark.9" style={{ overflow: 'visible' }} styles={{ label: { overflow: 'visible', textOverflow: 'clip' } }}>
                      {c.label}
                    </Badge>
                    <ModelFaults member={m} />
                    {m.health.account_disabled && <Text size="xs">{m.health.account_disabled.reason}</Text>}
                    {canPutBack(m) && (
                      <Button size="xs" mt={4} onClick={() => void putBackInRotation(m)} aria-label={`Put back in rotation: ${m.name}`}>
                        Put back in rotation
                      </Button>
                    )}
                  </Table.Td>
                  <Table.Td ta="right">{m.health.in_flight}</Table.Td>
                  <Table.Td>{m.health.cooldown_until ? when(m.health.cooldown_until) : '—'}</Table.Td>
                  <Table.Td maw={260}>
                    {m.health.last_error ? (
                      <Tooltip label={when(m.health.last_error_at)}>
                        <Text size="xs">{m.health.last_error}</Text>
                      </Tooltip>
                    ) : (
                      '—'
                    )}
                  </Table.Td>
                  <Table.Td>
                    {m.enabled ? (
                      <ConfirmButton
                        size="xs"
                        color="red"
                        variant="outline"
                        title="Disable this member?"
                        message={`${m.name} takes no new tasks until it is enabled again; tasks it runs now finish.`}
                        confirmLabel="Disable member"
                        onConfirm={() => setEnabled(m, false)}
                        aria-label={`Disable member ${m.name}`}
                      >
                        Disable
                      </ConfirmButton>
                    ) : (
                      <Group gap={4} wrap="nowrap">
                        <Button size="xs" variant="default" onClick={() => void setEnabled(m, true)} aria-label={`Enable member ${m.name}`}>
                          Enable
                        </Button>
                        <ConfirmButton
                          size="xs"
                          color="red"
                          variant="outline"
                          title="Delete this member?"
                          message={`${m.name} and its stored credentials are removed for good; tasks it ran keep its id. It cannot be deleted while tasks still run on it.`}
                          confirmLabel="Delete member"
                          onConfirm={() => deleteMember(m)}
                          aria-label={`Delete member ${m.name}`}
                        >
                          Delete
                        </ConfirmButton>
                      </Group>
                    )}
                  </Table.Td>
                  <Table.Td>
                    <Button size="xs" variant="default" onClick={() => setEditing(m)} aria-label={`Edit member ${m.name}`}>
                      Edit
                    </Button>
                  </Table.Td>
                </Table.Tr>
              );
            })}
            {members.data && members.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={12}>This group has no members yet.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Modal opened={editing !== null} onClose={() => setEditing(null)} title={editing ? `Edit member ${editing.name}` : ''} closeButtonProps={{ 'aria-label': 'Close' }} size="lg">
        {editing && canPutBack(editing) && (
          <PutBackNotice
            member={editing}
            onPutBack={() => {
              const m = editing;
              setEditing(null);
              void putBackInRotation(m);
            }}
          />
        )}
        {editing && (
          <MemberForm
            groupId={id}
            member={editing}
            onSaved={() => {
              setEditing(null);
              void members.reload();
            }}
          />
        )}
      </Modal>
      <Card withBorder>
        <Title order={2} size="h4" mb="sm">
          Add a member
        </Title>
        {/* A new form after each member added: the credentials typed do not stay in the page. */}
        <MemberForm
          key={added?.id ?? 'none-yet'}
          groupId={id}
          onSaved={(m) => {
            setAdded(m);
            void members.reload();
          }}
        />
        {added && (
          <Text size="sm" role="status" mt="xs">
            Member “{added.name}” added.
          </Text>
        )}
      </Card>
    </Stack>
  );
}

/** In the Edit dialog of a member the pool keeps out: an edit with nothing changed sends nothing, so say how to put it back. */
function PutBackNotice({ member, onPutBack }: { member: Member; onPutBack: () => void }) {
  const c = memberCondition(member);
  return (
    <Alert
      color="orange"
      variant="light"
      // The title in the text's colour: Mantine's orange on its light orange is below AA contrast.
      title={
        <Text span fw={700} size="sm" c="dark.9">
          {c.out ? 'Out of rotation' : 'Needs attention'}: {c.label}
        </Text>
      }
      mb="sm"
      data-testid="member-out-notice"
    >
      <Text size="sm">
        The pool keeps this member out (after a cooldown, an open circuit or a model fault with an end, until that ends; otherwise until an admin updates it).
        Any update of the member clears that: saving a change below puts it back; with nothing to change, put it back as it is.
      </Text>
      <Button size="xs" mt="xs" onClick={onPutBack} aria-label={`Put back in rotation: ${member.name}`}>
        Put back in rotation
      </Button>
    </Alert>
  );
}

/** The models the member is left out for, with what the upstream said and until when. */
export function ModelFaults({ member }: { member: Member }) {
  return (
    <>
      {activeModelFaults(member).map((f) => (
        <Text size="xs" key={f.model}>
          {f.model}: {f.kind} — {f.reason} ({f.until ? `until ${when(f.until)}` : 'until an admin updates the member'})
        </Text>
      ))}
    </>
  );
}

function EditGroup({ id, name: initialName, description: initialDescription, onSaved }: { id: string; name: string; description: string | null; onSaved: () => void }) {
  const [name, setName] = useState(initialName);
  const [description, setDescription] = useState(initialDescription ?? '');
  const save = useAction(async () => {
    const body = changedFields({ name: initialName, description: initialDescription }, { name, description: description || null });
    await call(api.PATCH('/admin/v1/groups/{group_id}', { params: { path: { group_id: id } }, body }));
    onSaved();
  });
  return (
    <form aria-label="Edit the group" onSubmit={(e) => (e.preventDefault(), void save.run())}>
      <Group align="flex-end">
        <TextInput label="Group name" value={name} onChange={(e) => setName(e.currentTarget.value)} required />
        <TextInput label="Description" value={description} onChange={(e) => setDescription(e.currentTarget.value)} w={320} />
        <Button type="submit" variant="default" loading={save.pending}>
          Save group
        </Button>
      </Group>
      <ErrorAlert error={save.error} title="Could not save the group" />
    </form>
  );
}

type MemberUpdate = Schemas['AdminGroupMemberUpdate'];

/** The members of a member this form edits, in the API's terms (AdminGroupMemberUpdate). */
function settingsOf(m: Member) {
  return {
    name: m.name,
    base_url: m.base_url ?? null,
    models: m.models,
    model_map: m.model_map,
    priority: m.priority,
    weight: m.weight,
    concurrency_limit: m.concurrency_limit ?? null,
    enabled: m.enabled,
  };
}

/** A JSON object typed into the form, or null when it is not one. */
function jsonObject(text: string): Record<string, string> | null {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Record<string, string>) : null;
  } catch {
    return null;
  }
}

/**
 * Creates a member (no `member`) or edits one; credentials are write-only (left empty: unchanged).
 * An edit sends only what differs from the member as it was when the form opened.
 */
function MemberForm({ groupId, member, onSaved }: { groupId: string; member?: Member; onSaved: (m: Member) => void }) {
  const [name, setName] = useState(member?.name ?? '');
  const [provider, setProvider] = useState<Provider>(member?.provider ?? 'local');
  const [baseUrl, setBaseUrl] = useState(member?.base_url ?? '');
  const [models, setModels] = useState((member?.models ?? []).join(', '));
  const [modelMap, setModelMap] = useState(member ? JSON.stringify(member.model_map, null, 2) : '{}');
  const [credentials, setCredentials] = useState('');
  const [showCredentials, setShowCredentials] = useState(false);
  const [priority, setPriority] = useState<number | string>(member?.priority ?? 0);
  const [weight, setWeight] = useState<number | string>(member?.weight ?? 1);
  const [concurrency, setConcurrency] = useState<number | string>(member?.concurrency_limit ?? '');
  const [enabled, setEnabled] = useState(member?.enabled ?? true);
  const [formError, setFormError] = useState<string | null>(null);
  const save = useAction(async () => {
    // Fixed messages: JSON.parse's own quotes the text it stopped at, which would put part of the
    // upstream key in the page.
    const map = jsonObject(modelMap.trim() || '{}');
    if (!map) throw new Error('The model map must be a JSON object, e.g. {"catalog-id": "upstream-id"}.');
    const creds = credentials.trim() ? jsonObject(credentials) : undefined;
    if (creds === null) throw new Error('The credentials must be a JSON object, e.g. {"api_key": "…"}.');
    const settings = {
      name,
      base_url: baseUrl.trim() || null,
      models: models.split(',').map((s) => s.trim()).filter(Boolean),
      model_map: map,
      priority: requiredNumber(priority, 'Priority'),
      weight: requiredNumber(weight, 'Weight'),
      concurrency_limit: numberField(concurrency, 'Concurrency limit'),
      enabled,
    };
    const saved = member
      ? await call(
          api.PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
            params: { path: { group_id: groupId, member_id: member.id } },
            // Credentials are never loaded: typed in, they are a change.
            body: changedFields<MemberUpdate>({ ...settingsOf(member), credentials: undefined }, { ...settings, credentials: creds }),
          }),
        )
      : await call(api.POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } }, body: { ...settings, provider, credentials: creds } }));
    onSaved(saved);
  });
  return (
    <form
      aria-label={member ? 'Edit the member' : 'Add a member'}
      onSubmit={(e) => {
        e.preventDefault();
        setFormError(null);
        void save.run();
      }}
    >
      <Stack gap="xs">
        <Group grow align="flex-start">
          <TextInput label="Member name" required value={name} onChange={(e) => setName(e.currentTarget.value)} />
          <Select label="Provider" data={PROVIDERS} value={provider} onChange={(v) => v && setProvider(v as Provider)} disabled={member !== undefined} allowDeselect={false} />
        </Group>
        <TextInput label="Base URL" description="Empty: the provider's default." value={baseUrl} onChange={(e) => setBaseUrl(e.currentTarget.value)} />
        <TextInput label="Models" description="Catalog model ids, comma-separated." value={models} onChange={(e) => setModels(e.currentTarget.value)} required />
        <JsonInput label="Model map" description="Catalog id → upstream id, as JSON." value={modelMap} onChange={setModelMap} autosize minRows={2} />
        {/* A textarea, so that a multi-line JSON paste keeps working; masked while it has no focus, so
            that the key is on screen only while it is being typed. No spell check: some browsers send
            what it checks to a server. */}
        <Textarea
          label="Credentials"
          description={member ? (member.has_credentials ? 'Stored (never shown). Empty: unchanged.' : 'None stored. JSON, e.g. {"api_key": "…"}.') : 'JSON, e.g. {"api_key": "…"}; never shown again.'}
          value={showCredentials ? credentials : credentials.replace(/[^\n]/g, '•')}
          onChange={(e) => setCredentials(e.currentTarget.value)}
          onFocus={() => setShowCredentials(true)}
          onBlur={() => setShowCredentials(false)}
          spellCheck={false}
          autoComplete="off"
          autosize
          minRows={1}
        />
        <Group grow>
          <NumberInput label="Priority" value={priority} onChange={setPriority} />
          <NumberInput label="Weight" min={1} value={weight} onChange={setWeight} />
          <NumberInput label="Concurrency limit" description="Empty: unlimited." min={1} value={concurrency} onChange={setConcurrency} />
        </Group>
        <Switch label="Enabled" checked={enabled} onChange={(e) => setEnabled(e.currentTarget.checked)} />
        <Group>
          <Button type="submit" loading={save.pending}>
            {member ? 'Save member' : 'Add member'}
          </Button>
        </Group>
        {formError && <Text c="red.9">{formError}</Text>}
        <ErrorAlert error={save.error} title={member ? 'Could not save the member' : 'Could not add the member'} />
        {save.error instanceof ApiFailure && save.error.code === 'model_not_found' && (
          <Text size="sm" data-testid="unknown-model-hint">
            A member serves catalog models only: add the model to the catalog first, under{' '}
            <Link to="/models#create-model">Models &amp; prices → Create a model</Link>. <DefinitionCommands provider={member?.provider ?? provider} />
          </Text>
        )}
      </Stack>
    </form>
  );
}
