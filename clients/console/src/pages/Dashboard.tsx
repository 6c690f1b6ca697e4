/**
 * Dashboard: credits spent/refunded and tasks by status over the last 7 days (the usage report),
 * credits held by unfinished tasks and the needs_attention count (the task listing, paged through),
 * and the members cooling down or out of rotation, for every model or some (every group's members).
 */
import { Badge, Card, SimpleGrid, Stack, Table, Text, Title } from '@mantine/core';
import { useMemo } from 'react';
import { Bar, BarChart, CartesianGrid, Legend, ResponsiveContainer, Tooltip, XAxis, YAxis } from 'recharts';
import { api, call, type Member, type TaskStatus } from '../api.ts';
import { Link } from '../router.tsx';
import { ErrorAlert, credits, useLoad, when } from '../ui.tsx';
import { Stat } from './Accounts.tsx';
import { ModelFaults, activeModelFaults, memberCondition } from './Groups.tsx';
import { UsageChart, asReport, byPeriod } from './Usage.tsx';

const MAX_PAGES = 20;

/** Pages through the tasks in `statuses`; their count and the credits they still hold. */
async function openTasks(statuses: TaskStatus[]): Promise<{ count: number; held: number; more: boolean }> {
  let cursor: string | undefined;
  let count = 0;
  let held = 0;
  for (let page = 0; page < MAX_PAGES; page++) {
    const res = await call(api.GET('/admin/v1/tasks', { params: { query: { limit: 100, cursor, status: statuses } } }));
    for (const t of res.data) {
      count++;
      held += Math.max(0, t.held_credits - t.captured_credits - t.released_credits);
    }
    if (!res.next_cursor) return { count, held, more: false };
    cursor = res.next_cursor;
  }
  return { count, held, more: true };
}

async function troubledMembers(): Promise<{ group: string; groupId: string; member: Member }[]> {
  const out: { group: string; groupId: string; member: Member }[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < MAX_PAGES; page++) {
    const groups = await call(api.GET('/admin/v1/groups', { params: { query: { limit: 100, cursor } } }));
    const lists = await Promise.all(groups.data.map((g) => call(api.GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: g.id } } })).then((m) => ({ g, m }))));
    for (const { g, m } of lists) for (const member of m.data) if (memberCondition(member).trouble) out.push({ group: g.name, groupId: g.id, member });
    if (!groups.next_cursor) break;
    cursor = groups.next_cursor;
  }
  return out;
}

/** Until when the member is out: its cooldown, else the first of its model faults to end. */
function until(member: Member): string {
  const { cooldown_until } = member.health;
  if (cooldown_until && Date.parse(cooldown_until) > Date.now()) return when(cooldown_until);
  const faults = activeModelFaults(member);
  if (faults.length === 0) return '—';
  if (faults.some((f) => f.until === null)) return 'until an admin updates it';
  return when(faults.map((f) => f.until!).sort()[0]);
}

/**
 * Seven UTC days: today and the six before it, seven daily bars (days without usage at zero). Taken
 * at each read, so that a page left open past midnight moves on to the new day.
 */
function sevenUtcDays(now = new Date()): { from: string; to: string } {
  const from = new Date(now);
  from.setUTCHours(0, 0, 0, 0);
  from.setUTCDate(from.getUTCDate() - 6);
  return { from: from.toISOString(), to: new Date(from.getTime() + 7 * 86400_000).toISOString() };
}

export function DashboardPage() {
  const usage = useLoad((signal) => call(api.GET('/admin/v1/usage', { params: { query: { ...sevenUtcDays(), granularity: 'day', group_by: ['provider'] } }, signal })).then(asReport), [], 30_000);
  const open = useLoad(() => openTasks(['queued', 'in_progress', 'processing', 'needs_attention']), [], 15_000);
  const attention = useLoad(() => openTasks(['needs_attention']), [], 15_000);
  const members = useLoad(troubledMembers, [], 10_000);
  const periods = useMemo(() => (usage.data ? byPeriod(usage.data) : []), [usage.data]);
  const totals = periods.reduce((a, p) => ({ spent: a.spent + p.spent, refunded: a.refunded + p.refunded }), { spent: 0, refunded: 0 });
  return (
    <Stack>
      <Title order={1} size="h2">
        Dashboard
      </Title>
      <SimpleGrid cols={{ base: 1, xs: 2, md: 4 }}>
        <Stat label="Credits spent (7 days)" value={usage.data ? credits(totals.spent) : '…'} />
        <Stat label="Credits refunded (7 days)" value={usage.data ? credits(totals.refunded) : '…'} />
        <Stat label="Credits held now" value={open.data ? `${credits(open.data.held)}${open.data.more ? '+' : ''}` : '…'} testId="held-credits" />
        <Card withBorder padding="sm">
          <Text size="xs" c="dark.6" tt="uppercase" fw={600}>
            Needs attention
          </Text>
          <Text size="xl" fw={700} data-testid="needs-attention-count">
            {attention.data ? `${attention.data.count}${attention.data.more ? '+' : ''}` : '…'}
          </Text>
          <Link to="/tasks?status=needs_attention">Show these tasks</Link>
        </Card>
      </SimpleGrid>
      <ErrorAlert error={usage.error} title="Could not read usage" />
      <ErrorAlert error={open.error ?? attention.error} title="Could not list tasks" />
      <SimpleGrid cols={{ base: 1, lg: 2 }}>
        <Card withBorder>
          <Title order={2} size="h4" mb="xs">
            Credits per day
          </Title>
          {usage.data && <UsageChart report={usage.data} height={220} />}
        </Card>
        <Card withBorder>
          <Title order={2} size="h4" mb="xs">
            Tasks by status per day
          </Title>
          <figure style={{ margin: 0 }} aria-label="Tasks by status per day">
            <ResponsiveContainer width="100%" height={220}>
              <BarChart data={periods}>
                <CartesianGrid strokeDasharray="3 3" />
                <XAxis dataKey="period" />
                <YAxis allowDecimals={false} />
                <Tooltip />
                <Legend />
                <Bar dataKey="completed" name="Completed" stackId="s" fill="#1e6b30" />
                <Bar dataKey="failed" name="Failed" stackId="s" fill="#c92a2a" />
                <Bar dataKey="inProgress" name="In progress" stackId="s" fill="#1864ab" />
                <Bar dataKey="needsAttention" name="Needs attention" stackId="s" fill="#9a3412" />
              </BarChart>
            </ResponsiveContainer>
          </figure>
        </Card>
      </SimpleGrid>
      <Title order={2} size="h3">
        Members cooling down or out of rotation
      </Title>
      <Text size="sm" c="dark.6">
        Out for every model, or for some (model faults: requests for those models get 503 when no other member serves them).
      </Text>
      <ErrorAlert error={members.error} title="Could not read member health" />
      {members.data && members.data.length === 0 && <Text size="sm">Every member is enabled and healthy.</Text>}
      {members.data && members.data.length > 0 && (
        <Table.ScrollContainer minWidth={700}>
          <Table striped aria-label="Members needing attention">
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Member</Table.Th>
                <Table.Th>Group</Table.Th>
                <Table.Th>Condition</Table.Th>
                <Table.Th>Until</Table.Th>
                <Table.Th>Last error</Table.Th>
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {members.data.map(({ group, groupId, member }) => {
                const c = memberCondition(member);
                return (
                  <Table.Tr key={member.id}>
                    <Table.Td>
                      {member.name} ({member.provider})
                    </Table.Td>
                    <Table.Td>
                      <Link to={`/groups/${groupId}`}>{group}</Link>
                    </Table.Td>
                    <Table.Td>
                      <Badge variant="light" color={c.color} c="dark.9">
                        {c.label}
                      </Badge>
                      <ModelFaults member={member} />
                    </Table.Td>
                    <Table.Td>{until(member)}</Table.Td>
                    <Table.Td>{member.health.last_error ?? '—'}</Table.Td>
                  </Table.Tr>
                );
              })}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Stack>
  );
}
