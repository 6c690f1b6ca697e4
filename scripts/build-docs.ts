/**
 * `npm run docs`: writes the rendered API reference of generated/openapi.json, the page the server
 * answers at `/docs`, as one self-contained file (it loads nothing: open it offline, from
 * `file://`, or put it on any static host at any path).
 *
 * Usage: tsx scripts/build-docs.ts [--out <file>]   (default: dist/docs/index.html)
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, relative, resolve } from 'node:path';
import { renderDocsPage } from '../server/http/docs-page.ts';
import { openApiPath } from '../server/openapi.ts';

const root = resolve(import.meta.dirname, '..');
const args = process.argv.slice(2);
const outIndex = args.indexOf('--out');
const out = outIndex >= 0 ? args[outIndex + 1] : resolve(root, 'dist/docs/index.html');
if (out === undefined || out.startsWith('-') || args.length !== (outIndex >= 0 ? 2 : 0)) {
  console.error('usage: tsx scripts/build-docs.ts [--out <file>]   (default: dist/docs/index.html)');
  process.exit(2);
}

try {
  const target = resolve(out);
  const page = await renderDocsPage(readFileSync(openApiPath(), 'utf8'));
  mkdirSync(dirname(target), { recursive: true });
  writeFileSync(target, page);
  const shown = relative(process.cwd(), target);
  console.log(`wrote ${shown.startsWith('..') ? target : shown} (${Math.ceil(Buffer.byteLength(page) / 1024)} KiB)`);
} catch (err) {
  console.error(`docs: ${(err as Error).message}`);
  process.exit(1);
}
