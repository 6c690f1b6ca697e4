/**
 * The one guard for every URL the gateway will fetch or post to on a client's behalf (webhook
 * `callback_url`s, media input URLs): parsed once, the host normalized, then classified. The same
 * classification runs again on every resolved address at send time (`isPublicAddress`), so a name
 * that resolves to a private address is refused then too.
 *
 * Normalization before classifying: lower case, trailing dots removed (`localhost.` is localhost),
 * IDNA to punycode and IPv4 shorthand forms (`127.1`, `0x7f.1`, `2130706433`) by the WHATWG URL
 * parser, IPv4-mapped IPv6 (`[::ffff:127.0.0.1]`) to its IPv4 address.
 */
import ipaddr from 'ipaddr.js';

export type OutboundUrlProblem =
  | 'not_https'
  | 'malformed'
  | 'empty_host'
  | 'credentials'
  | 'bad_port'
  | 'internal_name'
  | 'non_public_address';

export class OutboundUrlError extends Error {
  constructor(
    readonly problem: OutboundUrlProblem,
    message: string,
  ) {
    super(message);
    this.name = 'OutboundUrlError';
  }
}

export interface OutboundUrl {
  url: URL;
  /** `https:`, or `http:` for a loopback receiver the operator allows (ALLOW_PRIVATE_TARGETS). */
  protocol: 'https:' | 'http:';
  /** Normalized host: lower case, no trailing dot, punycode; IP literals without brackets. */
  host: string;
  port: number;
  /** Set when the host is an IP literal. */
  address?: string;
}

/** Suffixes of names that never leave a private network. */
const INTERNAL_SUFFIXES = ['.localhost', '.local', '.internal', '.intranet', '.lan', '.home.arpa', '.corp', '.private'];

/** Whether an IP address is a public unicast one (not loopback, private, link-local, CGNAT, unique-local, multicast, reserved, …). */
export function isPublicAddress(address: string): boolean {
  if (!ipaddr.isValid(address)) return false;
  const parsed = ipaddr.process(address); // IPv4-mapped IPv6 becomes IPv4
  if (parsed.range() !== 'unicast') return false;
  // IPv6: global unicast (2000::/3) only. ipaddr.js calls much else `unicast`, such as the
  // deprecated IPv4-compatible ::/96 (`::7f00:1` is 127.0.0.1 to some stacks).
  return parsed.kind() === 'ipv4' || (parsed as ipaddr.IPv6).match(GLOBAL_UNICAST_V6);
}

const GLOBAL_UNICAST_V6: [ipaddr.IPv6, number] = [ipaddr.IPv6.parse('2000::'), 3];

/** Whether a normalized host is this machine: a loopback address or `localhost` (and its subdomains). */
function isLoopbackHost(host: string): boolean {
  if (ipaddr.isValid(host)) return ipaddr.process(host).range() === 'loopback';
  return host === 'localhost' || host.endsWith('.localhost');
}

/** What a refusal of a receiver on this machine adds: the operator's switch that allows one (a developer's machine). */
const ONLY_WITH_PRIVATE_TARGETS = ' (a receiver on the gateway\'s own machine, as in development, needs the server started with ALLOW_PRIVATE_TARGETS=1)';

/** A URL's host as it is classified: brackets of an IPv6 address off, lower case, trailing dots off. */
function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, '').toLowerCase().replace(/\.+$/, '');
}

/** Whether `raw` parses to a URL whose host is this machine (for the hint above). */
function isLoopbackUrl(raw: string): boolean {
  return URL.canParse(raw) && isLoopbackHost(hostOf(new URL(raw)));
}

/**
 * Parses and checks an outbound URL: `https://` with a non-empty host, no user info, a usable port,
 * and a host that is public. `allowPrivate` (ALLOW_PRIVATE_TARGETS, for on-premises receivers and
 * development) lifts the last rule, and also accepts plain `http://` to a loopback host — a
 * receiver on the developer's own machine; anything else stays https-only.
 */
export function parseOutboundUrl(raw: string, opts: { allowPrivate?: boolean } = {}): OutboundUrl {
  // The WHATWG parser forgives `https:example.com` and `https:///path`; a URL we call must be written out.
  const http = /^http:\/\/[^/?#\\]/i.test(raw);
  if (!/^https:\/\/[^/?#\\]/i.test(raw) && !(http && opts.allowPrivate)) {
    if (/^https:/i.test(raw) || (opts.allowPrivate && /^http:/i.test(raw))) throw new OutboundUrlError('empty_host', 'the URL must be written https://host/…, with a host');
    if (opts.allowPrivate) throw new OutboundUrlError('not_https', 'only https URLs are accepted (and http:// to this machine, with ALLOW_PRIVATE_TARGETS)');
    throw new OutboundUrlError('not_https', `only https URLs are accepted${http && isLoopbackUrl(raw) ? ONLY_WITH_PRIVATE_TARGETS : ''}`);
  }
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new OutboundUrlError('malformed', 'the URL cannot be parsed');
  }
  if (url.username !== '' || url.password !== '') throw new OutboundUrlError('credentials', 'the URL must not carry a user name or password');
  const host = hostOf(url);
  if (host === '') throw new OutboundUrlError('empty_host', 'the URL has no host');
  const protocol = http ? 'http:' : 'https:';
  if (http && !isLoopbackHost(host)) throw new OutboundUrlError('not_https', `plain http is accepted for this machine only (localhost, 127.0.0.1, ::1), not '${host}'`);
  const port = url.port === '' ? (http ? 80 : 443) : Number(url.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new OutboundUrlError('bad_port', `port ${url.port} cannot be used`);

  if (ipaddr.isValid(host)) {
    if (!opts.allowPrivate && !isPublicAddress(host)) {
      throw new OutboundUrlError('non_public_address', `${host} is a ${ipaddr.process(host).range()} address, not a public one${isLoopbackHost(host) ? ONLY_WITH_PRIVATE_TARGETS : ''}`);
    }
    return { url, protocol, host, port, address: ipaddr.process(host).toString() };
  }
  if (!opts.allowPrivate) {
    // A single label (`intranet`) is completed by the resolver's search domains: internal.
    if (!host.includes('.') || host === 'localhost' || INTERNAL_SUFFIXES.some((s) => host.endsWith(s))) {
      throw new OutboundUrlError('internal_name', `'${host}' is not a public host name${isLoopbackHost(host) ? ONLY_WITH_PRIVATE_TARGETS : ''}`);
    }
  }
  return { url, protocol, host, port };
}
