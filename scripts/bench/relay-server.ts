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
 *   ledger    the durable relay with Mediagate's own two statements in place of its one-row ones,
 *             sent through Mediagate's repositories with their group commit: the hold
 *             (LedgerRepository.holdAndInsertTask with the row ImageService.start inserts for a
 *             synchronous image, unflushed) and the settlement (ImageTaskRepository.completeWhole
 *             with the file's row and the attempt's, as Settlement.completeImage sends it, flushed),
 *             the copy written through FilesystemMediaStore while the settlement runs, as the
 *             server writes it. What Mediagate's data model costs on this machine without the rest
 *             of Mediagate (Express, the contract's validation, auth, the pool, the adapter). The
 *             account, key and group it charges come in BENCH_LEDGER (JSON: accountId, apiKeyId,
 *             groupId, model, unitPrice).
 *   ledger-early  the ledger relay calling the upstream while its hold commits (both sent at once,
 *             the answer relayed only once both are back), instead of after the commit: what
 *             Mediagate's data model would cost if a synchronous image's upstream call did not
 *             wait for its hold (design §5 makes it wait: a refused hold would leave the operator
 *             paying the upstream for an answer nobody gets). A measurement, not a design: `npm
 *             run bench -- proxy --ledger-early` puts it in the ledger relay's place.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { rename, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { Agent, request, type Dispatcher } from 'undici';
import { createDatabase } from '../../server/db/database.ts';
import { newId } from '../../server/lib/ids.ts';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { ImageTaskRepository } from '../../server/repositories/image-task.repository.ts';
import { LedgerRepository } from '../../server/repositories/ledger.repository.ts';
import { storageKeyOf } from '../../server/services/file.service.ts';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';

export type RelayMode = 'relay' | 'hold' | 'durable' | 'ledger' | 'ledger-early';

const TABLE = 'bench_relay_tasks';

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** The decoded images encoded again as the upstream's JSON answer (both billing relays answer so). */
function answerJson(res: ServerResponse, created: number, images: readonly Buffer[]): void {
  const json = JSON.stringify({ created, data: images.map((image) => ({ b64_json: image.toString('base64') })) });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}

/** Whom the ledger relay charges, and for what (BENCH_LEDGER). */
export interface LedgerIds {
  accountId: string;
  apiKeyId: string;
  groupId: string;
  model: string;
  /** Micro-credits an image. */
  unitPrice: number;
}

/**
 * The ledger mode's request: Mediagate's hold, the upstream call, Mediagate's settlement with the
 * copies written while it runs, the answer (see the header). Rows as the server writes them for a
 * synchronous `b64_json` generation on an OpenAI member: the task (the fields ImageService.start
 * sets), the hold and its ledger entry; then the task completed, the hold captured whole, its
 * capture entry, a spend shard, each image's file row and the call's attempt row.
 */
function ledgerRelay(databaseUrl: string | undefined, ids: Partial<LedgerIds>, dir: string, early: boolean) {
  if (!databaseUrl || !ids.accountId || !ids.apiKeyId || !ids.groupId || !ids.model || !ids.unitPrice) {
    throw new Error('relay-server ledger: needs a database URL and BENCH_LEDGER (accountId, apiKeyId, groupId, model, unitPrice)');
  }
  const { accountId, apiKeyId, groupId, model, unitPrice } = ids;
  const db = createDatabase(databaseUrl, { applicationName: 'mediagate-bench-ledger' });
  const ledger = new LedgerRepository(db);
  const tasks = new ImageTaskRepository(db);
  const store = new FilesystemMediaStore(dir);
  return async (
    body: Buffer,
    call: () => Promise<Dispatcher.ResponseData<null>>,
    res: ServerResponse,
    relay: (up: Dispatcher.ResponseData<null>, fallbackType: string) => Promise<void>,
  ): Promise<void> => {
    const input = JSON.parse(body.toString('utf8')) as { prompt: string; n?: number; size?: string; output_format?: string; stream?: boolean; partial_images?: number };
    const n = input.n ?? 1;
    const taskId = newId('img');
    const quoted = unitPrice * n;
    const params = { size: input.size ?? '1024x1024', quality: 'auto', background: 'auto', moderation: 'auto', outputFormat: input.output_format ?? 'png', responseFormat: 'b64_json', stream: input.stream === true, partialImages: input.partial_images ?? 0, resize: 'exact' };
    const holding = ledger.holdAndInsertTask(
      { holdId: newId('hold'), accountId, apiKeyId, taskId, amount: quoted },
      {
        table: 'imageTasks',
        row: {
          id: taskId, accountId, apiKeyId, groupId, operation: 'generation', model, prompt: input.prompt,
          params: JSON.stringify(params), inputFileIds: [], maskFileId: null, n, unitPrice, quotedCredits: quoted, runAsync: false, attempt: 1,
          leaseOwner: 'bench-ledger-relay', leaseExpiresAt: new Date(Date.now() + 60_000), memberId: null, memberSlots: 1,
        },
      },
      undefined,
      'unflushed',
    );
    let startedAt: Date;
    let up: Dispatcher.ResponseData<null>;
    if (early) {
      // The upstream call goes out while the hold's statement runs; an answer that came back for a
      // hold that failed is read to its end, so that its connection serves the next call.
      startedAt = new Date();
      const [held, answered] = await Promise.allSettled([holding, call()]);
      const refusal = held.status === 'rejected' ? held.reason : held.value.outcome !== 'ok' ? new Error(`hold refused: ${held.value.outcome}`) : undefined;
      if (refusal !== undefined) {
        if (answered.status === 'fulfilled') await answered.value.body.dump();
        throw refusal;
      }
      if (answered.status === 'rejected') throw answered.reason;
      up = answered.value;
    } else {
      const { outcome } = await holding;
      if (outcome !== 'ok') throw new Error(`hold refused: ${outcome}`);
      startedAt = new Date();
      up = await call();
    }
    const fileOf = (bytes: number): FileRow => {
      const id = newId('file');
      return { id, accountId, purpose: 'image_output', contentType: 'image/png', bytes, storageKey: storageKeyOf('image_output', id), width: 1024, height: 1024, taskId, expiresAt: new Date(Date.now() + 30 * 86_400_000), filename: null };
    };
    const settle = (files: FileRow[]) =>
      tasks.completeWhole(
        {
          fence: { id: taskId, attempt: 1 },
          fileIds: files.map((f) => f.id),
          actualCredits: quoted,
          revisedPrompt: null,
          unrecorded: files,
          attempts: [{ taskId, step: 'generate', memberId: null, provider: 'openai', upstreamJobId: null, outcome: 'ok', error: null, startedAt, durationMs: Date.now() - startedAt.getTime() }],
        },
        (hold) => ledger.settlement(hold, quoted),
      );
    if (input.stream === true) {
      // The first partial is what this side measures: the events are relayed as they arrive, and
      // the settlement records the final images' rows without decoding or writing them.
      await relay(up, 'text/event-stream');
      if (!(await settle(Array.from({ length: n }, () => fileOf(0))))) throw new Error('the settlement did not complete the task');
      res.end();
      return;
    }
    const answer = JSON.parse(await up.body.text()) as { created: number; data: { b64_json: string }[] };
    const images = answer.data.map((d) => Buffer.from(d.b64_json, 'base64'));
    const files = images.map((image) => fileOf(image.length));
    // As the server does: the settlement's statement goes out first, the copies are written while it runs.
    const settling = settle(files);
    settling.catch(() => undefined);
    await new Promise((resolve) => setImmediate(resolve));
    const [done] = await Promise.all([settling, ...images.map((image, i) => store.put(files[i]!.storageKey, image))]);
    if (!done) throw new Error('the settlement did not complete the task');
    answerJson(res, answer.created, images);
  };
}

async function main(): Promise<void> {
  const [upstream, mode, databaseUrl] = process.argv.slice(2) as [string, RelayMode, string | undefined];
  const agent = new Agent({ keepAliveTimeout: 30_000 });
  const dir = join(tmpdir(), `mediagate-bench-relay-${process.pid}`);
  const pool = mode === 'hold' || mode === 'durable' ? new pg.Pool({ connectionString: databaseUrl, max: 10, application_name: 'mediagate-bench-relay' }) : undefined;
  const ledgerMode = mode === 'ledger' || mode === 'ledger-early';
  if (pool || ledgerMode) mkdirSync(dir, { recursive: true });
  if (pool) {
    await pool.query(`create table if not exists ${TABLE} (id text primary key, account_id text not null, amount bigint not null, status text not null, file text)`);
  }
  const call = (body: Buffer, headers: IncomingMessage['headers']) =>
    request(`${upstream}/images/generations`, {
      method: 'POST',
      dispatcher: agent,
      headers: { authorization: 'Bearer sk-test', 'content-type': String(headers['content-type'] ?? 'application/json') },
      body,
    });

  const ledger = ledgerMode ? ledgerRelay(databaseUrl, JSON.parse(process.env.BENCH_LEDGER ?? '{}') as Partial<LedgerIds>, dir, mode === 'ledger-early') : undefined;

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const body = await readBody(req);
    const relay = async (up: Awaited<ReturnType<typeof call>>, fallbackType: string) => {
      res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? fallbackType) });
      for await (const chunk of up.body) res.write(chunk);
    };
    if (ledger) {
      await ledger(body, () => call(body, req.headers), res, relay);
      return;
    }
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
    answerJson(res, answer.created, images);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      // An answer already begun (a relayed stream) is cut: its head cannot say 500 any more.
      if (res.headersSent) return void res.destroy(err as Error);
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
