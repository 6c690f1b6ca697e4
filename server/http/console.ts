/**
 * The operator console at /console: the single-page app built from clients/console (a client of the
 * admin API, nothing more) by `npm run build:console` (run by `postinstall`). Only when ADMIN_TOKEN
 * is set (404 otherwise, like /admin). Hashed assets are served from dist/assets with a long cache;
 * every other GET under /console answers index.html, so client routes (/console/tasks/vid_…) load
 * on a reload or a shared link; a missing static file (`/console/favicon.ico`) is a 404. A missing
 * build answers a page that says how to build it.
 * The page's only back end is the same origin: the CSP allows scripts, styles and requests from it
 * alone (media from anywhere: presigned outputs live on another host).
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import express, { type NextFunction, type Request, type Response } from 'express';
import { ApiError } from '../errors.ts';

/** The console's build: from server/http/ in development and from dist/server/http/ when `npm start` runs the built server. */
export const CONSOLE_DIST = consoleDist();

function consoleDist(): string {
  const candidates = ['../../clients/console/dist', '../../../clients/console/dist'].map((rel) => fileURLToPath(new URL(rel, import.meta.url)));
  return candidates.find((dir) => existsSync(join(dir, 'index.html'))) ?? candidates[0]!;
}

const CSP = [
  "default-src 'self'",
  "script-src 'self'",
  // Mantine sets CSS variables and positions through style attributes and one <style> element.
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob: http: https:",
  "media-src 'self' blob: http: https:",
  "connect-src 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
  "form-action 'self'",
].join('; ');

const NOT_BUILT = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Mediagate console not built</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 4rem auto; padding: 0 1rem; color: #1a1b1e">
<h1>The console has not been built</h1>
<p>This server has no build of the operator console (<code>clients/console/dist</code> is missing).
Run <code>npm run build:console</code> in the Mediagate directory (<code>npm install</code> and <code>npm ci</code> run it too),
then reload this page. The admin API at <code>/admin/v1</code> works without it.</p>
</body></html>
`;

/** Paths that name a static file, never a client route (whose segments are ids and names). */
const ASSET_EXTENSION = /\.(?:m?js|css|map|json|png|jpe?g|gif|webp|svg|ico|woff2?|ttf|txt|webmanifest)$/i;

function securityHeaders(res: Response): void {
  res.setHeader('Content-Security-Policy', CSP);
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('Referrer-Policy', 'no-referrer');
  res.setHeader('X-Frame-Options', 'DENY');
}

/** The /console router; `enabled` is whether ADMIN_TOKEN is set. */
export function consoleRouter(enabled: boolean, dist = CONSOLE_DIST): express.Router {
  const router = express.Router();
  router.use((req: Request, res: Response, next: NextFunction) => {
    if (!enabled) return next(new ApiError(404, 'not_found', 'Not found.'));
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      return next(new ApiError(405, 'method_not_allowed', `The console answers GET and HEAD only, not ${req.method}.`, null, {}, { Allow: 'GET, HEAD' }));
    }
    securityHeaders(res);
    next();
  });
  router.use(
    '/assets',
    express.static(join(dist, 'assets'), { index: false, immutable: true, maxAge: '365d', fallthrough: true }),
    (_req: Request, _res: Response, next: NextFunction) => next(new ApiError(404, 'not_found', 'No such console asset.')),
  );
  router.use((req: Request, res: Response, next: NextFunction) => {
    // A file the page asks for (a script, a style, an icon) that is not there is a 404: answered with
    // the page, the browser would report a MIME type error instead of the missing file.
    if (ASSET_EXTENSION.test(req.path)) return next(new ApiError(404, 'not_found', 'No such console file.'));
    const index = join(dist, 'index.html');
    res.setHeader('Cache-Control', 'no-cache');
    if (!existsSync(index)) {
      res.status(503).type('html').send(NOT_BUILT);
      return;
    }
    res.sendFile(index, { headers: { 'Content-Type': 'text/html; charset=utf-8' } });
  });
  return router;
}
