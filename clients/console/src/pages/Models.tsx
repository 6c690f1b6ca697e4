/** Catalog models (kind filter) and one model: name, enabled, prices; a price change lists the quotes it invalidates. */
import { Alert, Button, Group, List, NumberInput, Select, Stack, Switch, Table, Text, TextInput, Title } from '@mantine/core';
import { useState, type FormEvent } from 'react';
import { api, call, type CatalogModel, type PriceRow } from '../api.ts';
import { Link } from '../router.tsx';
import { ConfirmButton, ErrorAlert, credits, requiredNumber, useAction, useLoad } from '../ui.tsx';
import { StatusBadge } from './Accounts.tsx';

export function ModelsPage() {
  const [kind, setKind] = useState<'' | 'image' | 'video'>('');
  const list = useLoad(() => call(api.GET('/admin/v1/models', { params: { query: { kind: kind || undefined } } })), [kind]);
  return (
    <Stack>
      <Title order={1} size="h2">
        Models &amp; prices
      </Title>
      <Select
        label="Kind"
        w={200}
        data={[
          { value: '', label: 'Images and videos' },
          { value: 'image', label: 'Images' },
          { value: 'video', label: 'Videos' },
        ]}
        value={kind}
        onChange={(v) => setKind((v ?? '') as typeof kind)}
        allowDeselect={false}
      />
      <ErrorAlert error={list.error} title="Could not list models" />
      <Table.ScrollContainer minWidth={700}>
        <Table striped aria-label="Catalog models">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Model</Table.Th>
              <Table.Th>Kind</Table.Th>
              <Table.Th>Display name</Table.Th>
              <Table.Th>State</Table.Th>
              <Table.Th>Prices</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.data.map((m) => (
              <Table.Tr key={m.id}>
                <Table.Td>
                  <Link to={`/models/${encodeURIComponent(m.id)}`}>
                    <code>{m.id}</code>
                  </Link>
                </Table.Td>
                <Table.Td>{m.kind}</Table.Td>
                <Table.Td>{m.display_name}</Table.Td>
                <Table.Td>
                  <StatusBadge status={m.enabled ? 'enabled' : 'disabled'} />
                </Table.Td>
                <Table.Td>{m.pricing.map((p) => `${rowLabel(p)}: ${credits(p.unit_price)}${p.mode === 'per_second' ? '/s' : ''}`).join(' · ')}</Table.Td>
              </Table.Tr>
            ))}
            {list.data && list.data.data.length === 0 && (
              <Table.Tr>
                <Table.Td colSpan={5}>No models match.</Table.Td>
              </Table.Tr>
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Text size="sm" c="dark.6">
        The catalog has no pages: every model is listed.
      </Text>
    </Stack>
  );
}

function rowLabel(p: PriceRow): string {
  return p.quality ? `${p.resolution} ${p.quality}` : p.resolution;
}
const rowKey = (p: PriceRow) => `${p.resolution}|${p.quality}`;

export interface PriceChange {
  row: string;
  before: PriceRow | undefined;
  after: PriceRow | undefined;
}

/**
 * The price rows whose quotes a change invalidates. A video quote token is bound to the key, the
 * model, the resolution, the billing mode and the unit price (server/services/quote-token.ts): a
 * changed unit price or mode, or a removed row, makes every token issued for that row stale.
 */
export function priceChanges(before: PriceRow[], after: PriceRow[]): PriceChange[] {
  const old = new Map(before.map((p) => [rowKey(p), p]));
  const now = new Map(after.map((p) => [rowKey(p), p]));
  const out: PriceChange[] = [];
  for (const [k, b] of old) {
    const a = now.get(k);
    if (!a || a.unit_price !== b.unit_price || a.mode !== b.mode) out.push({ row: rowLabel(b), before: b, after: a });
  }
  for (const [k, a] of now) if (!old.has(k)) out.push({ row: rowLabel(a), before: undefined, after: a });
  return out;
}

export function ModelDetailPage({ id }: { id: string }) {
  const model = useLoad(() => call(api.GET('/admin/v1/models/{model_id}', { params: { path: { model_id: id } } })), [id]);
  const [changes, setChanges] = useState<{ model: CatalogModel; changes: PriceChange[] } | null>(null);
  return (
    <Stack>
      <Text size="sm">
        <Link to="/models">Models</Link> / {id}
      </Text>
      <ErrorAlert error={model.error} title="Could not load the model" />
      {changes && <InvalidatedQuotes {...changes} onClose={() => setChanges(null)} />}
      {model.data && (
        <EditModel
          key={JSON.stringify(model.data)}
          model={model.data}
          onSaved={(before, after) => {
            model.setData(after);
            setChanges({ model: after, changes: priceChanges(before.pricing, after.pricing) });
          }}
        />
      )}
    </Stack>
  );
}

function InvalidatedQuotes({ model, changes, onClose }: { model: CatalogModel; changes: PriceChange[]; onClose: () => void }) {
  return (
    <Alert color="blue" variant="light" title="Saved" withCloseButton onClose={onClose} closeButtonLabel="Dismiss" role="status" data-testid="price-change">
      {changes.length === 0 ? (
        <Text size="sm">No price changed: quotes already issued stay valid.</Text>
      ) : model.kind === 'video' ? (
        <>
          <Text size="sm">
            Quotes invalidated: every quote token issued for <code>{model.id}</code> at these rows is now stale. A client that creates a video with one gets
            409 <code>quote_stale</code> with the new quote, and confirms it. Tasks already accepted keep the price they were quoted.
          </Text>
          <List size="sm" mt="xs">
            {changes.map((c) => (
              <List.Item key={c.row}>
                {c.row}: {c.before ? `${credits(c.before.unit_price)} ${c.before.mode}` : 'no price'} → {c.after ? `${credits(c.after.unit_price)} ${c.after.mode}` : 'removed'}
              </List.Item>
            ))}
          </List>
        </>
      ) : (
        <>
          <Text size="sm">Image models issue no quote tokens, so none is invalidated: new requests pay the new price, tasks already accepted keep theirs.</Text>
          <List size="sm" mt="xs">
            {changes.map((c) => (
              <List.Item key={c.row}>
                {c.row}: {c.before ? credits(c.before.unit_price) : 'no price'} → {c.after ? credits(c.after.unit_price) : 'removed'}
              </List.Item>
            ))}
          </List>
        </>
      )}
    </Alert>
  );
}

function EditModel({ model, onSaved }: { model: CatalogModel; onSaved: (before: CatalogModel, after: CatalogModel) => void }) {
  const [displayName, setDisplayName] = useState(model.display_name);
  const [enabled, setEnabled] = useState(model.enabled);
  const [prices, setPrices] = useState<(number | string)[]>(model.pricing.map((p) => p.unit_price));
  const save = useAction(async () => {
    // An emptied price is refused here, not sent as 0: that would make the row free.
    const pricing = model.pricing.map((p, i) => ({ ...p, unit_price: requiredNumber(prices[i]!, `Unit price for ${rowLabel(p)}`) }));
    const after = await call(
      api.PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: model.id } }, body: { display_name: displayName, enabled, pricing } }),
    );
    onSaved(model, after);
    return after;
  });
  const disabling = model.enabled && !enabled;
  const submit = () => void save.run();
  return (
    <form aria-label="Edit the model" onSubmit={(e: FormEvent) => (e.preventDefault(), !disabling && submit())}>
      <Stack>
        <Title order={1} size="h2">
          {model.display_name} <code style={{ fontSize: '0.6em' }}>{model.id}</code>
        </Title>
        <Group align="flex-end">
          <TextInput label="Display name" value={displayName} onChange={(e) => setDisplayName(e.currentTarget.value)} required w={320} />
          <Switch label="Enabled" checked={enabled} onChange={(e) => setEnabled(e.currentTarget.checked)} />
        </Group>
        <Title order={2} size="h3">
          Prices
        </Title>
        <Table aria-label="Prices" maw={640}>
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Resolution</Table.Th>
              <Table.Th>Quality</Table.Th>
              <Table.Th>Mode</Table.Th>
              <Table.Th>Unit price (credits)</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {model.pricing.map((p, i) => (
              <Table.Tr key={rowKey(p)}>
                <Table.Td>{p.resolution}</Table.Td>
                <Table.Td>{p.quality || '—'}</Table.Td>
                <Table.Td>{p.mode === 'per_second' ? 'per second' : 'per item'}</Table.Td>
                <Table.Td>
                  <NumberInput
                    aria-label={`Unit price for ${rowLabel(p)}`}
                    min={0}
                    decimalScale={6}
                    value={prices[i]}
                    onChange={(v) => setPrices((ps) => ps.map((x, j) => (j === i ? v : x)))}
                    w={160}
                  />
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
        <Group>
          {disabling ? (
            <ConfirmButton color="red" title="Disable this model?" message={`${model.id} is refused for new tasks until it is enabled again.`} confirmLabel="Disable and save" onConfirm={submit}>
              Save model
            </ConfirmButton>
          ) : (
            <Button type="submit" loading={save.pending}>
              Save model
            </Button>
          )}
        </Group>
        <ErrorAlert error={save.error} title="Could not save the model" />
      </Stack>
    </form>
  );
}
