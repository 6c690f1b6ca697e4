/**
 * Guards requests pass before the contract validator: a bound on how many large bodies held in
 * memory (multipart edits) are read and handled at once, no content encoding on multipart bodies
 * (we do not decode them), no JSON body in a charset other than UTF-8, no NUL character in any string (PostgreSQL text cannot hold one, and no
 * field needs it), and the linger after answering a body that was not read to its end.
 */
import type { Socket } from 'node:net';
import { parse as parseContentType } from 'content-type';
import type { NextFunction, Request, Response } from 'express';
import { ApiError, CutByStop } from '../errors.ts';
import type { LargeBodyBudget } from '../services/media/large-body-budget.ts';
import { authOf, hasAuth } from './auth.ts';
import { grantBodyBytes } from './multipart.ts';

/**
 * Holds a share of the large-body budget from before a large multipart body is read until its
 * response is finished, so the memory of parsing and handling large bodies is bounded whatever the
 * number of clients; waiting bodies stay unread in the socket. Requests with small bodies pass at
 * once, and so does any body that is not multipart: a JSON edit's data URLs were streamed to the
 * store before this (media-body.ts), and its inputs take their share when they are read
 * (ImageService), once: counting its body here too made a large one wait for its own share.
 *
 * A body declared longer than the route's limit (`maxBodyBytes`, the one its parser reads under) is
 * refused at once, as that parser would refuse it (413 body_too_large): queued for the budget, it
 * would wait for a share it can never use, and every large body behind it would wait too.
 *
 * The share is the key's account's (`LargeBodyBudget.accountShare`, half the budget): a body that
 * would take the account past it is 429 too_many_in_flight at once, so a client trickling a large
 * body for BODY_TIMEOUT_MS keeps no other account's edits waiting.
 */
export function largeBodySlots(budget: LargeBodyBudget, maxBodyBytes = Number.POSITIVE_INFINITY) {
  const opts = budget.opts;
  return (req: Request, res: Response, next: NextFunction): void => {
    if (!/^\s*multipart\//i.test(String(req.headers['content-type'] ?? ''))) return next();
    const length = req.headers['content-length'];
    if (length !== undefined && Number(length) > maxBodyBytes) return next(bodyTooLarge(maxBodyBytes));
    const large = length === undefined ? req.headers['transfer-encoding'] !== undefined : Number(length) > opts.largeBodyBytes;
    if (!large) return next();
    // A client that left during an earlier async step (the key lookup, the rate gate) had its
    // 'close' already: a listener added now never runs, so a share taken now would never be given
    // back. Nobody is left to answer either.
    if (res.destroyed || req.socket.destroyed) return;
    const gone = new AbortController();
    res.once('close', () => gone.abort(new Error('client gone')));
    const accountId = hasAuth(req) ? authOf(req).accountId : undefined;
    // A body of unknown length takes the account's share, and its parser stops there (memory
    // bounded by what was granted); one of known length takes its length (the whole budget at most).
    const bytes = length === undefined ? budget.accountShare : Number(length);
    budget.acquire(bytes, gone.signal, accountId).then(
      (release) => {
        // Closed between the grant and here: its 'close' has passed too.
        if (gone.signal.aborted) return release();
        if (length === undefined) grantBodyBytes(req, bytes);
        res.once('close', release);
        next();
      },
      (err: unknown) => {
        if (res.destroyed) return;
        // The body was never read: the error middleware closes the connection instead of reading it.
        next(err);
      },
    );
  };
}

/** 413 body_too_large: a whole request body over the route's limit, declared or counted while it is read. */
export function bodyTooLarge(maxBytes: number): ApiError {
  return new ApiError(413, 'body_too_large', `The request body exceeds the limit of ${maxBytes} bytes.`);
}

/** Multipart bodies are parsed as they arrive, never decompressed: any Content-Encoding is 415. */
export function rejectEncodedMultipart(req: Request, _res: Response, next: NextFunction): void {
  const encoding = String(req.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
  const multipart = /^\s*multipart\//i.test(String(req.headers['content-type'] ?? ''));
  if (multipart && encoding !== 'identity') {
    next(new ApiError(415, 'unsupported_media_type', `A multipart body cannot have Content-Encoding '${encoding}'; send it uncompressed.`));
    return;
  }
  next();
}

/**
 * A JSON body is read as UTF-8 (RFC 8259 §8.1), by the streaming reader of media bodies
 * (media-body.ts) and by express.json alike: a `charset` other than UTF-8 is 415 on every route,
 * before either reads a byte, instead of a body decoded as something it is not on one route and a
 * 415 on another.
 */
export function rejectJsonCharset(req: Request, _res: Response, next: NextFunction): void {
  const type = String(req.headers['content-type'] ?? '');
  if (!/^\s*application\/(?:[\w.+-]+\+)?json\s*;/i.test(type)) return next();
  const charset = charsetOf(type);
  if (charset === undefined || charset === 'utf-8') return next();
  next(new ApiError(415, 'unsupported_media_type', `Unsupported charset '${charset}': a JSON body is read as UTF-8; send it in UTF-8, with charset=utf-8 or no charset.`));
}

/** The `charset` parameter of a Content-Type, lowercased; read as express.json (body-parser) reads it. */
function charsetOf(contentType: string): string | undefined {
  try {
    return parseContentType(contentType).parameters.charset?.toLowerCase();
  } catch {
    // A header it cannot parse: the JSON readers refuse it on their own.
    return undefined;
  }
}

const MAX_DEPTH = 64;

/** The path (`images[2]`, `a.b`) of the first string in `value` that holds a NUL, if any. */
export function findNul(value: unknown, path = '', depth = 0): string | undefined {
  if (typeof value === 'string') return value.includes('\0') ? path || 'body' : undefined;
  if (depth > MAX_DEPTH || value === null || typeof value !== 'object' || Buffer.isBuffer(value)) return undefined;
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      const found = findNul(item, `${path}[${i}]`, depth + 1);
      if (found) return found;
    }
    return undefined;
  }
  for (const [key, item] of Object.entries(value)) {
    const here = path ? `${path}.${key}` : key;
    if (key.includes('\0')) return here;
    const found = findNul(item, here, depth + 1);
    if (found) return found;
  }
  return undefined;
}

/** 400 nul_character for a NUL in the path, the query or any string of the (parsed) body. */
export function rejectNulCharacters(req: Request, _res: Response, next: NextFunction): void {
  let param: string | undefined;
  if (/%00/.test(req.path)) param = 'path';
  else param = findNul(req.query) ?? findNul(req.body);
  if (param === undefined) return next();
  next(new ApiError(400, 'nul_character', `'${param}' contains a NUL character (U+0000), which no field accepts.`, param));
}

/**
 * 400 invalid_request for a query parameter written with brackets (`?status[a]=b`, `?kind[]=x`). No
 * parameter of the contract has brackets in its name, and the validator reads such a key as an
 * object, which its array parser (a form-style list like `status=a,b`) fails on with a 500.
 */
export function rejectBracketedQuery(req: Request, _res: Response, next: NextFunction): void {
  const query = req.originalUrl.indexOf('?');
  if (query === -1) return next();
  for (const pair of req.originalUrl.slice(query + 1).split('&')) {
    const key = pair.split('=', 1)[0]!;
    let name: string;
    try {
      name = decodeURIComponent(key.replace(/\+/g, ' '));
    } catch {
      continue; // the validator answers a malformed escape
    }
    const bracket = name.search(/[[\]]/);
    if (bracket === -1) continue;
    const param = name.slice(0, bracket) || name;
    return next(new ApiError(400, 'invalid_request', `Query parameter '${name}' is not one this operation takes: write a list as '${param}=a,b', without brackets.`, param));
  }
  next();
}

/**
 * The two limits every streamed body is read under (BODY_IDLE_TIMEOUT_MS, BODY_TIMEOUT_MS): `cut`
 * gets 408 body_timeout when no byte arrived for `idleMs` (each `touch()` restarts that) or the
 * body was not complete within `totalMs`. The idle limit measures the client only: `pause()` stops
 * it while the server itself holds the body back (a media store slow to take what was read, so
 * nothing more is read), until the next `touch()`, which the reader calls when it reads again.
 * `clear()` once the body is over, whichever way; nothing restarts it after that.
 */
export function bodyDeadline(idleMs: number, totalMs: number, cut: (err: ApiError) => void): { touch(): void; pause(): void; clear(): void } {
  let idle: NodeJS.Timeout | undefined;
  let over = false;
  const touch = () => {
    clearTimeout(idle);
    if (over) return;
    idle = setTimeout(() => cut(new ApiError(408, 'body_timeout', `No part of the request body arrived for ${idleMs} ms.`)), idleMs);
  };
  const total = setTimeout(() => cut(new ApiError(408, 'body_timeout', `The request body was not complete within ${totalMs} ms.`)), totalMs);
  touch();
  return {
    touch,
    pause: () => clearTimeout(idle),
    clear: () => {
      over = true;
      clearTimeout(idle);
      clearTimeout(total);
    },
  };
}

/** How long a rejected upload is still read (and discarded) after the error response, in ms. */
const LINGER_MS = 2_000;
const lingering = new WeakSet<Response>();

/**
 * After the error response of a body that was not read to its end: keep discarding what the client
 * still sends for a while before closing. Node would destroy the socket as soon as the
 * `Connection: close` response is flushed; unread bytes arriving after that make the kernel answer
 * with a reset, which can discard the response before the client has read it.
 */
export function lingerAfterResponse(req: Request, res: Response): void {
  // Once per response: the parser that stopped reading and the error middleware may both ask.
  if (lingering.has(res)) return;
  lingering.add(res);
  res.once('finish', () => {
    if (req.complete) return;
    const socket: Socket = req.socket;
    if (socket.destroyed) return;
    // `socket.destroySoon()` (from Node's resOnFinish, which ran before this listener) queued
    // `this.once('finish', this.destroy)`; replace it with a bounded linger.
    socket.removeListener('finish', socket.destroy);
    const close = () => {
      clearTimeout(timer);
      if (!socket.destroyed) socket.destroy();
    };
    const timer = setTimeout(close, LINGER_MS);
    timer.unref();
    req.once('end', close);
    req.once('close', close);
    socket.once('close', () => clearTimeout(timer));
  });
}

/** Responses whose connection the server's stop is cutting (`markCutByStop`). */
const cutByStop = new WeakSet<object>();

/**
 * Marks a response whose connection the server's stop is about to cut after its grace period, so
 * that its request's signal (`clientGone`) says the server stopped, not the client.
 */
export function markCutByStop(res: object): void {
  cutByStop.add(res);
}

/**
 * An abort signal that fires when the client goes away before the response is finished: taken as
 * the request is handled, before its task is created (which may take a while: a held row, inputs
 * fetched by URL), so that a client gone meanwhile is known; one already gone aborts it at once.
 */
export function clientGone(req: Request, res: Response): AbortSignal {
  const controller = new AbortController();
  const gone = () => {
    if (!res.writableFinished) controller.abort(cutByStop.has(res) ? new CutByStop() : new Error('client disconnected'));
  };
  if (res.destroyed || req.socket.destroyed) gone();
  else res.once('close', gone);
  return controller.signal;
}
