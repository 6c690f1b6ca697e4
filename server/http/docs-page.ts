/**
 * The rendered API reference: one self-contained HTML page (Redoc's standalone viewer and the
 * bundled contract inlined), the same bytes whether the server answers `GET /docs` or
 * `npm run docs` writes `dist/docs/index.html`. Nothing is fetched when it opens, so it works
 * offline, from `file://` and from any path of any static host.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { readFile } from 'node:fs/promises';

/**
 * Redoc's standalone bundle as @redocly/cli ships it: the file `redocly build-docs --inlineBundle`
 * inlines. The `redoc` package itself cannot be installed from the registry this project uses
 * (redoc 3 needs a @redocly/redoc-opentelemetry release it does not have).
 */
export function redocBundlePath(): string {
  const cli = createRequire(import.meta.url).resolve('@redocly/cli/package.json');
  return join(dirname(cli), 'lib/chunks/redoc.standalone.js');
}

/**
 * What the page may load: only itself. `redocly build-docs` output fetches its viewer from a CDN and
 * Redoc sends telemetry and loads its attribution logo from the network; here those requests are
 * never made (telemetry is off as well, so it does not even try), whatever a later Redoc adds.
 */
const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'unsafe-inline'",
  "style-src 'unsafe-inline'",
  'img-src data: blob:',
  'font-src data:',
  'worker-src blob:',
  "base-uri 'none'",
  "form-action 'none'",
].join('; ');

/**
 * `build-docs` hydrates server-rendered markup whose sidebar links are absolute (`/videos`): they
 * point outside the page on any other path and from `file://`. `init` renders in the browser with
 * hash routing (`#/videos/getvideo`), links relative to the page wherever it is.
 */
const REDOC_OPTIONS = { disableTelemetry: true };

/** Text that may sit inside a `<script>` element: no `</script` can end it early (what build-docs does too). */
function scriptSafe(js: string): string {
  return js.replace(/<\/(script)/gi, '<\\/$1');
}

/** JSON as a JavaScript expression inside `<script>`: `<` only occurs in strings, where `\u003c` means the same. */
function jsonInScript(json: string): string {
  return json.replace(/</g, '\\u003c').replace(/\u2028/g, '\\u2028').replace(/\u2029/g, '\\u2029');
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** The page for the bundled contract `specJson` (the text of generated/openapi.json). */
export async function renderDocsPage(specJson: string): Promise<string> {
  const spec = JSON.parse(specJson) as { info?: { title?: unknown } };
  const title = typeof spec.info?.title === 'string' ? spec.info.title : 'API reference';
  const bundle = await readFile(redocBundlePath(), 'utf8');
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="${CONTENT_SECURITY_POLICY}">
<title>${escapeHtml(title)}</title>
<style>body { margin: 0; padding: 0; }</style>
</head>
<body>
<noscript>This API reference needs JavaScript.</noscript>
<div id="redoc"></div>
<script type="module">
${scriptSafe(bundle)}
const definition = ${jsonInScript(JSON.stringify(spec))};
init(definition, ${JSON.stringify(REDOC_OPTIONS)}, document.getElementById('redoc'));
</script>
</body>
</html>
`;
}
