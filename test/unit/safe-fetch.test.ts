/**
 * The send-time SSRF guard (`lib/safe-fetch.ts`): every resolved address is classified, one
 * non-public address refuses the whole target, the connection goes to the checked address only,
 * proxies never apply, and each failure has its stable class.
 */
import { createServer as createTcpServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveTarget, safeFetch, SafeFetchError, type ResolvedAddress } from '../../server/lib/safe-fetch.ts';
import { startHttpsReceiver, TEST_CA, type HttpsReceiver } from '../support/tls.ts';

const answering = (...addresses: string[]) => async (): Promise<ResolvedAddress[]> => addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));

async function classOf(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (err) {
    if (err instanceof SafeFetchError) return err.errorClass;
    throw err;
  }
}

describe('resolveTarget', () => {
  it.each([
    ['loopback', '127.0.0.1'],
    ['loopback v6', '::1'],
    ['private 10/8', '10.0.0.5'],
    ['private 172.16/12', '172.20.1.1'],
    ['private 192.168/16', '192.168.1.1'],
    ['link-local / cloud metadata', '169.254.169.254'],
    ['CGNAT (also Alibaba metadata)', '100.100.100.200'],
    ['unique-local v6 (AWS metadata v6)', 'fd00:ec2::254'],
    ['link-local v6', 'fe80::1'],
    ['IPv4-mapped IPv6 of a private address', '::ffff:10.0.0.1'],
    ['IPv4-mapped IPv6 of loopback', '::ffff:127.0.0.1'],
    ['multicast', '224.0.0.1'],
    ['reserved', '240.0.0.1'],
    ['unspecified', '0.0.0.0'],
    ['broadcast', '255.255.255.255'],
    // The deprecated IPv4-compatible ::/96: 127.0.0.1, 10.0.0.1 and the metadata address to some stacks.
    ['IPv4-compatible IPv6 of loopback', '::7f00:1'],
    ['IPv4-compatible IPv6 of a private address', '::a00:1'],
    ['IPv4-compatible IPv6 of cloud metadata', '::a9fe:a9fe'],
    ['IPv6 outside global unicast', '4000::1'],
  ])('refuses a name that resolves to a %s address (%s)', async (_what, address) => {
    await expect(classOf(resolveTarget('https://hooks.example.com/x', { resolve: answering(address) }))).resolves.toBe('blocked_address');
  });

  it('refuses a name when one of its addresses is private, even among public ones', async () => {
    const err = await resolveTarget('https://hooks.example.com/x', { resolve: answering('93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c', '192.168.0.7') }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SafeFetchError);
    // The message says neither which address nor what kind (it reaches the client).
    expect((err as SafeFetchError).message).toContain('resolves to a non-public address');
    // The kind of range is the operator's business (detail), not the client's.
    expect((err as SafeFetchError).message).not.toContain('private');
    expect((err as SafeFetchError).detail).toContain('(private)');
    expect((err as SafeFetchError).message).not.toContain('192.168.0.7');
  });

  it('names a few refused addresses to the operator and counts the rest (a name may have dozens)', async () => {
    const few = (await resolveTarget('https://hooks.example.com/x', { resolve: answering('93.184.215.14', '10.0.0.5', 'fd00::7') }).catch((e: unknown) => e)) as SafeFetchError;
    expect(few.detail).toBe("refused target: 'hooks.example.com' resolves to 10.0.0.5 (private), fd00::7 (uniqueLocal), not a public address");
    const many = Array.from({ length: 40 }, (_, i) => `fd00:1234:5678:9abc:def0:1234:5678:${(0x1000 + i).toString(16)}`);
    const err = (await resolveTarget('https://hooks.example.com/x', { resolve: answering(...many) }).catch((e: unknown) => e)) as SafeFetchError;
    expect(err.errorClass).toBe('blocked_address');
    expect(err.detail).toBe("refused target: 'hooks.example.com' resolves to 40 addresses, first: fd00:1234:5678:9abc:def0:1234:5678:1000 (uniqueLocal), not a public address");
  });

  it('accepts public addresses, v4 and v6, and keeps every one to connect to', async () => {
    const { target, addresses } = await resolveTarget('https://Hooks.Example.com./x', { resolve: answering('93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c') });
    expect(target.host).toBe('hooks.example.com');
    expect(addresses.map((a) => a.address)).toEqual(['93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c']);
  });

  it('classifies URLs the guard refuses before any lookup', async () => {
    let lookups = 0;
    const resolve = async () => {
      lookups++;
      return [{ address: '93.184.215.14', family: 4 as const }];
    };
    for (const [url, cls] of [
      ['http://hooks.example.com/', 'invalid_url'],
      ['https:///path', 'invalid_url'],
      ['https://hooks.example.com:0/', 'invalid_url'],
      ['https://user:pw@hooks.example.com/', 'invalid_url'],
      ['https://localhost./', 'blocked_address'],
      ['https://metadata.google.internal./computeMetadata/v1/', 'blocked_address'],
      ['https://[::ffff:169.254.169.254]/', 'blocked_address'],
      ['https://0x7f.1/', 'blocked_address'],
    ] as const) {
      await expect(classOf(resolveTarget(url, { resolve })), url).resolves.toBe(cls);
    }
    expect(lookups).toBe(0);
  });

  it('reports a name that does not resolve as dns_failure', async () => {
    const resolve = async () => Promise.reject(Object.assign(new Error('getaddrinfo ENOTFOUND'), { code: 'ENOTFOUND' }));
    await expect(classOf(resolveTarget('https://nowhere.example.com/', { resolve }))).resolves.toBe('dns_failure');
    await expect(classOf(resolveTarget('https://empty.example.com/', { resolve: answering() }))).resolves.toBe('dns_failure');
  });

  it('lets an operator allow private targets (on-premises receivers), and plain http only to this machine', async () => {
    await expect(classOf(resolveTarget('https://hooks.corp.example/', { allowPrivate: true, resolve: answering('10.0.0.5') }))).resolves.toBe('ok');
    await expect(classOf(resolveTarget('http://10.0.0.5/', { allowPrivate: true }))).resolves.toBe('invalid_url');
    await expect(classOf(resolveTarget('http://hooks.corp.example/', { allowPrivate: true, resolve: answering('127.0.0.1') }))).resolves.toBe('invalid_url');
    for (const url of ['http://127.0.0.1:4000/hook', 'http://[::1]:4000/hook', 'http://localhost/hook', 'http://api.localhost:8080/']) {
      await expect(classOf(resolveTarget(url, { allowPrivate: true, resolve: answering('127.0.0.1') }))).resolves.toBe('ok');
      // Without the operator's setting it stays https-only.
      await expect(classOf(resolveTarget(url, { resolve: answering('127.0.0.1') }))).resolves.toBe('invalid_url');
    }
    const { target } = await resolveTarget('http://localhost/hook', { allowPrivate: true, resolve: answering('127.0.0.1') });
    expect([target.protocol, target.port]).toEqual(['http:', 80]);
  });
});

describe('safeFetch', () => {
  let receiver: HttpsReceiver;
  let slow = false;
  beforeAll(async () => {
    receiver = await startHttpsReceiver((req, res) => {
      if (req.path === '/slow') return void setTimeout(() => res.end('late'), 2_000);
      if (req.path === '/big') return void res.end(Buffer.alloc(100_000, 120));
      if (req.path === '/redirect') {
        res.writeHead(307, { location: 'https://127.0.0.1/elsewhere' });
        return void res.end();
      }
      res.writeHead(slow ? 500 : 200);
      res.end('ok');
    });
  });
  afterAll(() => receiver?.close());
  const base = { timeoutMs: 1_000, maxResponseBytes: 4096, allowPrivate: true, ca: TEST_CA };

  it('connects to the address the resolver gave, not to a second lookup, and verifies TLS for the name', async () => {
    let lookups = 0;
    const resolve = async (host: string) => {
      lookups++;
      expect(host).toBe('receiver.test');
      return [{ address: '127.0.0.1', family: 4 as const }];
    };
    const res = await safeFetch(`https://receiver.test:${receiver.port}/hook`, { ...base, method: 'POST', body: '{"a":1}', headers: { 'content-type': 'application/json' }, resolve });
    expect([res.status, res.body.toString()]).toEqual([200, 'ok']);
    expect(lookups).toBe(1);
    expect(receiver.requests.at(-1)).toMatchObject({ method: 'POST', path: '/hook' });
    expect(receiver.requests.at(-1)!.headers.host).toBe(`receiver.test:${receiver.port}`);
    expect(receiver.requests.at(-1)!.body.toString()).toBe('{"a":1}');
  });

  it('ignores proxy environment variables', async () => {
    const saved = { HTTPS_PROXY: process.env.HTTPS_PROXY, https_proxy: process.env.https_proxy };
    process.env.HTTPS_PROXY = process.env.https_proxy = 'http://127.0.0.1:9'; // nothing listens there
    try {
      expect((await safeFetch(`${receiver.url}/`, base)).status).toBe(200);
    } finally {
      for (const [k, v] of Object.entries(saved)) v === undefined ? delete process.env[k] : (process.env[k] = v);
    }
  });

  it('returns a redirect as an answer and never follows it', async () => {
    const before = receiver.requests.length;
    const res = await safeFetch(`${receiver.url}/redirect`, base);
    expect(res.status).toBe(307);
    expect(receiver.requests.length).toBe(before + 1);
  });

  it('reads at most maxResponseBytes of the answer', async () => {
    const res = await safeFetch(`${receiver.url}/big`, base);
    expect([res.status, res.body.length, res.truncated]).toEqual([200, 4096, true]);
  });

  it('classifies a timeout, a refused connection and an untrusted certificate', async () => {
    await expect(classOf(safeFetch(`${receiver.url}/slow`, { ...base, timeoutMs: 200 }))).resolves.toBe('timeout');
    await expect(classOf(safeFetch('https://127.0.0.1:9/', base))).resolves.toBe('connect_failed');
    await expect(classOf(safeFetch(`${receiver.url}/`, { ...base, ca: undefined }))).resolves.toBe('tls_error');
  });

  it('says which TLS check failed without the certificate\'s list of names', async () => {
    const err = (await safeFetch(`https://other.test:${receiver.port}/`, { ...base, resolve: async () => [{ address: '127.0.0.1', family: 4 }] }).catch((e: unknown) => e)) as SafeFetchError;
    expect(err.errorClass).toBe('tls_error');
    expect(err.message).toBe("TLS failed: Hostname/IP does not match certificate's altnames (ERR_TLS_CERT_ALTNAME_INVALID)");
  });

  it('takes a status outside 100–599 (which Node parses) for an answer that is not HTTP', async () => {
    for (const status of ['999', '099', '600', '000']) {
      const raw = createTcpServer((socket) => socket.once('data', () => socket.end(`HTTP/1.1 ${status} Weird\r\ncontent-length: 0\r\n\r\n`)));
      await new Promise<void>((r) => raw.listen(0, '127.0.0.1', r));
      try {
        const err = (await safeFetch(`http://127.0.0.1:${(raw.address() as AddressInfo).port}/`, { ...base, method: 'POST', body: '{}' }).catch((e: unknown) => e)) as SafeFetchError;
        expect([err.errorClass, err.message], status).toEqual(['protocol_error', `the receiver's answer is not valid HTTP (status ${Number(status)})`]);
      } finally {
        raw.close();
      }
    }
  });

  it('holds the DNS lookup to the time limit and the caller abort too', async () => {
    // A resolver that never answers: only the time limit or the abort can end the fetch.
    const neverResolves = () => new Promise<ResolvedAddress[]>(() => undefined);
    await expect(classOf(safeFetch(`https://receiver.test:${receiver.port}/`, { ...base, timeoutMs: 100, resolve: neverResolves }))).resolves.toBe('timeout');

    // The abort comes long before the time limit: its reason, not a timeout, proves it ended the lookup.
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('lease lost')), 50);
    await expect(safeFetch(`https://receiver.test:${receiver.port}/`, { ...base, timeoutMs: 5_000, signal: controller.signal, resolve: neverResolves })).rejects.toThrow('lease lost');
  });

  it('rethrows the caller abort as it is, not as a delivery error', async () => {
    const controller = new AbortController();
    const pending = safeFetch(`${receiver.url}/slow`, { ...base, timeoutMs: 5_000, signal: controller.signal });
    setTimeout(() => controller.abort(new Error('lease lost')), 50);
    await expect(pending).rejects.toThrow('lease lost');
  });
});
