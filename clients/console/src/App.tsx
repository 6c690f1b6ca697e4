/** Sign-in with the admin token, the shell (navigation, sign-out) and the routes. */
import { AppShell, Alert, Anchor, Burger, Button, Container, Group, NavLink, PasswordInput, Stack, Text, Title } from '@mantine/core';
import { useDisclosure, useMediaQuery } from '@mantine/hooks';
import { useEffect, useState, type FormEvent, type ReactNode } from 'react';
import { forgetToken, setUnauthorizedHandler, storedToken, storeToken, tokenAccepted, type ApiFailure } from './api.ts';
import { BASE, match, navigate, useLocation } from './router.tsx';
import { ErrorBoundary } from './ui.tsx';
import { AccountDetailPage, AccountsPage } from './pages/Accounts.tsx';
import { DashboardPage } from './pages/Dashboard.tsx';
import { GroupDetailPage, GroupsPage } from './pages/Groups.tsx';
import { KeysPage } from './pages/Keys.tsx';
import { LedgerPage } from './pages/Ledger.tsx';
import { ModelDetailPage, ModelsPage } from './pages/Models.tsx';
import { SwitchesPage } from './pages/Switches.tsx';
import { TaskDetailPage, TasksPage } from './pages/Tasks.tsx';
import { UsagePage } from './pages/Usage.tsx';
import { WebhooksPage } from './pages/Webhooks.tsx';

const NAV: { to: string; label: string }[] = [
  { to: '/', label: 'Dashboard' },
  { to: '/accounts', label: 'Accounts' },
  { to: '/keys', label: 'API keys' },
  { to: '/groups', label: 'Groups & members' },
  { to: '/models', label: 'Models & prices' },
  { to: '/tasks', label: 'Tasks' },
  { to: '/usage', label: 'Usage' },
  { to: '/ledger', label: 'Ledger' },
  { to: '/webhooks', label: 'Webhooks' },
  { to: '/switches', label: 'Capability switches' },
];

const ROUTES: { pattern: string; render: (p: Record<string, string>) => ReactNode }[] = [
  { pattern: '/', render: () => <DashboardPage /> },
  { pattern: '/accounts', render: () => <AccountsPage /> },
  { pattern: '/accounts/:id', render: (p) => <AccountDetailPage id={p.id!} /> },
  { pattern: '/keys', render: () => <KeysPage /> },
  { pattern: '/groups', render: () => <GroupsPage /> },
  { pattern: '/groups/:id', render: (p) => <GroupDetailPage id={p.id!} /> },
  { pattern: '/models', render: () => <ModelsPage /> },
  { pattern: '/models/:id', render: (p) => <ModelDetailPage id={p.id!} /> },
  { pattern: '/tasks', render: () => <TasksPage /> },
  { pattern: '/tasks/:id', render: (p) => <TaskDetailPage id={p.id!} /> },
  { pattern: '/usage', render: () => <UsagePage /> },
  { pattern: '/ledger', render: () => <LedgerPage /> },
  { pattern: '/webhooks', render: () => <WebhooksPage /> },
  { pattern: '/switches', render: () => <SwitchesPage /> },
];

type Session = { state: 'signed-out' } | { state: 'rejected'; failure: ApiFailure } | { state: 'signed-in' };

export function App() {
  const [session, setSession] = useState<Session>(() => (storedToken() ? { state: 'signed-in' } : { state: 'signed-out' }));
  useEffect(() => {
    setUnauthorizedHandler(() => {
      forgetToken();
      setSession({ state: 'rejected', failure: Object.assign(new Error('The server no longer accepts this admin token.'), { status: 401, code: 'invalid_admin_token' }) as ApiFailure });
    });
  }, []);
  if (session.state === 'signed-in') {
    return (
      <Shell
        onSignOut={() => {
          forgetToken();
          setSession({ state: 'signed-out' });
        }}
      />
    );
  }
  if (session.state === 'rejected') return <WrongToken failure={session.failure} onRetry={() => setSession({ state: 'signed-out' })} />;
  return <SignIn onSignedIn={() => setSession({ state: 'signed-in' })} onRejected={(failure) => setSession({ state: 'rejected', failure })} />;
}

function SignIn({ onSignedIn, onRejected }: { onSignedIn: () => void; onRejected: (f: ApiFailure) => void }) {
  const [token, setToken] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (!token.trim()) {
      setError('Enter the admin token (the server’s ADMIN_TOKEN).');
      return;
    }
    setBusy(true);
    const result = await tokenAccepted(token.trim());
    setBusy(false);
    if (result.ok) {
      storeToken(token.trim());
      onSignedIn();
    } else if (result.failure.status === 401) onRejected(result.failure);
    else setError(`${result.failure.message} (HTTP ${result.failure.status}${result.failure.code ? `, ${result.failure.code}` : ''})`);
  };
  return (
    <Container size={420} py={80} component="main">
      <Title order={1} size="h2" mb="xs">
        Mediagate console
      </Title>
      <Text size="sm" c="dark.6" mb="lg">
        Sign in with the admin token (the server’s <code>ADMIN_TOKEN</code>). It is kept for this browser tab’s session only.
      </Text>
      <form onSubmit={submit} aria-label="Sign in">
        <Stack>
          <PasswordInput label="Admin token" name="token" autoComplete="current-password" value={token} onChange={(e) => setToken(e.currentTarget.value)} error={error} autoFocus />
          <Button type="submit" loading={busy}>
            Sign in
          </Button>
        </Stack>
      </form>
    </Container>
  );
}

function WrongToken({ failure, onRetry }: { failure: ApiFailure; onRetry: () => void }) {
  return (
    <Container size={520} py={80} component="main">
      <Title order={1} size="h2" mb="md">
        Wrong admin token
      </Title>
      <Alert color="red" variant="light" role="alert" title="The server refused the admin token">
        <Text size="sm">{failure.message}</Text>
        <Text size="xs" mt={4}>
          HTTP 401{failure.code ? ` · ${failure.code}` : ''}
        </Text>
      </Alert>
      <Text size="sm" mt="md">
        Use the value of <code>ADMIN_TOKEN</code> the server was started with. Nothing was stored.
      </Text>
      <Button mt="lg" onClick={onRetry}>
        Try another token
      </Button>
    </Container>
  );
}

function Shell({ onSignOut }: { onSignOut: () => void }) {
  const [opened, { toggle, close }] = useDisclosure();
  // Below the `sm` breakpoint the navigation folds off-screen; inert keeps Tab out of it then.
  const phone = useMediaQuery('(max-width: 48em)') ?? false;
  const { path, search } = useLocation();
  let page: ReactNode = null;
  for (const r of ROUTES) {
    const params = match(r.pattern, path);
    if (params) {
      page = r.render(params);
      break;
    }
  }
  const section = NAV.filter((n) => n.to !== '/').find((n) => path === n.to || path.startsWith(`${n.to}/`))?.to ?? (path === '/' ? '/' : null);
  return (
    <AppShell header={{ height: 56 }} navbar={{ width: 230, breakpoint: 'sm', collapsed: { mobile: !opened } }} padding="md">
      <AppShell.Header>
        <Group h="100%" px="md" justify="space-between" wrap="nowrap">
          <Group gap="sm" wrap="nowrap">
            <Burger opened={opened} onClick={toggle} hiddenFrom="sm" size="sm" aria-label={opened ? 'Close navigation' : 'Open navigation'} />
            <Anchor href={`${BASE}/`} onClick={(e) => (e.preventDefault(), navigate('/'))} fw={700} c="dark.9" underline="never">
              Mediagate console
            </Anchor>
          </Group>
          <Button variant="default" size="xs" onClick={onSignOut}>
            Sign out
          </Button>
        </Group>
      </AppShell.Header>
      <AppShell.Navbar p="xs" component="nav" aria-label="Console sections" inert={phone && !opened ? true : undefined}>
        {NAV.map((n) => (
          <NavLink
            key={n.to}
            href={`${BASE}${n.to}`}
            label={n.label}
            active={section === n.to}
            aria-current={section === n.to ? 'page' : undefined}
            onClick={(e) => {
              e.preventDefault();
              close();
              navigate(n.to);
            }}
          />
        ))}
      </AppShell.Navbar>
      <AppShell.Main>
        {/* A page is mounted afresh for each location: the list pages take their filters from the
            query when mounted, so /tasks after /tasks?account_id=… lists every task again. */}
        <ErrorBoundary key={`${path}?${search.toString()}`}>{page ?? <NotFound path={path} />}</ErrorBoundary>
      </AppShell.Main>
    </AppShell>
  );
}

function NotFound({ path }: { path: string }) {
  return (
    <Stack>
      <Title order={1} size="h2">
        No such page
      </Title>
      <Text>The console has no page at {path}.</Text>
    </Stack>
  );
}
