/**
 * The large-body budget is given back whenever a client leaves early: before its turn (during the
 * key lookup or the rate gate, whose 'close' has then passed before `largeBodySlots` listens for
 * it), between the grant and the middleware's next step, or with its signal already aborted. A
 * share taken and never given back made every later large multipart edit 503 server_busy until a
 * restart. Against `largeBodySlots` and `LargeBodyBudget` on a real HTTP server, behind a step the
 * test holds open as long as it needs.
 */
import { once } from 'node:events';
import type { Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { setImmediate as tick } from 'node:timers/promises';
import express, { type NextFunction, type Request, type Response } from 'express';
import { afterEach, describe, expect, it } from 'vitest';
import { ApiError } from '../../server/errors.ts';
import { largeBodySlots } from '../../server/http/request-guards.ts';
import { LargeBodyBudget, type LargeBodyOptions } from '../../server/services/media/large-body-budget.ts';

const OPTS: LargeBodyOptions = { largeBodyBytes: 1_000, budgetBytes: 10_000, waitMs: 200 };

/** A request that reached the held step, and what tells the test its client is gone for the server. */
interface Arrival {
  closed: Promise<unknown>;
  go(): void;
}

/**
 * An app whose edits pass a step held until the test calls `go()` (standing for the key lookup and
 * the rate gate), then `largeBodySlots`, then a handler that reads the body and answers 200.
 */
function appWith(budget: LargeBodyBudget) {
  const arrivals: Arrival[] = [];
  const waiters: ((a: Arrival) => void)[] = [];
  let handled = 0;
  const app = express();
  app.post(
    '/edit',
    (req: Request, res: Response, next: NextFunction) => {
      let go!: () => void;
      const held = new Promise<void>((resolve) => (go = resolve));
      // Listened for while the response is alive, so the test knows when the server saw the client go.
      const arrival = { closed: once(res, 'close'), go };
      const waiter = waiters.shift();
      if (waiter) waiter(arrival);
      else arrivals.push(arrival);
      void held.then(() => next());
    },
    largeBodySlots(budget),
    (req: Request, res: Response) => {
      handled++;
      req.resume();
      req.once('end', () => res.json({ ok: true }));
    },
  );
  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    res.status(err instanceof ApiError ? err.status : 500).json({ code: err instanceof ApiError ? err.code : 'internal_error' });
  });
  return {
    app,
    handled: () => handled,
    nextArrival: () => new Promise<Arrival>((resolve) => (arrivals.length > 0 ? resolve(arrivals.shift()!) : waiters.push(resolve))),
  };
}

let server: Server | undefined;
afterEach(async () => {
  if (!server) return;
  server.closeAllConnections();
  await new Promise((resolve) => server!.close(resolve));
  server = undefined;
});

async function listen(app: express.Express): Promise<number> {
  server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return (server.address() as AddressInfo).port;
}

/** Sends the head of a multipart edit (and `body`, if any) on a connection of its own. */
async function sendHead(port: number, lengthHeader: string, body = ''): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  await once(socket, 'connect');
  socket.write(`POST /edit HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=xx\r\n${lengthHeader}\r\n\r\n${body}`);
  return socket;
}

async function statusOf(socket: Socket): Promise<string> {
  let text = '';
  for await (const chunk of socket) {
    text += String(chunk);
    if (text.includes('\r\n\r\n')) break;
  }
  return text.split('\r\n')[0]!;
}

describe('largeBodySlots when the client leaves early', () => {
  it('takes no share for a client gone before its turn, so the next large body is still read', async () => {
    const budget = new LargeBodyBudget(OPTS);
    const edits = appWith(budget);
    const port = await listen(edits.app);

    // A chunked body (unknown length) would take the whole budget.
    const gone = await sendHead(port, 'Transfer-Encoding: chunked');
    const first = await edits.nextArrival();
    gone.destroy();
    await first.closed;
    first.go();
    await tick();
    await tick();
    expect(budget.inUse).toBe(0);
    expect(edits.handled()).toBe(0);

    // Another large edit gets its share at once instead of 503 server_busy after the wait.
    const body = 'x'.repeat(5_000);
    const next = await sendHead(port, `Content-Length: ${body.length}`, body);
    (await edits.nextArrival()).go();
    expect(await statusOf(next)).toBe('HTTP/1.1 200 OK');
    next.destroy();
    await tick();
    expect(budget.inUse).toBe(0);
  });

  it('gives the share back at once when the response closed between the grant and the next step', async () => {
    const released: number[] = [];
    let grant!: () => void;
    const granted = new Promise<void>((resolve) => (grant = resolve));
    let asked!: () => void;
    const askedFor = new Promise<void>((resolve) => (asked = resolve));
    // A grant that lands after the client is gone (as one can when a release drains the queue in
    // the same turn as the close), whatever the signal says.
    class LateGrant extends LargeBodyBudget {
      override async acquire(): Promise<() => void> {
        asked();
        await granted;
        return () => released.push(1);
      }
    }
    const edits = appWith(new LateGrant(OPTS));
    const port = await listen(edits.app);

    const gone = await sendHead(port, 'Content-Length: 5000');
    const arrival = await edits.nextArrival();
    arrival.go();
    await askedFor;
    gone.destroy();
    await arrival.closed;
    grant();
    await tick();
    await tick();
    expect(released).toEqual([1]);
    expect(edits.handled()).toBe(0);
  });
});

describe('LargeBodyBudget.acquire', () => {
  it('refuses at once, holding nothing, when its signal has already aborted', async () => {
    const budget = new LargeBodyBudget(OPTS);
    await expect(budget.acquire(5_000, AbortSignal.abort(new Error('client gone')))).rejects.toMatchObject({ status: 503, code: 'server_busy' });
    expect(budget.inUse).toBe(0);
  });
});
