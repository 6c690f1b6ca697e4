// s3rver ships no types: its declaration is named here, so that every program that compiles this
// file (the build's, through scripts/bench.ts, includes no other test file) finds it.
/// <reference path="./s3rver.d.ts" />
/**
 * An S3-compatible server on loopback for the tests (s3rver, from npm: no Docker, no network),
 * with one bucket, and an S3MediaStore on it. s3rver does not check signatures (any credentials
 * and any presigned signature pass), so tests check what Mediagate signs, not S3's enforcement.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import S3rver from 's3rver';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';

export interface TestS3 {
  endpoint: string;
  bucket: string;
  /** Environment for a server process using this bucket. */
  env(prefix?: string): Record<string, string>;
  store(prefix?: string): S3MediaStore;
  close(): Promise<void>;
}

export async function startTestS3(bucket = 'mediagate-test'): Promise<TestS3> {
  const directory = mkdtempSync(join(tmpdir(), 'mg-s3rver-'));
  const server = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory, configureBuckets: [{ name: bucket, configs: [] }] });
  const address = (await server.run()) as { port: number };
  const endpoint = `http://127.0.0.1:${address.port}`;
  const stores: S3MediaStore[] = [];
  return {
    endpoint,
    bucket,
    env: (prefix = '') => ({
      MEDIA_STORE: 's3',
      S3_BUCKET: bucket,
      S3_REGION: 'us-east-1',
      S3_ENDPOINT: endpoint,
      S3_FORCE_PATH_STYLE: '1',
      S3_PREFIX: prefix,
      AWS_ACCESS_KEY_ID: 'S3RVER',
      AWS_SECRET_ACCESS_KEY: 'S3RVER',
    }),
    store: (prefix = '') => {
      const store = new S3MediaStore({ bucket, region: 'us-east-1', endpoint, forcePathStyle: true, prefix, credentials: { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' } });
      stores.push(store);
      return store;
    },
    close: async () => {
      for (const store of stores) store.close();
      await server.close();
      rmSync(directory, { recursive: true, force: true });
    },
  };
}
