/**
 * Requests to URLs a client gave us (webhook receivers; media input URLs), safe against SSRF at
 * send time, not only when the URL was accepted:
 *
 *   1. the URL passes the one outbound-URL guard (`parseOutboundUrl`: https — or http to this
 *      machine when the operator allows private targets —, a real host, a usable port, not an
 *      internal name or a non-public IP literal);
 *   2. the host is resolved once and EVERY address checked (`isPublicAddress`): one private address
 *      among public ones refuses the request (how names are resolved: below);
 *   3. the connection goes to the checked addresses (a `lookup` that answers from them), so DNS
 *      rebinding between check and connect is impossible; TLS still verifies the host name;
 *   4. no proxy (a fresh agent, never the environment's), no redirect followed (a 3xx is an answer),
 *      one time limit over the whole exchange (the lookup included), a status outside 100–599 or a
 *      switch of protocols (101) taken for no answer, and the answer's body read up to a byte limit.
 *
 * `allowPrivate` (the operator's ALLOW_PRIVATE_TARGETS, for on-premises receivers) lifts the
 * address rules, never the others. Every failure is a `SafeFetchError` with a stable class.
 *
 * Names are asked of DNS directly (c-ares, A and AAAA at once, each name server given 5 s and asked
 * twice, as glibc does), not through the system's getaddrinfo (`dns.lookup`): getaddrinfo runs on
 * libuv's thread pool, where DNS may hold at most 2 of its 4 threads, and a lookup abandoned at the
 * time limit keeps its thread until the system resolver gives up (5 s per try and server). A
 * client's names whose DNS never answers would hold every one of them, and every other lookup of
 * the process (other tenants' receivers, upstream and storage connections) would wait behind them.
 * A c-ares query is a socket on the event loop, cancelled when the time limit or the caller's abort
 * ends the request.
 * What users see of it: a name is found as public DNS has it; an entry of the hosts file
 * (/etc/hosts) or a search domain is not applied to it. Only the names the outbound-URL guard
 * counts as internal (`localhost`, a single label, `.internal`, `.local`, …), which it accepts only
 * with `allowPrivate`, go to the system (hosts file, search domains, mDNS): they are the operator's
 * own, served by the operator's files and name servers, not by a server a client could keep silent.
 * An IP literal needs no lookup.
 */
import { lookup as systemLookup, Resolver as DnsChannel } from 'node:dns/promises';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import type { Duplex } from 'node:stream';
import ipaddr from 'ipaddr.js';
import { isPublicAddress, OutboundUrlError, parseOutboundUrl, type OutboundUrl } from './outbound-url.ts';

export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/** Resolves a host to every address it has; `signal` ends the lookup early (a resolver may ignore it). */
export type Resolver = (host: string, signal?: AbortSignal) => Promise<ResolvedAddress[]>;

/** Why no answer came: the classes operators see on an attempt (and metrics count). */
export type SafeFetchErrorClass = 'timeout' | 'connect_failed' | 'tls_error' | 'dns_failure' | 'blocked_address' | 'invalid_url' | 'protocol_error';

export class SafeFetchError extends Error {
  /** The message with what only the operator may see (a refused name's addresses): logs and admin views. */
  readonly detail: string;

  constructor(
    readonly errorClass: SafeFetchErrorClass,
    message: string,
    options?: { cause?: unknown; detail?: string },
  ) {
    super(message, options);
    this.name = 'SafeFetchError';
    this.detail = options?.detail ?? message;
  }
}

export interface SafeFetchOptions {
  method?: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** One limit over resolve, connect, send and the whole answer. */
  timeoutMs: number;
  allowPrivate?: boolean;
  /** The caller's abort (lease lost, shutdown): rethrown as its own reason, not a SafeFetchError. */
  signal?: AbortSignal;
  /** Test seam: the resolver (default: DNS, or the system's for internal names; see the file's header). */
  resolve?: Resolver;
  /** Test seam: the name servers the default resolver asks (default: the system's, /etc/resolv.conf). */
  dnsServers?: readonly string[];
  /** Test seam: extra trusted CAs (default: Node's, plus NODE_EXTRA_CA_CERTS). */
  ca?: string | string[];
  /** Test seam: addresses that count as public (a loopback server playing a public host). */
  treatAsPublic?: readonly string[];
}

export interface SafeResponse {
  status: number;
  headers: IncomingHttpHeaders;
  /** At most `maxResponseBytes` of the answer's body. */
  body: Buffer;
  /** The answer had more than `maxResponseBytes` (the rest was not read). */
  truncated: boolean;
}

/** How long each name server is given to answer (glibc's default too); the request's time limit cancels sooner. */
const DNS_SERVER_TIMEOUT_MS = 5_000;

/**
 * A resolver that asks DNS directly (c-ares: no thread of libuv's pool), A and AAAA at once, IPv4
 * addresses first. A channel of its own per lookup, so that an abort cancels this lookup's queries
 * and no one else's. Either family may fail alone (a server that answers A and not AAAA): only the
 * addresses that came are checked and connected to.
 */
export function dnsResolver(servers?: readonly string[]): Resolver {
  return async (host, signal) => {
    signal?.throwIfAborted();
    const channel = new DnsChannel({ timeout: DNS_SERVER_TIMEOUT_MS, tries: 2 });
    if (servers) channel.setServers(servers);
    const cancel = () => channel.cancel();
    signal?.addEventListener('abort', cancel, { once: true });
    try {
      const [v4, v6] = await Promise.allSettled([channel.resolve4(host), channel.resolve6(host)]);
      const addresses: ResolvedAddress[] = [
        ...(v4.status === 'fulfilled' ? v4.value.map((address) => ({ address, family: 4 as const })) : []),
        ...(v6.status === 'fulfilled' ? v6.value.map((address) => ({ address, family: 6 as const })) : []),
      ];
      const failures = [v4, v6].flatMap((r) => (r.status === 'rejected' ? [r.reason as { code?: string }] : []));
      // Neither family came: the telling failure (no such name, a timeout) over "no record of this family".
      if (addresses.length === 0 && failures.length > 0) throw failures.find((e) => e.code !== 'ENODATA') ?? failures[0];
      return addresses;
    } finally {
      signal?.removeEventListener('abort', cancel);
    }
  };
}

/** The system's resolver (getaddrinfo: hosts file, search domains, nsswitch), for internal names only. */
const systemResolver: Resolver = async (host) => (await systemLookup(host, { all: true, order: 'verbatim' })) as ResolvedAddress[];

/** Whether the outbound-URL guard counts a (normalized, non-IP) host as internal: the guard's own rule, asked of it. */
function isInternalName(host: string): boolean {
  try {
    parseOutboundUrl(`https://${host}/`);
    return false;
  } catch (err) {
    return err instanceof OutboundUrlError && err.problem === 'internal_name';
  }
}

/**
 * Checks the URL and resolves its host to addresses that may be connected to; throws
 * `invalid_url`, `blocked_address` or `dns_failure`. `signal` ends the lookup.
 */
export async function resolveTarget(
  raw: string,
  opts: Pick<SafeFetchOptions, 'allowPrivate' | 'resolve' | 'dnsServers' | 'treatAsPublic' | 'signal'> = {},
): Promise<{ target: OutboundUrl; addresses: ResolvedAddress[] }> {
  const isPublic = (address: string) => isPublicAddress(address) || (opts.treatAsPublic?.includes(address) ?? false);
  let target: OutboundUrl;
  try {
    try {
      target = parseOutboundUrl(raw, { allowPrivate: opts.allowPrivate });
    } catch (err) {
      // An IP literal the test seam counts as public passes; every other rule still holds.
      const literal = parseOutboundUrl(raw, { allowPrivate: true });
      if (!(err instanceof OutboundUrlError && err.problem === 'non_public_address' && literal.address && isPublic(literal.address))) throw err;
      target = literal;
    }
  } catch (err) {
    if (!(err instanceof OutboundUrlError)) throw err;
    const blocked = err.problem === 'internal_name' || err.problem === 'non_public_address';
    throw new SafeFetchError(blocked ? 'blocked_address' : 'invalid_url', `refused target: ${err.message}`);
  }
  if (target.address) return { target, addresses: [{ address: target.address, family: target.address.includes(':') ? 6 : 4 }] };

  // Internal names reach this point only when the operator allows private targets (parseOutboundUrl).
  const resolve = opts.resolve ?? (isInternalName(target.host) ? systemResolver : dnsResolver(opts.dnsServers));
  let addresses: ResolvedAddress[];
  try {
    addresses = await resolve(target.host, opts.signal);
  } catch (err) {
    throw new SafeFetchError('dns_failure', `'${target.host}' could not be resolved (${(err as { code?: string }).code ?? 'lookup failed'})`, { cause: err });
  }
  if (addresses.length === 0) throw new SafeFetchError('dns_failure', `'${target.host}' has no address`);
  if (!opts.allowPrivate) {
    const refused = addresses.filter((a) => !isPublic(a.address));
    if (refused.length > 0) {
      // Neither which address nor what kind: the message reaches the client, who could otherwise map
      // the operator's internal names by their ranges; the addresses go to `detail` (logs, admin views).
      const rangeOf = (address: string) => (ipaddr.isValid(address) ? ipaddr.process(address).range() : 'invalid');
      const described = (a: ResolvedAddress) => `${a.address} (${rangeOf(a.address)})`;
      // A name may resolve to dozens of addresses: a few are named, more are counted.
      const list = refused.length <= 3 ? refused.map(described).join(', ') : `${refused.length} addresses, first: ${described(refused[0]!)}`;
      throw new SafeFetchError('blocked_address', `refused target: '${target.host}' resolves to a non-public address`, {
        detail: `refused target: '${target.host}' resolves to ${list}, not a public address`,
      });
    }
  }
  return { target, addresses };
}

/**
 * Opens a request to a checked URL and returns the answer's head with its body unread (a stream the
 * caller must consume or destroy). Redirects are answers like any other.
 */
export async function safeRequest(raw: string, opts: SafeFetchOptions): Promise<{ res: IncomingMessage; signal: AbortSignal }> {
  const timeout = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
  const fail = (err: unknown): never => {
    if (opts.signal?.aborted) throw opts.signal.reason ?? err;
    if (timeout.aborted) throw new SafeFetchError('timeout', `no complete answer within ${opts.timeoutMs} ms`, { cause: err });
    throw err instanceof SafeFetchError ? err : classify(err);
  };
  try {
    // The lookup is under the time limit and the caller's abort too: raced, and cancelled where the
    // resolver can be (DNS; the system's getaddrinfo cannot be, see the file's header).
    const { target, addresses } = await untilAborted(resolveTarget(raw, { ...opts, signal }), signal);
    // Answers from the checked addresses only: no second lookup that DNS could answer differently.
    const lookup: LookupFunction = (_host, options, callback) => {
      if (options.all) return (callback as (err: null, all: ResolvedAddress[]) => void)(null, addresses);
      callback(null, addresses[0]!.address, addresses[0]!.family);
    };
    // Plain http only ever reaches a loopback receiver the operator allowed (parseOutboundUrl).
    const transport = target.protocol === 'http:' ? http : https;
    // Raced against the time limit and the caller's abort: whatever Node emits (or never does), the limit holds.
    const answer = new Promise<IncomingMessage>((resolve, reject) => {
      const req = transport.request(
        {
          method: opts.method ?? 'GET',
          host: target.host,
          port: target.port,
          path: `${target.url.pathname}${target.url.search}`,
          headers: opts.body === undefined ? opts.headers : { ...opts.headers, 'content-length': String(Buffer.byteLength(opts.body)) },
          lookup,
          ...(target.protocol === 'https:' && { servername: target.address ? undefined : target.host }),
          agent: false, // never a proxy, never a pooled connection to somewhere else
          ca: opts.ca,
          signal,
        },
        resolve,
      );
      req.on('error', reject);
      // A 101 with `Upgrade` is taken for a switch of protocols, which no request of ours asks for; without
      // this listener Node drops the socket and emits neither 'response' nor 'error'.
      req.on('upgrade', (upgraded: IncomingMessage, socket: Duplex) => {
        socket.destroy();
        reject(new SafeFetchError('protocol_error', `the receiver switched protocols (HTTP ${upgraded.statusCode ?? 101}), which the request did not ask for`));
      });
      // Ended without an answer or an error (after 'response' or 'error' this settles nothing).
      req.on('close', () => reject(new SafeFetchError('protocol_error', 'the connection closed without an answer')));
      req.end(opts.body);
    });
    const res = await untilAborted(answer, signal);
    // Node's parser takes any three digits as a status (999, 000): outside HTTP's 100–599 it is no answer.
    if (res.statusCode === undefined || res.statusCode < 100 || res.statusCode > 599) {
      res.destroy();
      throw new SafeFetchError('protocol_error', `the receiver's answer is not valid HTTP (status ${res.statusCode ?? 'missing'})`);
    }
    return { res, signal };
  } catch (err) {
    return fail(err);
  }
}

/** `safeRequest`, then at most `maxResponseBytes` of the body read (the rest dropped unread). */
export async function safeFetch(raw: string, opts: SafeFetchOptions & { maxResponseBytes: number }): Promise<SafeResponse> {
  const { res, signal } = await safeRequest(raw, opts);
  const chunks: Buffer[] = [];
  let size = 0;
  let truncated = false;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      const room = opts.maxResponseBytes - size;
      if (chunk.length >= room) {
        if (room > 0) chunks.push(chunk.subarray(0, room));
        size = opts.maxResponseBytes;
        truncated = chunk.length > room;
        if (truncated) break;
        continue;
      }
      chunks.push(chunk);
      size += chunk.length;
    }
  } catch (err) {
    if (opts.signal?.aborted) throw opts.signal.reason ?? err;
    // The status line arrived: a body cut short (or too slow) does not change the answer.
    if (!signal.aborted && !(err instanceof Error && /aborted|ECONNRESET/i.test(err.message))) throw classify(err);
  } finally {
    res.destroy();
  }
  return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), truncated };
}

function classify(err: unknown): SafeFetchError {
  const code = String((err as { code?: unknown }).code ?? '');
  const message = err instanceof Error ? err.message : String(err);
  if (code.startsWith('HPE_')) return new SafeFetchError('protocol_error', `the receiver's answer is not valid HTTP (${code})`, { cause: err });
  // Only the message's first clause: the altname mismatch goes on to list every name of the certificate.
  if (/CERT|SSL|TLS|SELF_SIGNED|UNABLE_TO_(GET|VERIFY)/.test(code)) return new SafeFetchError('tls_error', `TLS failed: ${message.split(': ')[0]!.slice(0, 200)} (${code})`, { cause: err });
  return new SafeFetchError('connect_failed', `the connection failed: ${code || message}`, { cause: err });
}

/** `promise`, or the signal's reason as soon as it aborts (the work behind `promise` is left to finish unheard). */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
