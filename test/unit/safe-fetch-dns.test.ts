/**
 * How `lib/safe-fetch.ts` resolves the hosts clients give (webhook receivers, media URLs): by asking
 * DNS directly, never through the system's getaddrinfo, whose lookups hold threads of libuv's pool
 * (DNS may use 2 of its 4) until the system resolver gives up, long after the request's time limit:
 * a client's names whose DNS never answers would make every other lookup of the process wait. The
 * name servers here are UDP sockets on loopback (`dnsServers`, the test seam): one that answers
 * from a table, one that never answers. getaddrinfo calls are counted by their async resource
 * (GETADDRINFOREQWRAP), so the tests see which path a lookup took without replacing it.
 */
import { createHook } from 'node:async_hooks';
import { createSocket, type Socket } from 'node:dgram';
import { lookup } from 'node:dns/promises';
import ipaddr from 'ipaddr.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dnsResolver, resolveTarget, safeFetch, SafeFetchError } from '../../server/lib/safe-fetch.ts';
import { startHttpsReceiver, TEST_CA, type HttpsReceiver } from '../support/tls.ts';

interface DnsServer {
  servers: string[];
  /** Every question asked, as `name TYPE`. */
  queries: string[];
  close(): void;
}

/**
 * A name server on loopback. With `records`, it answers each name's addresses of the family asked
 * (no address of that family: an empty answer; a name not in the table: NXDOMAIN); without, it
 * never answers, as an attacker's authoritative server that stays silent looks to a resolver.
 */
async function startDnsServer(records?: Record<string, string[]>): Promise<DnsServer> {
  const socket: Socket = createSocket('udp4');
  const queries: string[] = [];
  socket.on('message', (query, peer) => {
    let at = 12; // the header; the question follows: labels, then type and class
    const labels: string[] = [];
    while (query[at]! !== 0) {
      labels.push(query.subarray(at + 1, at + 1 + query[at]!).toString());
      at += 1 + query[at]!;
    }
    const type = query.readUInt16BE(at + 1);
    const questionEnd = at + 5;
    const name = labels.join('.').toLowerCase();
    queries.push(`${name} ${type === 1 ? 'A' : type === 28 ? 'AAAA' : type}`);
    if (!records) return;
    const known = records[name];
    const addresses = (known ?? []).filter((a) => ipaddr.parse(a).kind() === (type === 28 ? 'ipv6' : 'ipv4'));
    const header = Buffer.alloc(12);
    query.copy(header, 0, 0, 2); // the query's id
    header.writeUInt16BE(0x8180 | (known ? 0 : 3), 2); // an answer, recursion done; NOERROR or NXDOMAIN
    header.writeUInt16BE(1, 4);
    header.writeUInt16BE(addresses.length, 6);
    const answers = addresses.map((address) => {
      const data = Buffer.from(ipaddr.parse(address).toByteArray());
      const head = Buffer.alloc(12);
      head.writeUInt16BE(0xc00c, 0); // the name: a pointer to the question's
      head.writeUInt16BE(type, 2);
      head.writeUInt16BE(1, 4); // IN
      head.writeUInt32BE(60, 6);
      head.writeUInt16BE(data.length, 10);
      return Buffer.concat([head, data]);
    });
    socket.send(Buffer.concat([header, query.subarray(12, questionEnd), ...answers]), peer.port, peer.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return { servers: [`127.0.0.1:${socket.address().port}`], queries, close: () => socket.close() };
}

/** Runs `work` and counts the getaddrinfo calls made meanwhile (each is a GETADDRINFOREQWRAP). */
async function countingGetaddrinfo<T>(work: () => Promise<T>): Promise<{ result: T; getaddrinfo: number }> {
  let getaddrinfo = 0;
  const hook = createHook({ init: (_id, type) => void (type === 'GETADDRINFOREQWRAP' && getaddrinfo++) }).enable();
  try {
    const result = await work();
    return { result, getaddrinfo };
  } finally {
    hook.disable();
  }
}

async function outcome(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (err) {
    if (err instanceof SafeFetchError) return `${err.errorClass}: ${err.message}`;
    throw err;
  }
}

const PUBLIC_V4 = '93.184.215.14';
const PUBLIC_V6 = '2606:2800:21f:cb07:6820:80da:af6b:8b2c';

describe('resolving a client\'s host', () => {
  let dns: DnsServer;
  let silent: DnsServer;
  let receiver: HttpsReceiver;
  beforeAll(async () => {
    dns = await startDnsServer({
      'hooks.example.com': [PUBLIC_V6, PUBLIC_V4],
      'v4only.example.com': [PUBLIC_V4],
      'mapped.example.com': [PUBLIC_V4, '::ffff:10.0.0.1'],
      'nat64.example.com': ['64:ff9b::a9fe:a9fe'],
      'corp.example.com': ['10.0.0.5'],
      'receiver.test': ['127.0.0.1'],
    });
    silent = await startDnsServer();
    receiver = await startHttpsReceiver((_req, res) => res.end('ok'));
  });
  afterAll(async () => {
    dns?.close();
    silent?.close();
    await receiver?.close();
  });

  it('asks DNS (A and AAAA), never the system\'s getaddrinfo, and checks every address it answers', async () => {
    const { result, getaddrinfo } = await countingGetaddrinfo(async () => {
      const at = (url: string, allowPrivate = false) => resolveTarget(url, { dnsServers: dns.servers, allowPrivate });
      return {
        both: (await at('https://hooks.example.com/x')).addresses,
        v4only: (await at('https://v4only.example.com/x')).addresses,
        // The rules hold on DNS's answers as on any: an IPv4-mapped AAAA of a private address, NAT64 of the metadata address.
        mapped: await outcome(at('https://mapped.example.com/x')),
        nat64: await outcome(at('https://nat64.example.com/x')),
        nowhere: await outcome(at('https://nowhere.example.com/x')),
        // The operator's private targets: a public name is still asked of DNS.
        corp: (await at('https://corp.example.com/x', true)).addresses,
      };
    });
    expect(result).toEqual({
      both: [
        { address: PUBLIC_V4, family: 4 },
        { address: PUBLIC_V6, family: 6 },
      ],
      v4only: [{ address: PUBLIC_V4, family: 4 }],
      mapped: "blocked_address: refused target: 'mapped.example.com' resolves to a non-public address",
      nat64: "blocked_address: refused target: 'nat64.example.com' resolves to a non-public address",
      nowhere: "dns_failure: 'nowhere.example.com' could not be resolved (ENOTFOUND)",
      corp: [{ address: '10.0.0.5', family: 4 }],
    });
    expect(getaddrinfo).toBe(0);
    expect(dns.queries).toEqual(expect.arrayContaining(['hooks.example.com A', 'hooks.example.com AAAA', 'corp.example.com A']));
  });

  it('connects to the address DNS answered, with TLS checked for the name', async () => {
    const res = await safeFetch(`https://receiver.test:${receiver.port}/hook`, { timeoutMs: 2_000, maxResponseBytes: 100, dnsServers: dns.servers, treatAsPublic: ['127.0.0.1'], ca: TEST_CA });
    expect([res.status, res.body.toString()]).toEqual([200, 'ok']);
    expect(receiver.requests.at(-1)!.headers.host).toBe(`receiver.test:${receiver.port}`);
  });

  it('leaves localhost to the system (hosts file) when the operator allows private targets, and asks no name server', async () => {
    const before = silent.queries.length;
    const { result, getaddrinfo } = await countingGetaddrinfo(() => resolveTarget('http://localhost:4000/hook', { allowPrivate: true, dnsServers: silent.servers }));
    expect(result.addresses.map((a) => a.address)).toEqual(expect.arrayContaining([expect.stringMatching(/^(127\.0\.0\.1|::1)$/)]));
    expect(getaddrinfo).toBe(1);
    expect(silent.queries.length).toBe(before);
  });

  it('ends a lookup at the time limit, and silent names do not delay any other lookup of the process', async () => {
    const timeoutMs = 300;
    const sends = Array.from({ length: 8 }, async (_, i) => {
      const started = Date.now();
      const result = await outcome(safeFetch(`https://hook${i}.silent.example.com/x`, { timeoutMs, maxResponseBytes: 100, dnsServers: silent.servers }));
      return { result, ms: Date.now() - started };
    });
    const timed = async () => {
      const started = Date.now();
      await lookup('localhost');
      return Date.now() - started;
    };
    // Another lookup while the silent ones run, and one after they were given up (when abandoned
    // getaddrinfo calls would still hold the pool's DNS threads, for seconds).
    const during = await timed();
    const ended = await Promise.all(sends);
    const after = await timed();
    for (const { result, ms } of ended) {
      expect(result).toBe(`timeout: no complete answer within ${timeoutMs} ms`);
      expect(ms).toBeLessThan(timeoutMs + 700);
    }
    expect(during).toBeLessThan(500);
    expect(after).toBeLessThan(500);
    // They were asked of the silent server (A and AAAA each), not of the system's resolver.
    expect(new Set(silent.queries.filter((q) => q.includes('.silent.example.com')))).toEqual(
      new Set(Array.from({ length: 8 }, (_, i) => [`hook${i}.silent.example.com A`, `hook${i}.silent.example.com AAAA`]).flat()),
    );
  });

  it('cancels the queries on abort, long before the name server\'s own timeout', async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('time limit')), 100);
    const started = Date.now();
    await expect(dnsResolver(silent.servers)('cancelled.silent.example.com', controller.signal)).rejects.toMatchObject({ code: 'ECANCELLED' });
    expect(Date.now() - started).toBeLessThan(1_000);
  });
});
