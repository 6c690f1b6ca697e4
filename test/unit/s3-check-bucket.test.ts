/**
 * S3MediaStore.checkBucket, the start's check of the bucket (main.ts): how it reads each answer
 * of S3's ListObjectsV2 (AWS's documented error codes and its `x-amz-bucket-region` header) from a
 * server on loopback that answers as S3 does, and a plain web server's 404.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';

type Answer = { status: number; headers?: Record<string, string>; body?: string };
let answer: Answer = { status: 200 };
const seen: string[] = [];
let server: Server;
let endpoint: string;

const s3Error = (code: string, message: string) => `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${message}</Message><RequestId>R1</RequestId></Error>`;
const LISTING = `<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>media</Name><Prefix>prod/</Prefix><KeyCount>0</KeyCount><MaxKeys>1</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>`;

beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push(req.url ?? '');
    res.writeHead(answer.status, { 'Content-Type': 'application/xml', 'x-amz-request-id': 'R1', ...answer.headers });
    res.end(answer.body ?? '');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

async function check(a: Answer, prefix = 'prod/') {
  answer = a;
  const store = new S3MediaStore({ bucket: 'media', region: 'us-east-1', endpoint, forcePathStyle: true, prefix, credentials: { accessKeyId: 'k', secretAccessKey: 's' } });
  try {
    return await store.checkBucket(5_000);
  } finally {
    store.close();
  }
}

it('lists one key under the prefix, as the media sweeper does (a policy on the prefix alone passes)', async () => {
  seen.length = 0;
  expect(await check({ status: 200, body: LISTING })).toEqual({ outcome: 'ok' });
  const url = new URL(seen.at(-1)!, endpoint);
  expect([url.pathname, url.searchParams.get('list-type'), url.searchParams.get('max-keys'), url.searchParams.get('prefix')]).toEqual(['/media/', '2', '1', 'prod/']);
});

it('refuses what no retry changes, saying which', async () => {
  expect(await check({ status: 404, body: s3Error('NoSuchBucket', 'The specified bucket does not exist') })).toEqual({ outcome: 'refused', reason: "the S3 bucket 'media' does not exist" });
  expect(await check({ status: 403, body: s3Error('AccessDenied', 'Access Denied') })).toEqual({
    outcome: 'refused',
    reason: "the S3 store refused to list the S3 bucket 'media' under 'prod/' (403 AccessDenied: the credentials, or a policy without s3:ListBucket)",
  });
  // A request signed for another region: a 301, or a 400 AuthorizationHeaderMalformed, both naming the bucket's region.
  for (const [status, code] of [
    [301, 'PermanentRedirect'],
    [400, 'AuthorizationHeaderMalformed'],
  ] as const) {
    expect(await check({ status, headers: { 'x-amz-bucket-region': 'eu-west-2' }, body: s3Error(code, 'wrong region') })).toEqual({
      outcome: 'refused',
      reason: "the S3 bucket 'media' is in region eu-west-2, not the one the requests were signed for (S3_REGION)",
    });
  }
  // A web server, not an S3 API (a mistyped S3_ENDPOINT).
  const web = await check({ status: 404, headers: { 'Content-Type': 'text/html' }, body: '<html><body>Not Found</body></html>' });
  expect(web).toMatchObject({ outcome: 'refused', reason: expect.stringMatching(/^S3_ENDPOINT answered 404 to a listing of the S3 bucket 'media': it does not look like an S3 API endpoint$/) });
});

it('cannot tell from a store that fails for now (5xx) or does not answer in time: unknown, never refused', async () => {
  expect(await check({ status: 503, body: s3Error('SlowDown', 'Reduce your request rate') })).toMatchObject({ outcome: 'unknown' });
  const dead = new S3MediaStore({ bucket: 'media', region: 'us-east-1', endpoint: 'http://127.0.0.1:9', forcePathStyle: true, credentials: { accessKeyId: 'k', secretAccessKey: 's' } });
  try {
    expect(await dead.checkBucket(5_000)).toMatchObject({ outcome: 'unknown', reason: expect.stringMatching(/ECONNREFUSED/) });
  } finally {
    dead.close();
  }
});
