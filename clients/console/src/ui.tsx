/** Shared pieces: error display, confirmation, cursor pagination, number fields, formatting. */
import { Alert, Button, Group, Modal, NumberInput, Select, Stack, Text, type ButtonProps } from '@mantine/core';
import { Component, useCallback, useEffect, useRef, useState, type ReactNode } from 'react';
import { ApiFailure } from './api.ts';
import { NothingChanged } from './changes.ts';

/**
 * Shows an API error with its message and code (nothing when there is none). A form with nothing to
 * send stops with NothingChanged, which is no failure: it is shown as a notice.
 */
export function ErrorAlert({ error, title = 'The request failed' }: { error: unknown; title?: string }) {
  if (!error) return null;
  if (error instanceof NothingChanged) {
    return (
      <Alert color="blue" title="Nothing to save" role="status" variant="light" data-testid="nothing-changed">
        <Text size="sm">{error.message}</Text>
      </Alert>
    );
  }
  const f = error instanceof ApiFailure ? error : null;
  const message = error instanceof Error ? error.message : String(error);
  return (
    <Alert color="red" title={title} role="alert" variant="light" data-testid="api-error">
      <Text size="sm">{message}</Text>
      {f && (
        <Text size="xs" c="dark.6" mt={4}>
          HTTP {f.status}
          {f.code ? ` · ${f.code}` : ''}
          {f.requestId ? ` · request ${f.requestId}` : ''}
        </Text>
      )}
    </Alert>
  );
}

/** Runs an async action; keeps its pending state and error. */
export function useAction<A extends unknown[], T>(fn: (...args: A) => Promise<T>) {
  const [pending, setPending] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const run = useCallback(
    async (...args: A): Promise<T | undefined> => {
      setPending(true);
      setError(null);
      try {
        return await fn(...args);
      } catch (err) {
        setError(err);
        return undefined;
      } finally {
        setPending(false);
      }
    },
    [fn],
  );
  return { run, pending, error, setError };
}

/**
 * Loads `fn` when `deps` change (and every `refreshMs` when given); exposes reload and when it last
 * succeeded. `fn` gets the load's AbortSignal (for `api.GET(…, { signal })`): a load is aborted when
 * the page unmounts, when `deps` change and when a reload replaces it, since its answer would be
 * dropped. A refresh tick while a load is still running is skipped: a report that takes longer than
 * the interval is not asked for again on top of itself.
 */
export function useLoad<T>(fn: (signal: AbortSignal) => Promise<T>, deps: unknown[], refreshMs?: number) {
  const [data, setData] = useState<T | undefined>(undefined);
  const [loadedAt, setLoadedAt] = useState<Date | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const [loading, setLoading] = useState(true);
  const fnRef = useRef(fn);
  fnRef.current = fn;
  const seq = useRef(0);
  /** The load in flight, if any. */
  const inFlight = useRef<AbortController | null>(null);
  const reload = useCallback(async () => {
    inFlight.current?.abort();
    const controller = new AbortController();
    inFlight.current = controller;
    const mine = ++seq.current;
    setLoading(true);
    try {
      const value = await fnRef.current(controller.signal);
      if (mine === seq.current) {
        setData(value);
        setLoadedAt(new Date());
        setError(null);
      }
    } catch (err) {
      if (mine === seq.current) setError(err);
    } finally {
      if (inFlight.current === controller) inFlight.current = null;
      if (mine === seq.current) setLoading(false);
    }
  }, []);
  useEffect(() => {
    void reload();
    const timer = refreshMs
      ? setInterval(() => {
          if (!inFlight.current) void reload();
        }, refreshMs)
      : undefined;
    return () => {
      clearInterval(timer);
      // Unmounted, or deps changed: the answer of the load in flight would be dropped.
      seq.current++;
      inFlight.current?.abort();
      inFlight.current = null;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
  return { data, loadedAt, error, loading, reload, setData };
}

/** Keyset pagination over `next_cursor`: a stack of the cursors of the pages before this one. */
export function useCursorPages(resetKey: string) {
  const [stack, setStack] = useState<(string | undefined)[]>([undefined]);
  useEffect(() => setStack([undefined]), [resetKey]);
  const cursor = stack[stack.length - 1];
  return {
    cursor,
    page: stack.length,
    next: (c: string) => setStack((s) => [...s, c]),
    prev: () => setStack((s) => (s.length > 1 ? s.slice(0, -1) : s)),
    first: () => setStack([undefined]),
  };
}

export function Pager({ pages, nextCursor, label }: { pages: ReturnType<typeof useCursorPages>; nextCursor: string | null | undefined; label: string }) {
  return (
    <Group justify="flex-end" gap="xs" role="navigation" aria-label={`${label} pages`}>
      <Text size="sm" c="dark.6">
        Page {pages.page}
      </Text>
      <Button variant="default" size="xs" disabled={pages.page <= 1} onClick={pages.prev}>
        Previous page
      </Button>
      <Button variant="default" size="xs" disabled={!nextCursor} onClick={() => nextCursor && pages.next(nextCursor)}>
        Next page
      </Button>
    </Group>
  );
}

/** A button that asks for confirmation (a modal) before running a destructive action. */
export function ConfirmButton({
  children,
  title,
  message,
  confirmLabel,
  onConfirm,
  ...buttonProps
}: ButtonProps & { children: ReactNode; title: string; message: ReactNode; confirmLabel: string; onConfirm: () => Promise<unknown> | void }) {
  const [open, setOpen] = useState(false);
  const [busy, setBusy] = useState(false);
  return (
    <>
      <Button {...buttonProps} onClick={() => setOpen(true)}>
        {children}
      </Button>
      <Modal opened={open} onClose={() => setOpen(false)} title={title} closeButtonProps={{ 'aria-label': 'Close' }} centered>
        <Stack>
          <Text size="sm">{message}</Text>
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setOpen(false)}>
              Cancel
            </Button>
            <Button
              color="red"
              loading={busy}
              onClick={async () => {
                setBusy(true);
                try {
                  await onConfirm();
                } finally {
                  setBusy(false);
                  setOpen(false);
                }
              }}
            >
              {confirmLabel}
            </Button>
          </Group>
        </Stack>
      </Modal>
    </>
  );
}

export function credits(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  return n.toLocaleString('en-US', { maximumFractionDigits: 6 });
}

/** A time in the browser's zone, named ("28 Nov 2026, 09:15:00 GMT+1"): usage, next to it, is in UTC. */
export function when(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  return d.toLocaleString('en-GB', { year: 'numeric', month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short' });
}

/**
 * A NumberInput's value as a number: null when the field is empty, NaN when it holds no number.
 * Mantine hands back a string ('2.50', '0.10', '5.', 14 digits or more) until the field loses focus,
 * and Enter submits without a blur, so a string is a value like any other.
 */
export function parseNumber(value: number | string): number | null {
  if (typeof value === 'number') return value;
  if (value.trim() === '') return null;
  return Number(value);
}

/** A NumberInput's value for a request: null when empty; a field that holds no number stops the form. */
export function numberField(value: number | string, label: string): number | null {
  const n = parseNumber(value);
  if (Number.isNaN(n)) throw new Error(`${label}: “${value}” is not a number.`);
  return n;
}

/** The same, for a field that must not be empty. */
export function requiredNumber(value: number | string, label: string): number {
  const n = numberField(value, label);
  if (n === null) throw new Error(`${label} is empty: enter a number.`);
  return n;
}

/** `datetime-local` input value -> RFC 3339 (UTC), or undefined when empty. */
export function fromLocalInput(v: string): string | undefined {
  if (!v) return undefined;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? undefined : d.toISOString();
}

/** Drops empty strings from a filter object (the API refuses empty filter values). */
export function compact<T extends Record<string, unknown>>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== '' && v !== undefined && v !== null)) as Partial<T>;
}

export const STATUS_COLORS: Record<string, string> = {
  queued: 'gray',
  in_progress: 'blue',
  processing: 'blue',
  needs_attention: 'orange',
  completed: 'green',
  failed: 'red',
  pending: 'gray',
  delivered: 'green',
  gone: 'dark',
  active: 'green',
  suspended: 'red',
  revoked: 'red',
  enabled: 'green',
  disabled: 'gray',
};

/** A per-key or per-account limit as the contract states it: a number, null (no limit) or 'default'. */
export type Limit = number | null | 'default';

export function limitText(v: Limit): string {
  return v === 'default' ? 'default' : v === null ? 'no limit' : v.toLocaleString('en-US');
}

/**
 * A Limit while its form is edited: the choice and, for a custom limit, the number field as typed. An
 * emptied field stays empty (typing 30 into it is 30, not 301); `limitValue` reads it on submit.
 */
export interface LimitDraft {
  mode: 'default' | 'none' | 'custom';
  /** The number field's value (Mantine's string while it is typed in); kept when another mode is picked. */
  text: number | string;
}

export function limitDraft(v: Limit): LimitDraft {
  return v === 'default' ? { mode: 'default', text: '' } : v === null ? { mode: 'none', text: '' } : { mode: 'custom', text: v };
}

/** A LimitDraft as a request states it; an empty custom field, or one below 1, stops the form. */
export function limitValue(d: LimitDraft, label: string): Limit {
  if (d.mode === 'default') return 'default';
  if (d.mode === 'none') return null;
  const n = requiredNumber(d.text, label);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${label}: “${d.text}” is not a whole number of at least 1.`);
  return n;
}

/** Edits a Limit: the operator's default, no limit, or a number. */
export function LimitInput({ label, value, onChange, max }: { label: string; value: LimitDraft; onChange: (v: LimitDraft) => void; max: number }) {
  return (
    <Group gap="xs" align="flex-end" wrap="nowrap">
      <Select
        label={label}
        data={[
          { value: 'default', label: "Server's default" },
          { value: 'none', label: 'No limit' },
          { value: 'custom', label: 'Custom' },
        ]}
        value={value.mode}
        onChange={(m) => {
          const mode = (m ?? 'default') as LimitDraft['mode'];
          onChange({ mode, text: mode === 'custom' && value.text === '' ? 60 : value.text });
        }}
        allowDeselect={false}
        w={170}
      />
      {value.mode === 'custom' && (
        <NumberInput
          aria-label={`${label} (number)`}
          min={1}
          max={max}
          allowDecimal={false}
          allowNegative={false}
          value={value.text}
          onChange={(text) => onChange({ mode: 'custom', text })}
          w={120}
        />
      )}
    </Group>
  );
}

/**
 * Shows what was thrown while rendering instead of a blank console. Around the console and around
 * each page; the shell keys the page's by location, so following a link clears it.
 */
export class ErrorBoundary extends Component<{ children: ReactNode }, { error: unknown }> {
  state: { error: unknown } = { error: null };
  static getDerivedStateFromError(error: unknown) {
    return { error };
  }
  render() {
    if (!this.state.error) return this.props.children;
    return (
      <Stack>
        <ErrorAlert error={this.state.error} title="This page failed" />
        <Group>
          <Button variant="default" onClick={() => window.location.reload()}>
            Reload the console
          </Button>
        </Group>
      </Stack>
    );
  }
}
