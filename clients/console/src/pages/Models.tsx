/**
 * Catalog models (kind filter), a new model from its POST body, and one model: name, enabled, prices,
 * what it accepts (its image or video capabilities, with the settings an operator may change) and its
 * aggregator mappings; a price change lists the quotes it invalidates.
 */
import { Alert, Button, Card, Group, JsonInput, List, NumberInput, Select, Stack, Switch, Table, Text, TextInput, Title } from '@mantine/core';
import { useEffect, useRef, useState, type FormEvent, type ReactNode } from 'react';
import { ApiFailure, api, call, type CatalogModel, type PriceRow, type Provider, type Schemas } from '../api.ts';
import { changedFields } from '../changes.ts';
import { Link, navigate } from '../router.tsx';
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
      <CreateModel />
    </Stack>
  );
}

/** Where the body of a shipped catalog definition comes from (the admin CLI: the admin API has no list of them). */
export function DefinitionCommands({ provider }: { provider?: Provider }) {
  const known = provider !== undefined && provider !== 'local'; // no shipped definition runs on the local provider
  const p = known ? provider : '<provider>';
  return (
    <>
      For a model the server ships a definition of, <code>npm run admin -- models definitions --provider {p}</code> lists them and{' '}
      <code>npm run admin -- models definitions {p}/&lt;model&gt; --json</code> prints its body{known ? '' : <> (e.g. <code>openai/gpt-image-1.5</code>)</>}.
    </>
  );
}

const CREATE_PLACEHOLDER = `{
  "id": "gpt-image-1.5",
  "kind": "image",
  "display_name": "GPT Image 1.5",
  "image": { "resolutions": ["1K"], "aspect_ratios": ["1:1"], "output_formats": ["png"], "supports_quality": false, "supports_transparent_background": false, "max_n": 1 },
  "pricing": [{ "resolution": "1K", "quality": null, "mode": "per_item", "unit_price": 0.05 }]
}`;

/**
 * Adds a catalog model from the body of POST /admin/v1/models, as JSON (the capabilities differ by
 * provider and kind too much for a form): the server checks it and names the field at fault.
 */
function CreateModel() {
  const [body, setBody] = useState('');
  const field = useRef<HTMLTextAreaElement>(null);
  // The member form's "unknown model" hint links here.
  useEffect(() => {
    if (window.location.hash !== '#create-model') return;
    document.getElementById('create-model')?.scrollIntoView();
    field.current?.focus();
  }, []);
  const create = useAction(async () => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch (err) {
      throw new Error(`The body is not valid JSON: ${(err as Error).message}`);
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error('The body must be a JSON object: the model, as POST /admin/v1/models takes it.');
    let param: string | null = null;
    const created = await call(
      api.POST('/admin/v1/models', { body: parsed as Schemas['AdminCatalogModelCreate'] }).then((r) => {
        param = (r.error as { error?: { param?: string | null } } | undefined)?.error?.param ?? null;
        return r;
      }),
    ).catch((err: unknown) => {
      // The field at fault (`pricing`, `image.resolutions`) is not in every message: say it.
      if (err instanceof ApiFailure && param && !err.message.includes(param)) throw new ApiFailure(err.status, err.code, `${err.message} (field: ${param})`, err.requestId);
      throw err;
    });
    navigate(`/models/${encodeURIComponent(created.id)}`);
    return created;
  });
  return (
    <Card withBorder component="form" id="create-model" aria-label="Create a model" onSubmit={(e: FormEvent) => (e.preventDefault(), void create.run())}>
      <Title order={2} size="h4" mb="xs">
        Create a model
      </Title>
      <Text size="sm" mb="xs">
        The body of <code>POST /admin/v1/models</code>, as JSON: id, kind, display name, the image or video capabilities and one price row per
        resolution (and quality tier). <DefinitionCommands /> Paste it here, and change its id, display name or prices first if you like. The
        model is offered to keys once a member of their group lists it.
      </Text>
      <JsonInput
        ref={field}
        label="Model (JSON)"
        placeholder={CREATE_PLACEHOLDER}
        value={body}
        onChange={setBody}
        autosize
        minRows={6}
        maxRows={30}
        spellCheck={false}
        required
      />
      <Group mt="sm">
        <Button type="submit" loading={create.pending}>
          Create model
        </Button>
      </Group>
      <ErrorAlert error={create.error} title="Could not create the model" />
    </Card>
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
          onSaved={(after, changes) => {
            model.setData(after);
            setChanges({ model: after, changes });
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

function EditModel({ model, onSaved }: { model: CatalogModel; onSaved: (after: CatalogModel, changes: PriceChange[]) => void }) {
  const [displayName, setDisplayName] = useState(model.display_name);
  const [enabled, setEnabled] = useState(model.enabled);
  const [prices, setPrices] = useState<(number | string)[]>(model.pricing.map((p) => p.unit_price));
  const [settings, setSettings] = useState<ModelSettings>(() => settingsOf(model));
  const save = useAction(async () => {
    // An emptied price is refused here, not sent as 0: that would make the row free.
    const pricing = model.pricing.map((p, i) => ({ ...p, unit_price: requiredNumber(prices[i]!, `Unit price for ${rowLabel(p)}`) }));
    const body = changedFields(
      { display_name: model.display_name, enabled: model.enabled, pricing: model.pricing, ...settingsFields(model, settingsOf(model)) },
      { display_name: displayName, enabled, pricing, ...settingsFields(model, settings) },
    );
    const sent = body.pricing && (await pricesToSend(model, pricing));
    if (sent) body.pricing = sent.pricing;
    const after = await call(api.PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: model.id } }, body }));
    // The panel lists the prices this save changed: none when no price row was edited here.
    onSaved(after, sent ? priceChanges(sent.before, after.pricing) : []);
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
        {model.image && <ImageCapabilities caps={model.image} settings={settings} onChange={setSettings} />}
        {model.video && <VideoCapabilities caps={model.video} settings={settings} onChange={setSettings} />}
        <Mappings model={model} />
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

type ModelUpdate = Schemas['AdminCatalogModelUpdate'];

/** What the console lets an operator change besides name, state and prices (AdminCatalogModelUpdate). */
interface ModelSettings {
  edits: boolean;
  resize: 'exact' | 'native';
  customSizeRatios: 'any' | 'offered';
  referenceMax: number | string;
}

function settingsOf(model: CatalogModel): ModelSettings {
  return {
    edits: model.image?.edits ?? true,
    resize: model.image?.resize ?? 'exact',
    customSizeRatios: model.image?.custom_size_ratios ?? 'any',
    referenceMax: model.video?.reference_images.max_count ?? 0,
  };
}

/**
 * The settings of the update that this model takes: each is refused for the other kind of model, and
 * the reference-image limit for a model whose limit is not configurable.
 */
function settingsFields(model: CatalogModel, s: ModelSettings): Pick<ModelUpdate, 'edits' | 'resize' | 'custom_size_ratios' | 'reference_image_max_count'> {
  return {
    ...(model.image && { edits: s.edits, resize: s.resize, custom_size_ratios: s.customSizeRatios }),
    ...(model.video?.reference_images.configurable && { reference_image_max_count: requiredNumber(s.referenceMax, 'Reference images') }),
  };
}

/**
 * The price rows to send when the operator edited some. `pricing` replaces every row, so the rows are
 * read again just before the update and only the rows edited here take the form's price: a row someone
 * else changed since this page was loaded keeps its price. The rows read are what the panel compares
 * the answer with.
 */
async function pricesToSend(model: CatalogModel, edited: PriceRow[]): Promise<{ before: PriceRow[]; pricing: PriceRow[] }> {
  const mine = edited.filter((p, i) => p.unit_price !== model.pricing[i]!.unit_price);
  const current = await call(api.GET('/admin/v1/models/{model_id}', { params: { path: { model_id: model.id } } }));
  const rows = new Map(current.pricing.map((p) => [rowKey(p), p]));
  const gone = mine.find((p) => !rows.has(rowKey(p)));
  if (gone) throw new Error(`The price row ${rowLabel(gone)} was removed since this page was loaded: reload the page.`);
  for (const p of mine) rows.set(rowKey(p), { ...rows.get(rowKey(p))!, unit_price: p.unit_price });
  return { before: current.pricing, pricing: [...rows.values()] };
}

type SettingsProps<C> = { caps: C; settings: ModelSettings; onChange: (s: ModelSettings) => void };

function Facts({ label, rows }: { label: string; rows: [string, ReactNode][] }) {
  return (
    <Table aria-label={label} maw={640} variant="vertical" withTableBorder>
      <Table.Tbody>
        {rows.map(([k, v]) => (
          <Table.Tr key={k}>
            <Table.Th w={220}>{k}</Table.Th>
            <Table.Td>{v}</Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </Table>
  );
}

const list = (xs: readonly (string | number)[]) => xs.join(', ');
const yesNo = (b: boolean | undefined) => (b ? 'yes' : 'no');

/**
 * The edges a custom size may have on any model, from the contract (openapi/components/schemas/ImageSize.yaml:
 * "each edge 256 to 3840 px"); the server refuses a size outside them whatever the model's own limits.
 */
const CUSTOM_SIZE_EDGES = { min: 256, max: 3840 } as const;

/** The edges the server takes in a custom size on this model: its own limits (min_edge/max_edge) within the contract's. */
function customSizeEdges(caps: NonNullable<CatalogModel['image']>): string {
  const limits = `${CUSTOM_SIZE_EDGES.min}–${CUSTOM_SIZE_EDGES.max} px`;
  if (!caps.min_edge && !caps.max_edge) return `${limits} (the custom-size limits)`;
  const min = Math.max(caps.min_edge ?? CUSTOM_SIZE_EDGES.min, CUSTOM_SIZE_EDGES.min);
  const max = Math.min(caps.max_edge ?? CUSTOM_SIZE_EDGES.max, CUSTOM_SIZE_EDGES.max);
  return min <= max ? `${min}–${max} px` : `none: the model's ${caps.min_edge ?? CUSTOM_SIZE_EDGES.min}–${caps.max_edge ?? CUSTOM_SIZE_EDGES.max} px is outside the custom-size limits (${limits})`;
}

function ImageCapabilities({ caps, settings, onChange }: SettingsProps<NonNullable<CatalogModel['image']>>) {
  const edges = customSizeEdges(caps);
  return (
    <>
      <Title order={2} size="h3">
        Image capabilities
      </Title>
      <Facts
        label="Image capabilities"
        rows={[
          ['Resolution tiers', list(caps.resolutions)],
          ['Aspect ratios', list(caps.aspect_ratios)],
          ['Size table', caps.size_table ?? 'reference'],
          ['Output formats', list(caps.output_formats)],
          ['Quality tiers', yesNo(caps.supports_quality)],
          ['Transparent background', yesNo(caps.supports_transparent_background)],
          ['Images per request', `up to ${caps.max_n}`],
          ['Input images of an edit', caps.max_input_images ? `up to ${caps.max_input_images}` : 'up to 16 (the server limit)'],
          ['Edges of a custom size', edges],
        ]}
      />
      <Group align="flex-end">
        <Switch label="Edits images" checked={settings.edits} onChange={(e) => onChange({ ...settings, edits: e.currentTarget.checked })} />
        <Select
          label="Answer size"
          description="Resize to the size asked for, or return the upstream's own"
          w={300}
          data={[
            { value: 'exact', label: 'Exact: resized to the size asked for' },
            { value: 'native', label: "Native: the upstream's nearest size" },
          ]}
          value={settings.resize}
          onChange={(v) => v && onChange({ ...settings, resize: v as ModelSettings['resize'] })}
          allowDeselect={false}
        />
        <Select
          label="Custom size ratios"
          description="Which ratios a custom size may have"
          w={300}
          data={[
            { value: 'any', label: 'Any ratio within the limits' },
            { value: 'offered', label: "Only the model's aspect ratios" },
          ]}
          value={settings.customSizeRatios}
          onChange={(v) => v && onChange({ ...settings, customSizeRatios: v as ModelSettings['customSizeRatios'] })}
          allowDeselect={false}
        />
      </Group>
    </>
  );
}

const FRAMES: Record<string, string> = { none: 'none', 'first-only': 'a first frame', 'first-and-optional-last': 'a first frame and an optional last frame' };

function VideoCapabilities({ caps, settings, onChange }: SettingsProps<NonNullable<CatalogModel['video']>>) {
  const audio = !caps.audio.supported ? 'no' : caps.audio.always_on ? 'always on' : caps.audio.default_enabled ? 'yes, on unless turned off' : 'yes, off unless asked for';
  return (
    <>
      <Title order={2} size="h3">
        Video capabilities
      </Title>
      <Facts
        label="Video capabilities"
        rows={[
          ['Durations (seconds)', list(caps.durations)],
          ['Aspect ratios', list(caps.aspect_ratios)],
          ['Resolutions', list(caps.resolutions)],
          ['Frames', FRAMES[caps.frames] ?? caps.frames],
          ['Audio', audio],
          ...(caps.reference_images.configurable ? [] : ([['Reference images', `up to ${caps.reference_images.max_count}`]] as [string, string][])),
          ...(caps.duration_constraints ?? []).map(
            (c, i) =>
              [
                `Duration rule ${i + 1}`,
                `${[c.resolutions && `at ${list(c.resolutions)}`, c.last_frame && 'with a last frame', c.reference_images && 'with reference images'].filter(Boolean).join(', ')}: ${list(c.durations)} s`,
              ] as [string, string],
          ),
        ]}
      />
      {caps.reference_images.configurable && (
        <NumberInput
          label="Reference images"
          description="Most reference images a task may send (0 turns them off)"
          min={0}
          allowDecimal={false}
          value={settings.referenceMax}
          onChange={(v) => onChange({ ...settings, referenceMax: v })}
          w={300}
        />
      )}
    </>
  );
}

function Mappings({ model }: { model: CatalogModel }) {
  const entries = Object.entries(model.upstream_mappings ?? {}).flatMap(([provider, m]) => (m ? [[provider, m] as const] : []));
  if (entries.length === 0) return null;
  return (
    <>
      <Title order={2} size="h3">
        Aggregator mappings
      </Title>
      <Facts
        label="Aggregator mappings"
        rows={entries.map(([provider, m]) => [
          provider,
          <Stack gap={4}>
            <code>{m.endpoint}</code>
            <Text size="xs" component="pre" style={{ whiteSpace: 'pre-wrap', margin: 0 }}>
              input: {m.input}
              {'\n'}output: {m.output}
            </Text>
          </Stack>,
        ])}
      />
    </>
  );
}
