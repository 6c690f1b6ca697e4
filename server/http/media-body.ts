/**
 * JSON bodies with media inputs (`POST /v1/videos/generations` on both paths, JSON
 * `POST /v1/images/edits`), read as a stream (design §9): the media-json scanner decodes each data
 * URL as it arrives into the request's `InputStaging` (the media store), and `req.body` becomes the
 * small JSON that remains, validated against the contract as every other body. Limits hold while
 * reading; the first one passed answers at once (413, 400) without reading the rest, and so does
 * a media store that cannot take an input (507 `storage_full`, 503 `storage_unavailable`); a body
 * that stalls or drips is cut off (408 `body_timeout`). Once the request is answered (also to a
 * client that went away, mid-body or while its task was created), every staged input that no task
 * adopted is removed.
 *
 * Runs after authentication (the staged files belong to the key's account) and before the other
 * body parsers, which then see a parsed body and skip it.
 */
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import type { Readable } from 'node:stream';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { Logger } from '../logger.ts';
import { ApiError, badRequest } from '../errors.ts';
import type { FileService } from '../services/file.service.ts';
import { InputStaging } from '../services/media/input-staging.ts';
import { authOf } from './auth.ts';
import { MediaJsonScanner, type MediaJsonFields, type MediaJsonLimits } from '../lib/media-json-scanner.ts';
import { bodyDeadline } from './request-guards.ts';
import type { Schemas } from './types.ts';

/** Each path of the pairs mapped to the other. */
function aliasPairs(pairs: [string, string][]): ReadonlyMap<string, string> {
  return new Map(pairs.flatMap(([a, b]) => [[a, b] as const, [b, a] as const]));
}

/**
 * The media fields of a video creation: frames and reference images, aliases included (the same
 * data URL under both spellings is read, counted and stored once).
 */
export const VIDEO_MEDIA_FIELDS: MediaJsonFields = {
  dataUrlPaths: new Set(['firstFrame', 'first_frame', 'lastFrame', 'last_frame', 'referenceImages[]', 'reference_images[]']),
  aliases: aliasPairs([
    ['firstFrame', 'first_frame'],
    ['lastFrame', 'last_frame'],
    ['referenceImages[]', 'reference_images[]'],
  ]),
};

/**
 * The media fields of a JSON image edit: at most `maxImages` images and one mask, refused as the
 * one more arrives, as a multipart edit's files are (`400 too_many_images`). Each is a string or an
 * object in OpenAI's form (`{"image_url": …}`, `{"file_id": …}`), counted together.
 */
export function editMediaFields(maxImages: number): MediaJsonFields {
  const images = { max: maxImages, counter: 'images', tooMany: (param: string) => new ApiError(400, 'too_many_images', `Too many images: at most ${maxImages} images per request.`, param) };
  const mask = { max: 1, counter: 'mask', tooMany: (param: string) => badRequest('invalid_request', "Only one 'mask' is allowed.", param) };
  const forms = (path: string) => [path, `${path}.image_url`, `${path}.file_id`];
  return {
    dataUrlPaths: new Set([...forms('mask'), ...forms('images[]')]),
    maxCounts: new Map([...forms('images[]').map((p) => [p, images] as const), ...forms('mask').map((p) => [p, mask] as const)]),
  };
}

/** An input of a JSON edit as sent (a string, or OpenAI's object form) as its value and the param that names it. */
export function editInput(item: string | Schemas['ImageReference'], param: string): { value: string; param: string } {
  if (typeof item === 'string') return { value: item, param };
  return item.image_url !== undefined ? { value: item.image_url, param: `${param}.image_url` } : { value: item.file_id ?? '', param: `${param}.file_id` };
}

/** Longest media string that is not a data URL (a file id or an https URL). */
export const MAX_REFERENCE_CHARS = 4096;

export interface MediaBodyOptions {
  fields: MediaJsonFields;
  limits: MediaJsonLimits;
  /** No byte for this long: 408. */
  idleTimeoutMs: number;
  /** The whole body not read within this: 408. */
  timeoutMs: number;
}

const STAGING = Symbol('mediagate.inputStaging');
type WithStaging = Request & { [STAGING]?: InputStaging };

/** The inputs a media body staged (an empty staging for a body read otherwise, e.g. multipart). */
export function stagingOf(req: Request, files: FileService): InputStaging {
  const r = req as WithStaging;
  return (r[STAGING] ??= new InputStaging(files, authOf(req).accountId));
}

/**
 * Runs `then` once the answer is ended (`res.end`: the handler's answer, or the error
 * middleware's), also when the client is already gone and nothing of it is sent, which no event of
 * the response tells ('finish' waits for a socket that is gone). A handler that ends nothing after
 * its client left (a synchronous image) has adopted its inputs already: it started the task first.
 */
function onAnswered(res: Response, then: () => void): void {
  const end = res.end as (...args: unknown[]) => Response;
  res.end = function (this: Response, ...args: unknown[]) {
    res.end = end as Response['end'];
    const answered = end.apply(this, args);
    then();
    return answered;
  } as Response['end'];
}

function isJson(req: Request): boolean {
  return /^\s*application\/(?:[\w.+-]+\+)?json\s*(;|$)/i.test(String(req.headers['content-type'] ?? ''));
}

/** The body as its Content-Encoding says (gzip, deflate, br or none); anything else is 415. */
function decodedBody(req: Request): Readable {
  const encoding = String(req.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
  switch (encoding) {
    case 'identity':
      return req;
    case 'gzip':
    case 'x-gzip':
      return req.pipe(createGunzip());
    case 'deflate':
      return req.pipe(createInflate());
    case 'br':
      return req.pipe(createBrotliDecompress());
    default:
      throw new ApiError(415, 'unsupported_media_type', `Unsupported Content-Encoding '${encoding}'; send the body uncompressed, or as gzip, deflate or br.`);
  }
}

export function mediaJsonBody(files: FileService, log: Logger, options: MediaBodyOptions): RequestHandler {
  return (req: Request, res: Response, next: NextFunction): void => {
    if (!isJson(req)) return next();
    const staging = stagingOf(req, files);
    // Inputs no task adopted are removed once the request has been answered, not when its socket
    // closes: a client that leaves while its task is being created must not lose the inputs the
    // hold is about to adopt (the task would name files that are gone).
    onAnswered(res, () => {
      staging.discardUnadopted().then(
        (n) => n > 0 && log.debug({ discarded: n }, 'removed media inputs no task adopted'),
        (err: unknown) => log.warn({ err }, 'could not remove media inputs no task adopted; the sweeper removes them when they expire'),
      );
    });
    res.once('close', () => staging.responseOver());
    // A store that cannot take an input (full, failing) ends the request at once: 507/503.
    const scanner = new MediaJsonScanner(options.fields, options.limits, (param, mimeType) => staging.open(param, mimeType, (err) => finish(err)));

    let settled = false;
    let source: Readable;
    let deadline: ReturnType<typeof bodyDeadline> | undefined;
    const finish = (err: unknown, body?: unknown) => {
      if (settled) return;
      settled = true;
      deadline?.clear();
      source?.removeAllListeners('data');
      if (err === undefined) {
        req.body = body;
        (req as Request & { _body?: boolean })._body = true; // body-parser: already parsed
        next();
        return;
      }
      scanner.abort(err instanceof Error ? err : new Error(String(err)));
      // Stop reading: answer now and discard (never buffer) what still arrives; the error middleware
      // closes the connection after its answer.
      if (!req.complete && !req.destroyed) {
        if (source !== req) req.unpipe();
        req.resume();
      }
      next(err);
    };

    try {
      source = decodedBody(req);
    } catch (err) {
      finish(err);
      return;
    }
    const armed = bodyDeadline(options.idleTimeoutMs, options.timeoutMs, finish);
    deadline = armed;

    let pushing: Promise<void> = Promise.resolve();
    // While a chunk is pushed the body is paused by the server, not by the client: a media store
    // that takes long to accept a data URL's bytes (an S3 part upload) stops the idle limit, which
    // starts again when the next chunk is read.
    source.on('data', (chunk: Buffer) => {
      armed.pause();
      source.pause();
      pushing = scanner.push(chunk).then(
        () => {
          if (settled) return;
          armed.touch();
          source.resume();
        },
        (err: unknown) => finish(err),
      );
    });
    source.once('end', () => {
      // The whole body arrived: what is left is the store's (its own timeouts bound it), not the client's.
      armed.clear();
      void pushing.then(() => {
        if (settled) return;
        let body: unknown = {};
        try {
          const rest = scanner.end();
          if (rest.length > 0) body = JSON.parse(rest.toString('utf8'));
        } catch (err) {
          finish(err instanceof ApiError ? err : badRequest('invalid_json', 'The request body is not valid JSON.'));
          return;
        }
        finish(undefined, body);
      });
    });
    source.once('error', (err: Error) => {
      // Errors of the request itself come as its 'close' below; a decoder's are the encoding's.
      if (source !== req) finish(badRequest('invalid_content_encoding', `The request body does not decode as its Content-Encoding '${String(req.headers['content-encoding'])}' says.`));
      else finish(badRequest('invalid_request', `The request body could not be read: ${err.message}.`));
    });
    req.once('close', () => {
      if (!req.complete) finish(badRequest('invalid_request', 'The client went away before the request body was complete.'));
    });
  };
}
