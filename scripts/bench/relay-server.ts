/**
 * Framework-free reference gateways for the proxy bench: what the least any Node gateway adds to
 * a synchronous image call on this machine, measured in the same run as Mediagate. Run as its own
 * process (like the server): `relay-server.ts <upstream base URL> <mode> [database URL]`; it prints
 * its URL on stdout.
 *
 *   relay     bare node:http in, undici out on one keep-alive pool, the upstream's answer streamed
 *             back unchanged (one extra hop, nothing else);
 *   hold      the relay with one INSERT before the upstream call, committed as Mediagate's hold of
 *             a synchronous image is (without waiting for the WAL flush): the least any gateway
 *             adds that places its credit hold in PostgreSQL before it calls the upstream (design
 *             §5), with nothing recorded or stored after the call;
 *   durable   the least a gateway that bills and keeps the image does: parse the request, one
 *             committed INSERT (the hold and the task), the upstream call, parse the answer,
 *             decode the image and write it to disk (one write and a rename), one committed UPDATE
 *             (the settlement), and the answer encoded again. The INSERT commits as Mediagate's
 *             hold of a synchronous image does, without waiting for the WAL flush (HoldCommit in
 *             ledger.repository.ts); the UPDATE waits for it. A `stream: true` request: the
 *             INSERT, then the upstream's event stream relayed as it arrives, then the committed
 *             UPDATE (the floor of the time to the first partial image). No auth, validation,
 *             routing or ledger: a floor, not a gateway.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { rename, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { Agent, request } from 'undici';

export type RelayMode = 'relay' | 'hold' | 'durable';

const TABLE = 'bench_relay_tasks';

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

async function main(): Promise<void> {
  const [upstream, mode, databaseUrl] = process.argv.slice(2) as [string, RelayMode, string | undefined];
  const agent = new Agent({ keepAliveTimeout: 30_000 });
  const dir = join(tmpdir(), `mediagate-bench-relay-${process.pid}`);
  const pool = mode !== 'relay' ? new pg.Pool({ connectionString: databaseUrl, max: 10, application_name: 'mediagate-bench-relay' }) : undefined;
  if (pool) {
    mkdirSync(dir, { recursive: true });
    await pool.query(`create table if not exists ${TABLE} (id text primary key, account_id text not null, amount bigint not null, status text not null, file text)`);
  }
  const call = (body: Buffer, headers: IncomingMessage['headers']) =>
    request(`${upstream}/images/generations`, {
      method: 'POST',
      dispatcher: agent,
      headers: { authorization: 'Bearer sk-test', 'content-type': String(headers['content-type'] ?? 'application/json') },
      body,
    });

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const body = await readBody(req);
    const relay = async (up: Awaited<ReturnType<typeof call>>, fallbackType: string) => {
      res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? fallbackType) });
      for await (const chunk of up.body) res.write(chunk);
    };
    if (mode === 'relay') {
      await relay(await call(body, req.headers), 'application/json');
      res.end();
      return;
    }
    const input = JSON.parse(body.toString('utf8')) as { n?: number; stream?: boolean };
    const id = randomBytes(12).toString('hex');
    await pool!.query(
      `with t as (insert into ${TABLE} (id, account_id, amount, status) values ($1, 'acct', $2, 'processing') returning id)
       select set_config('synchronous_commit', 'off', true) from t`,
      [id, input.n ?? 1],
    );
    const up = await call(body, req.headers);
    if (mode === 'hold') {
      await relay(up, 'application/json');
      res.end();
      return;
    }
    if (input.stream === true) {
      await relay(up, 'text/event-stream');
      await pool!.query(`update ${TABLE} set status = 'completed' where id = $1`, [id]);
      res.end();
      return;
    }
    const answer = JSON.parse(await up.body.text()) as { created: number; data: { b64_json: string }[] };
    const images = answer.data.map((d) => Buffer.from(d.b64_json, 'base64'));
    const files = [];
    for (const [i, image] of images.entries()) {
      const path = join(dir, `${id}-${i}.png`);
      await writeFile(`${path}.tmp`, image);
      await rename(`${path}.tmp`, path);
      files.push(path);
    }
    await pool!.query(`update ${TABLE} set status = 'completed', file = $2 where id = $1`, [id, files.join(',')]);
    const json = JSON.stringify({ created: answer.created, data: images.map((image) => ({ b64_json: image.toString('base64') })) });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
    res.end(json);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(err));
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  process.stdout.write(`http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
  process.on('SIGTERM', () => {
    server.close();
    void agent.close();
    rmSync(dir, { recursive: true, force: true });
    void (pool ? pool.query(`drop table if exists ${TABLE}`).finally(() => pool.end()) : Promise.resolve()).finally(() => process.exit(0));
  });
}

void main();
