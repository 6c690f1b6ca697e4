/** Capability switches: turn image generation, image edits and video generation on or off for every key. */
import { Card, Group, Stack, Switch, Text, Title } from '@mantine/core';
import { useState } from 'react';
import { api, call, type CapabilitySwitch } from '../api.ts';
import { ConfirmButton, ErrorAlert, useLoad, when } from '../ui.tsx';

const LABELS: Record<CapabilitySwitch['name'], string> = {
  image_generation: 'Image generation',
  image_edit: 'Image edits',
  video_generation: 'Video generation',
};

export function SwitchesPage() {
  const list = useLoad(() => call(api.GET('/admin/v1/capability-switches')), []);
  const [error, setError] = useState<unknown>(null);
  const set = async (s: CapabilitySwitch, enabled: boolean) => {
    setError(null);
    try {
      await call(api.PUT('/admin/v1/capability-switches/{name}', { params: { path: { name: s.name } }, body: { enabled } }));
      await list.reload();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <Stack>
      <Title order={1} size="h2">
        Capability switches
      </Title>
      <Text size="sm">A switched-off capability is refused for every key until it is switched on again; a model leaves their model lists once nothing it offers is switched on (an image model while either image switch is on stays listed).</Text>
      <ErrorAlert error={list.error} title="Could not read the switches" />
      <ErrorAlert error={error} title="The switch could not be changed" />
      {list.data?.data.map((s) => (
        <Card withBorder key={s.name}>
          <Group justify="space-between">
            <div>
              <Text fw={600}>{LABELS[s.name] ?? s.name}</Text>
              <Text size="xs" c="dark.6">
                {s.enabled ? 'On' : 'Off'} since {when(s.updated_at)}
              </Text>
            </div>
            {s.enabled ? (
              <ConfirmButton color="red" variant="outline" title={`Switch off ${LABELS[s.name]}?`} message="Every key is refused this capability until it is switched on again." confirmLabel="Switch off" onConfirm={() => set(s, false)} aria-label={`Switch off ${LABELS[s.name]}`}>
                Switch off
              </ConfirmButton>
            ) : (
              <Switch aria-label={`Switch on ${LABELS[s.name]}`} checked={false} onChange={() => void set(s, true)} label="Off" />
            )}
          </Group>
        </Card>
      ))}
    </Stack>
  );
}
