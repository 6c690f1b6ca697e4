/**
 * JSON that carries media as base64, written without building the base64 strings.
 *
 * Responses (`b64_json`): a body holds `Base64Bytes` where the contract has a base64 string;
 * `jsonParts` cuts the body's JSON text around them, and `writeJsonParts` writes the text and each
 * image's base64 in slices, waiting for the socket to drain. Memory per image: its bytes and one
 * slice — instead of its base64 string, the JSON string holding it and the buffer that string is
 * copied into (about four times the image, per response in flight).
 *
 * Requests to upstreams (inline media such as Veo's `bytesBase64Encoded`): a body holds
 * `Base64Source`s, streams of stored inputs; `jsonStream` makes the body a stream in which each
 * one's base64 is produced while its stream is read. Memory: one chunk, whatever the inputs' size.
 *
 * A client that stops reading a response is cut off, not waited for as long as it keeps its socket
 * open: `WriteLimits` bound `writeJsonParts`, and `pipeBounded` a body piped from a stream (a
 * `jsonStream` answer, a file download).
 */
import { randomBytes } from 'node:crypto';
import { Readable, type Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';

/** Bytes written into JSON as a base64 string. */
export class Base64Bytes {
  constructor(readonly bytes: Buffer) {}
}

/**
 * `T` with its `b64_json` strings as Base64Bytes (a response body of the contract, images
 * unencoded), or as `M` (Base64Source: a body written by `jsonStream`, images read from the store).
 */
export type WithBase64<T, M = Base64Bytes> = T extends readonly (infer U)[]
  ? WithBase64<U, M>[]
  : T extends object
    ? { [K in keyof T]: K extends 'b64_json' ? M | Exclude<T[K], string> : WithBase64<T[K], M> }
    : T;

/** A JSON text cut around its images: text[0], media[0], text[1], …, text[n] (media as base64 strings). */
export interface JsonParts {
  text: string[];
  media: Buffer[];
}

/** Unique per process: a marker no string of a body can contain by chance. */
const MARK = `\u0000mg-b64-${randomBytes(8).toString('hex')}-`;

export function jsonParts(value: unknown): JsonParts {
  return cutJson(value, (v): v is Base64Bytes => v instanceof Base64Bytes, (v) => v.bytes);
}

/** The JSON text of `value` cut around the values `isMedia` picks: text[0], media[0], text[1], …, text[n]. */
function cutJson<M, T>(value: unknown, isMedia: (v: unknown) => v is M, take: (v: M) => T): { text: string[]; media: T[] } {
  const media: T[] = [];
  const json = JSON.stringify(value, (_key, v: unknown) => {
    if (!isMedia(v)) return v;
    media.push(take(v));
    return `${MARK}${media.length - 1}`;
  });
  const text: string[] = [];
  let from = 0;
  for (let i = 0; i < media.length; i++) {
    // The marker's NUL is written as \u0000 in the JSON; the quotes around it stay.
    const marker = JSON.stringify(`${MARK}${i}`).slice(1, -1);
    const at = json.indexOf(`${marker}"`, from);
    text.push(json.slice(from, at));
    from = at + marker.length;
  }
  text.push(json.slice(from));
  return { text, media };
}

/** A stream of `bytes` bytes written into JSON as a base64 string while it is read (see `jsonStream`). */
export class Base64Source {
  constructor(
    /** Opens the bytes (again, for every body that is written). */
    readonly open: () => Readable,
    /** Their exact number (the body's length is known before it is sent). */
    readonly bytes: number,
    /** Text written before the base64 inside the same string (a data URL's `data:image/png;base64,`). */
    readonly prefix = '',
  ) {}
}

/**
 * `value` as a JSON body stream, each `Base64Source` in it written as base64 while its stream is
 * read, and the body's exact length (for Content-Length). A source that turns out longer or shorter
 * than it said fails the stream.
 */
export function jsonStream(value: unknown): { body: Readable; length: number } {
  const { text, media } = cutJson(value, (v): v is Base64Source => v instanceof Base64Source, (v) => v);
  let length = 0;
  for (const t of text) length += Buffer.byteLength(t);
  for (const m of media) length += Buffer.byteLength(m.prefix) + 4 * Math.ceil(m.bytes / 3);
  async function* chunks(): AsyncGenerator<Buffer> {
    for (let i = 0; i < text.length; i++) {
      const source = media[i];
      yield Buffer.from(source?.prefix ? text[i]! + source.prefix : text[i]!);
      if (source) yield* base64Of(source);
    }
  }
  return { body: Readable.from(chunks(), { objectMode: false }), length };
}

/** The base64 of a source's stream, chunk by chunk (each a multiple of 3 bytes, so they join without padding). */
async function* base64Of(source: Base64Source): AsyncGenerator<Buffer> {
  let carry: Buffer = Buffer.alloc(0);
  let read = 0;
  for await (const chunk of source.open()) {
    const bytes = carry.length > 0 ? Buffer.concat([carry, chunk as Buffer]) : (chunk as Buffer);
    read += (chunk as Buffer).length;
    const whole = bytes.length - (bytes.length % 3);
    if (whole > 0) yield Buffer.from(bytes.toString('base64', 0, whole), 'latin1');
    carry = bytes.subarray(whole);
  }
  if (carry.length > 0) yield Buffer.from(carry.toString('base64'), 'latin1');
  if (read !== source.bytes) throw new Error(`a media input had ${read} bytes where ${source.bytes} were expected`);
}

/** Bytes of the parts as written (the base64 of each image included). */
export function jsonPartsLength(parts: JsonParts): number {
  let n = 0;
  for (const t of parts.text) n += Buffer.byteLength(t);
  for (const m of parts.media) n += 4 * Math.ceil(m.length / 3);
  return n;
}

/** The parts as one string (each image's base64 included): for a body short enough to be one write (CORKED_BYTES). */
export function joinJsonParts(parts: JsonParts): string {
  let out = parts.text[0]!;
  for (let i = 0; i < parts.media.length; i++) out += parts.media[i]!.toString('base64') + parts.text[i + 1]!;
  return out;
}

/** Raw bytes per base64 slice (a multiple of 3: slices join without padding). */
const SLICE = 3 * 64 * 1024;

/** Bounds of a write to a client (`writeJsonParts`); without them it waits for the client as long as its socket stays open. */
export interface WriteLimits {
  /**
   * STREAM_WRITE_IDLE_MS: how long one wait for the client (a 'drain', the last write's callback)
   * may last. Node has no write timeout, and a client that stops reading (an app sent to the
   * background) keeps its socket open: without this bound the answer, and whatever waits on it (a
   * task holding its member's slot and its credits), would wait for as long. Past it `out` is
   * destroyed and the write rejects with StalledClient.
   */
  idleMs?: number;
  /** The request's end (its client gone): a wait stops at once, `out` destroyed (a body cut midway cannot go on). */
  signal?: AbortSignal;
}

/** A write's rejection when its client took none of what waited for it within `WriteLimits.idleMs`: it was cut off, as gone as one that left. */
export class StalledClient extends Error {
  override readonly name = 'StalledClient';
}

/**
 * Writes the parts to `out` (not ending it) with backpressure; resolves once the last byte is
 * handed to the socket, rejects when `out` closes first (the client went away) or its client
 * stalls past `limits` (StalledClient; `out` is destroyed). The writes are corked: a body or an
 * event of up to CORKED_BYTES reaches the socket as ONE write (one system call, one wake-up of the
 * reader) instead of one per text part and base64 slice; a larger one is flushed every
 * CORKED_BYTES, waiting for the client whenever the writable asks to.
 */
export async function writeJsonParts(out: Writable, parts: JsonParts, before = '', after = '', limits: WriteLimits = {}): Promise<void> {
  const last = parts.text.length - 1;
  out.cork();
  let corked = true;
  try {
    for (let i = 0; i <= last; i++) {
      const text = `${i === 0 ? before : ''}${parts.text[i]}${i === last ? after : ''}`;
      if (i === last) {
        const done = finalWrite(out, text, limits);
        out.uncork();
        corked = false;
        return await done;
      }
      await corkedWrite(out, text, limits);
      const bytes = parts.media[i]!;
      for (let at = 0; at < bytes.length; at += SLICE) await corkedWrite(out, bytes.toString('base64', at, Math.min(bytes.length, at + SLICE)), limits);
    }
  } finally {
    if (corked) out.uncork();
  }
}

/**
 * Bytes a frame may hold back while corked. A 1024x1024 image (its base64 included) is one write;
 * a larger one goes out in writes of about this size, each waiting for the client to take the last.
 */
export const CORKED_BYTES = 256 * 1024;

/**
 * One write while corked: once more than CORKED_BYTES wait in the buffer, flushes them (uncork)
 * and, when the writable asks for it, waits for 'drain' before corking again (a corked writable
 * never drains).
 */
async function corkedWrite(out: Writable, chunk: string, limits: WriteLimits): Promise<void> {
  if (out.destroyed || out.writableEnded || limits.signal?.aborted) throw gone();
  out.write(chunk);
  if (out.writableLength <= CORKED_BYTES) return;
  out.uncork();
  try {
    if (out.writableNeedDrain) await drained(out, limits);
  } finally {
    out.cork();
  }
}

/** Resolves on 'drain'; rejects when `out` closes first, or as `bounded` says. */
function drained(out: Writable, limits: WriteLimits): Promise<void> {
  return bounded(out, limits, (settle) => {
    const onDrain = () => settle();
    out.on('drain', onDrain);
    return () => out.off('drain', onDrain);
  });
}

function gone(): Error {
  return new Error('the client went away');
}

/**
 * Waits for what `start` watches to call `settle` (a 'drain', a write's callback); rejects when
 * `out` closes first, when `limits.signal` aborts, or when `limits.idleMs` passes first: then
 * `out` is destroyed (StalledClient). `start` returns what removes its listener.
 */
function bounded(out: Writable, limits: WriteLimits, start: (settle: (err?: Error | null) => void) => () => void): Promise<void> {
  return new Promise((resolve, reject) => {
    let stop: (() => void) | undefined;
    let unwatch: (() => void) | undefined;
    let settled = false;
    const settle = (err?: Error | null) => {
      if (settled) return;
      settled = true;
      unwatch?.();
      stop?.();
      out.off('close', onClose);
      limits.signal?.removeEventListener('abort', onAbort);
      if (err) reject(err);
      else resolve();
    };
    const onClose = () => settle(gone());
    const onAbort = () => {
      settle(gone());
      out.destroy();
    };
    out.on('close', onClose);
    limits.signal?.addEventListener('abort', onAbort);
    if (limits.idleMs !== undefined) {
      const ms = limits.idleMs;
      // Everything here waits for the client: the drain, or the last write's callback.
      unwatch = watchProgress(out, ms, () => true, () => {
        // Settled first: the 'close' the destroy brings must not turn this into a plain "went away".
        settle(new StalledClient(`the client took nothing of the answer for ${ms} ms and was cut off`));
        out.destroy();
      });
    }
    stop = start(settle);
    if (settled) stop();
    else if (limits.signal?.aborted) onAbort();
  });
}

/**
 * Calls `stalled` once `out`'s client has taken none of what waits for it for `ms`; returns what
 * stops the watch. The bound is on progress, not on the whole wait: a client that keeps taking
 * bytes, however slowly, is waited for. Looked at every quarter of `ms`: what waits shrinking is
 * progress, and so is a 'drain' (all of it was taken; a pipe may have written more since the last
 * look), and a look at which the writer waits for something else (`waitsForClient` false: a pipe
 * whose writes are taken as they come, or that waits for its source) starts the count again.
 */
function watchProgress(out: Writable, ms: number, waitsForClient: () => boolean, stalled: () => void): () => void {
  const step = Math.max(10, Math.floor(ms / 4));
  let waiting = pendingBytes(out);
  let idleSince = Date.now();
  let drained = false;
  const onDrain = () => {
    drained = true;
  };
  out.on('drain', onDrain);
  let timer: NodeJS.Timeout | undefined;
  const look = () => {
    const now = pendingBytes(out);
    if (now < waiting || drained || !waitsForClient()) idleSince = Date.now();
    waiting = now;
    drained = false;
    if (Date.now() - idleSince < ms) {
      timer = setTimeout(look, step);
      return;
    }
    out.off('drain', onDrain);
    stalled();
  };
  timer = setTimeout(look, step);
  return () => {
    clearTimeout(timer);
    out.off('drain', onDrain);
  };
}

/**
 * Bytes written to `out` that its client has not taken yet. A stream's `writableLength` counts a
 * chunk until all of it is flushed (a 256 KiB write a slow reader takes 8 KiB at a time looks
 * stuck), so the socket handle's own write queue, which shrinks with each partial write, is added.
 */
function pendingBytes(out: Writable): number {
  const socket = (out as Writable & { socket?: unknown }).socket ?? out;
  const queued = (socket as { _handle?: { writeQueueSize?: number } | null })._handle?.writeQueueSize;
  return out.writableLength + (typeof queued === 'number' ? queued : 0);
}

/** The last write, resolved by its callback (the bytes reached the socket). */
function finalWrite(out: Writable, chunk: string, limits: WriteLimits): Promise<void> {
  if (out.destroyed || out.writableEnded || limits.signal?.aborted) return Promise.reject(gone());
  return bounded(out, limits, (settle) => {
    out.write(chunk, settle);
    // A write's callback cannot be taken back; once settled, a late call does nothing.
    return () => undefined;
  });
}

/**
 * `pipeline(source, out)` under the bound `WriteLimits.idleMs` puts on `writeJsonParts`: for a
 * body written from a stream (a download, a listing whose images are read from the store as it
 * goes). A pipe waits for a client that stops reading for as long as its socket stays open, and
 * holds its source meanwhile (a file descriptor, one of the S3 read client's sockets). Once the
 * client has taken none of what waits for it for `idleMs` while the pipe waits for it (for a
 * 'drain', or for the last bytes after the end), `stalled` is told and `out` is destroyed, the
 * source with it; the pipeline then rejects as for a client that went away (premature close). A
 * pipe that waits for its source (a slow store) is not the client's stall.
 */
export async function pipeBounded(source: Readable, out: Writable, idleMs: number, stalled: (err: StalledClient) => void): Promise<void> {
  const unwatch = watchProgress(
    out,
    idleMs,
    () => out.writableNeedDrain || out.writableEnded,
    () => {
      stalled(new StalledClient(`the client took nothing of the answer for ${idleMs} ms and was cut off`));
      out.destroy();
    },
  );
  try {
    await pipeline(source, out);
  } finally {
    unwatch();
  }
}
