import { randomBytes } from 'node:crypto';
import pg from 'pg';

// Helpers for short-lived databases (tests, codegen). They take an admin URL: any database on the
// server other than the one being created or dropped.

/** `url` with its database name replaced. */
export function withDatabaseName(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${encodeURIComponent(database)}`;
  return u.toString();
}

/** `<prefix>_<16 hex chars>`: unique per call, a valid unquoted identifier. */
export function scratchDatabaseName(prefix: string): string {
  return `${prefix}_${randomBytes(8).toString('hex')}`;
}

async function withAdminClient<T>(adminUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl, application_name: 'mediagate-admin' });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * CREATE DATABASE, optionally as a copy of `template`. PostgreSQL refuses to copy a template while
 * another session is connected to it (55006), e.g. a concurrent copy's own startup, so retry briefly.
 */
export async function createScratchDatabase(adminUrl: string, name: string, template?: string): Promise<void> {
  await withAdminClient(adminUrl, async (client) => {
    const statement = `create database ${client.escapeIdentifier(name)}${template ? ` template ${client.escapeIdentifier(template)}` : ''}`;
    for (let attempt = 1; ; attempt++) {
      try {
        await client.query(statement);
        return;
      } catch (err) {
        if ((err as { code?: string }).code !== '55006' || attempt >= 50) throw err;
        await new Promise((r) => setTimeout(r, 20 * Math.min(attempt, 10)));
      }
    }
  });
}

/** DROP DATABASE IF EXISTS, disconnecting leftover sessions (WITH (FORCE) on PostgreSQL 13+). */
export async function dropScratchDatabase(adminUrl: string, name: string): Promise<void> {
  await withAdminClient(adminUrl, async (client) => {
    const version = await client.query<{ v: string }>(`select current_setting('server_version_num') as v`);
    const force = Number(version.rows[0]?.v ?? 0) >= 130000;
    if (!force) {
      await client.query('select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()', [name]);
    }
    await client.query(`drop database if exists ${client.escapeIdentifier(name)}${force ? ' with (force)' : ''}`);
  });
}

/** Names of databases starting with `prefix` (to clean up after a crashed run). */
export async function listDatabases(adminUrl: string, prefix: string): Promise<string[]> {
  return withAdminClient(adminUrl, async (client) => {
    const res = await client.query<{ datname: string }>(
      `select datname from pg_database where starts_with(datname, $1) order by datname`,
      [prefix],
    );
    return res.rows.map((r) => r.datname);
  });
}
