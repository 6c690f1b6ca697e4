/**
 * A receiver that answers `101 Switching Protocols` with `Upgrade`: Node's http client takes it for
 * an upgrade and, with no 'upgrade' listener, drops the socket and emits neither 'response' nor
 * 'error'. The request must still end (as a protocol error), over http and https, in safeFetch and
 * in a signed webhook send. A hang is caught by the tests' own time limit (each `it`'s timeout),
 * which the fetch's `timeoutMs` would otherwise have had to beat.
 */
import { createServer as createTcpServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { safeFetch, SafeFetchError } from '../../server/lib/safe-fetch.ts';
import { sendSignedWebhook } from '../../server/services/webhooks/webhook-send.ts';
import { startHttpsReceiver, TEST_CA, type HttpsReceiver } from '../support/tls.ts';

const SWITCH = 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n';
/** Each test's time limit, well above the fetches' `timeoutMs`: reaching it means the request hung. */
const HANG = 6_000;
const base = { timeoutMs: 1_500, maxResponseBytes: 4096, allowPrivate: true };

let raw: Server | undefined;
let tls: HttpsReceiver | undefined;
afterEach(async () => {
  raw?.close();
  raw = undefined;
  await tls?.close();
  tls = undefined;
});

/** A plain TCP receiver on loopback that switches protocols and keeps the socket; resolves `dropped` when the client lets go of it. */
async function switchingReceiver() {
  let dropped!: () => void;
  const droppedP = new Promise<void>((r) => (dropped = r));
  raw = createTcpServer((socket: Socket) => {
    socket.on('error', () => undefined);
    socket.once('data', () => socket.write(SWITCH));
    socket.once('close', dropped);
  });
  await new Promise<void>((r) => raw!.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(raw.address() as AddressInfo).port}/hook`, dropped: droppedP };
}

describe('a receiver that switches protocols (101 with Upgrade)', () => {
  it(
    'fails the fetch as a protocol error and lets go of the connection, over http',
    async () => {
      const receiver = await switchingReceiver();
      const err = await safeFetch(receiver.url, { ...base, method: 'POST', body: '{}' }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SafeFetchError);
      expect([(err as SafeFetchError).errorClass, (err as SafeFetchError).message]).toEqual([
        'protocol_error',
        'the receiver switched protocols (HTTP 101), which the request did not ask for',
      ]);
      await receiver.dropped;
    },
    HANG,
  );

  it(
    'fails the fetch as a protocol error over https too',
    async () => {
      tls = await startHttpsReceiver((_req, res) => {
        // What the raw receiver writes, through a TLS server's own response.
        res.socket!.write(SWITCH);
      });
      const err = await safeFetch(`https://receiver.test:${tls.port}/hook`, { ...base, ca: TEST_CA, resolve: async () => [{ address: '127.0.0.1', family: 4 }] }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SafeFetchError);
      expect((err as SafeFetchError).errorClass).toBe('protocol_error');
    },
    HANG,
  );

  it(
    'ends a signed webhook send, with the caller\'s signal (a delivery attempt\'s lease), as a failed attempt',
    async () => {
      const receiver = await switchingReceiver();
      const lease = new AbortController();
      const sent = await sendSignedWebhook(receiver.url, 'msg_test', '{}', ['whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'], { timeoutMs: base.timeoutMs, allowPrivate: true, signal: lease.signal });
      expect(sent).toMatchObject({ statusCode: null, errorClass: 'protocol_error' });
    },
    HANG,
  );
});
