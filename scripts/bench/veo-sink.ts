/**
 * For `bigbody`'s run of a task with 512 MiB of inputs: the least a Veo upstream (Gemini API
 * wire format, upstream-apis.md §4) must be to take such a job — it reads the whole
 * predictLongRunning body as it arrives and decodes every inline image with the project's
 * streaming JSON scanner (a body of 680 MiB cannot be JSON.parse'd: it is longer than a string may
 * be), counting the bytes; its operation is done at the first poll, and the video is a few KiB.
 * test/fakes/gemini.ts is the faithful fake for the adapter's tests; this one only has to read
 * bodies of any size.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { MediaJsonScanner, type MediaSink } from '../../server/lib/media-json-scanner.ts';

export interface VeoSink {
  /** Base URL of the API (a member's base_url). */
  url: string;
  /** Per submitted body: its bytes, and the decoded bytes of each inline image. */
  bodies: { bytes: number; images: number[] }[];
  close(): Promise<void>;
}

const IMAGE_PATHS = new Set(['instances[].image.bytesBase64Encoded', 'instances[].lastFrame.bytesBase64Encoded', 'instances[].referenceImages[].image.bytesBase64Encoded']);
const VIDEO = Buffer.alloc(64 * 1024, 7);

export async function startVeoSink(): Promise<VeoSink> {
  const bodies: VeoSink['bodies'] = [];
  let base = '';
  const submit = async (req: IncomingMessage, res: ServerResponse) => {
    const images: number[] = [];
    const scanner = new MediaJsonScanner(
      { base64Paths: IMAGE_PATHS },
      { maxMediaBytes: Number.MAX_SAFE_INTEGER, maxItemBytes: Number.MAX_SAFE_INTEGER, maxMediaCount: 1000, maxOtherBytes: 1 << 20, maxReferenceChars: 0 },
      (): MediaSink => {
        const index = images.push(0) - 1;
        return { write: (chunk) => void (images[index] = images[index]! + chunk.length), end: async () => `image-${index}`, abort: () => undefined };
      },
    );
    let bytes = 0;
    for await (const chunk of req) {
      bytes += (chunk as Buffer).length;
      await scanner.push(chunk as Buffer);
    }
    const rest = JSON.parse(scanner.end().toString('utf8')) as { instances?: unknown[] };
    if (!Array.isArray(rest.instances)) throw new Error('no instances');
    bodies.push({ bytes, images });
    send(res, 200, { name: `models/veo-3.1-generate-preview/operations/op${bodies.length}` });
  };
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://sink').pathname;
    const route = async () => {
      if (req.method === 'POST' && path.endsWith(':predictLongRunning')) return submit(req, res);
      if (req.method === 'GET' && path.includes('/operations/')) {
        const id = path.split('/').at(-1);
        return send(res, 200, { name: path, done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: `${base}/files/${id}:download?alt=media` } }] } } });
      }
      if (req.method === 'GET' && path.includes('/files/')) {
        res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': VIDEO.length });
        return void res.end(VIDEO);
      }
      send(res, 404, { error: { code: 404, message: 'not found', status: 'NOT_FOUND' } });
    };
    route().catch((err: unknown) => send(res, 400, { error: { code: 400, message: String(err), status: 'INVALID_ARGUMENT' } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1beta`;
  return { url: base, bodies, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

function send(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) return;
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}
