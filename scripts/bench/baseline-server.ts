/**
 * The framework-free reference for the poll: bare node:http, the bearer key checked against an
 * in-memory map (the app's key cache makes its auth query-free too), the same SELECT by id and
 * account over a pg.Pool of the same size, and the row as JSON.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { countRequest } from './query-counter.ts';

export interface BaselineServer {
  port: number;
  close(): Promise<void>;
}

const TASK_PATH = /^\/v1\/videos\/([A-Za-z0-9_]+)$/;

export async function startBaselineServer(databaseUrl: string, poolMax: number, keys: Map<string, string>): Promise<BaselineServer> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: poolMax, application_name: 'mediagate-bench-baseline' });
  pool.on('error', () => undefined);
  const send = (res: import('node:http').ServerResponse, status: number, body: unknown) => {
    const json = JSON.stringify(body);
    res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(json), 'Cache-Control': 'no-store' });
    res.end(json);
  };
  const server: Server = createServer((req, res) => {
    countRequest();
    const id = req.method === 'GET' ? TASK_PATH.exec(req.url ?? '')?.[1] : undefined;
    if (!id) return send(res, 404, { error: { code: 'not_found' } });
    const token = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1];
    const accountId = token === undefined ? undefined : keys.get(token);
    if (!accountId) return send(res, 401, { error: { code: 'invalid_api_key' } });
    pool
      .query('select * from video_tasks where id = $1 and account_id = $2', [id, accountId])
      .then((result) => (result.rows[0] ? send(res, 200, result.rows[0]) : send(res, 404, { error: { code: 'task_not_found' } })))
      .catch(() => send(res, 500, { error: { code: 'internal_error' } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await pool.end();
    },
  };
}
