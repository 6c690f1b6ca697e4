/**
 * A streaming reader for JSON that carries large media strings: request bodies (video frames and
 * references, JSON image edits) and upstream answers (the `data[].b64_json` images of an OpenAI
 * Images answer). The JSON is scanned as it arrives, and every media string is decoded on the fly
 * and handed to a sink (the media store, or the adapter's buffer) instead of being kept: the JSON
 * that remains — a few KiB — has each such string replaced by a short token, and is parsed (and a
 * request body validated against the contract) as usual. Memory stays a few chunks beyond the
 * decoded media, whatever its size.
 *
 * Media strings are found by their path: member names joined by `.`, `[]` for the elements of an
 * array (`firstFrame`, `referenceImages[]`, `data[].b64_json`,
 * `candidates[].content.parts[].inlineData.data`; `[]…` when the JSON is an array). Strings at
 * `dataUrlPaths` (request bodies) are data URLs, or references (a file id, an https URL) that stay
 * in the JSON as they are, up to `maxReferenceChars`; strings at `base64Paths` (upstream answers)
 * are bare base64. A media string is named by its path with the indexes (`referenceImages[2]`).
 * Limits are enforced while reading: total decoded media bytes, bytes per input, number of media
 * strings (of all paths, and of a path that has its own limit) and the size of the rest of the
 * JSON; the first one passed throws at once. Errors are ApiErrors for a client's body; a caller
 * reading an upstream turns them into its own.
 *
 * Two spellings of one field (`firstFrame`, `first_frame`) may both carry a data URL. The second
 * one read, at the same indexes, is compared with the first (by the SHA-256 of its decoded bytes,
 * taken while it streams) instead of being stored: the same image is neither counted nor stored
 * again (it gets the first one's token), a different one is `400 alias_conflict` at once.
 *
 * The scanner tracks only what it needs (strings, nesting, the current top-level key); the JSON
 * that remains is parsed in full afterwards, so malformed input is still reported by JSON.parse.
 * Escapes inside data URLs are honoured (`\/`, as PHP's json_encode writes, and `\uXXXX`).
 */
import { createHash, type Hash } from 'node:crypto';
import { ApiError, badRequest, tooLarge } from '../errors.ts';

export interface MediaSink {
  /** Writes decoded bytes; a returned promise is awaited before reading on (backpressure). */
  write(chunk: Buffer): void | Promise<void>;
  /** All bytes were written: returns the token that replaces the string in the JSON. */
  end(): Promise<string>;
  /** The string will not complete (a limit or a syntax error): drop what was written. */
  abort(err: Error): void;
}

export interface MediaJsonLimits {
  /** Decoded bytes of all data URLs together. */
  maxMediaBytes: number;
  /** Decoded bytes of one data URL. */
  maxItemBytes: number;
  /** Media strings of any kind (data URLs, file ids, URLs). */
  maxMediaCount: number;
  /** Bytes of the JSON that remains. */
  maxOtherBytes: number;
  /** Characters of a media string that is not a data URL. */
  maxReferenceChars: number;
}

export interface MediaJsonFields {
  /** Paths whose strings are data URLs or references. */
  dataUrlPaths?: ReadonlySet<string>;
  /** Paths whose strings are bare base64 (no data URL prefix, never a reference). */
  base64Paths?: ReadonlySet<string>;
  /** Data URL paths that spell one field two ways, each mapped to the other (`firstFrame` ↔ `first_frame`). */
  aliases?: ReadonlyMap<string, string>;
  /**
   * Most strings one path holds (all elements of `images[]` together) and the error for the one
   * more; paths that name one `counter` share it (`images[]` and `images[].image_url`: one list
   * with items in either form). `maxMediaCount` still bounds all paths together.
   */
  maxCounts?: ReadonlyMap<string, { max: number; tooMany: (param: string) => ApiError; counter?: string }>;
}

/** A data URL read at an aliased path: what its twin under the other spelling is compared with. */
interface ReadDataUrl {
  param: string;
  token: string;
  bytes: number;
  sha256: string;
}

/** Deepest path looked at: media is never nested deeper, and junk nesting costs nothing. */
const MAX_PATH_DEPTH = 12;

/**
 * `open` starts a sink for a data URL of `mimeType` found at `param` (`firstFrame`, `images[2]`),
 * or for a bare base64 string (`data[0].b64_json`; `mimeType` empty: the bytes tell).
 */
export type OpenSink = (param: string, mimeType: string) => MediaSink;

const DATA_URL_PREFIX = /^data:(image\/(?:png|jpeg|jpg|webp|gif));base64,/i;
/** Longest prefix `data:image/jpeg;base64,` plus room for case variants. */
const MAX_PREFIX = 40;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** Base64 characters gathered before they are decoded (taken when the first media string starts). */
const SCRATCH_BYTES = 64 * 1024;
const SIMPLE_ESCAPES: Record<number, string> = { 0x22: '"', 0x5c: '\\', 0x2f: '/', 0x62: '\b', 0x66: '\f', 0x6e: '\n', 0x72: '\r', 0x74: '\t' };
const MAX_KEY_BYTES = 256;

type Container = { kind: 'object'; key: string | undefined; expectKey: boolean } | { kind: 'array'; index: number };

type StringMode =
  | { kind: 'none' }
  /** A string copied to the output as it is (keys are also captured, up to MAX_KEY_BYTES). */
  | { kind: 'plain'; isKey: boolean; escape: boolean; key: number[] | undefined }
  /**
   * A media string whose first characters (UTF-8 bytes, unescaped) decide what it is. `aliased`:
   * at an aliased path (hashed, or kept); `twin`: the data URL its other spelling already carried,
   * `referenceTwin`: the reference it carried (then it is not counted yet: a copy of the twin never is).
   */
  | { kind: 'media'; param: string; path: string; bytes: number[]; escape: EscapeState; aliased: boolean; twin: ReadDataUrl | undefined; referenceTwin: string | undefined }
  /**
   * The base64 body of a data URL (or a bare base64 string) being decoded into a sink; no sink
   * for the twin of a data URL already read, which is only compared with it (`hash`).
   */
  | { kind: 'data'; param: string; sink: MediaSink | undefined; escape: EscapeState; carry: string; padded: boolean; bytes: number; bare: boolean; hash: Hash | undefined; twin: ReadDataUrl | undefined }
  /**
   * A media string that is a reference (file id, URL): kept (UTF-8 bytes, unescaped). At an aliased
   * path it is remembered for its twin, or (`referenceTwin`) counted only when it differs from it.
   */
  | { kind: 'reference'; param: string; path: string; bytes: number[]; escape: EscapeState; aliased: boolean; referenceTwin: string | undefined };

type MediaMode = Extract<StringMode, { kind: 'media' | 'data' | 'reference' }>;

/** Where an escape sequence inside a media string stands: none, after `\`, or inside `\uXXXX`. */
type EscapeState = { at: 'none' } | { at: 'backslash' } | { at: 'unicode'; hex: string };

/** Where `a` or `b` first occurs in `buf` from `from` on, or -1: a run scanned at native speed. */
export function indexOfEither(buf: Buffer, a: number, b: number, from: number): number {
  const i = buf.indexOf(a, from);
  const j = buf.indexOf(b, from);
  return i === -1 ? j : j === -1 ? i : Math.min(i, j);
}

export class MediaJsonScanner {
  private readonly stack: Container[] = [];
  private mode: StringMode = { kind: 'none' };
  private out: Buffer = Buffer.allocUnsafe(2048);
  private outLength = 0;
  private mediaBytes = 0;
  private mediaCount = 0;
  /** Strings read at each path with a limit of its own (`maxCounts`). */
  private readonly pathCounts = new Map<string, number>();
  /** Data URLs read at aliased paths, by param (`referenceImages[1]`). */
  private readonly aliasedRead = new Map<string, ReadDataUrl>();
  /** References (file ids, URLs) read at aliased paths, by param: a twin that repeats one is not counted again. */
  private readonly aliasedReferences = new Map<string, string>();
  private scratchBuffer: Buffer | undefined;
  private scratchLength = 0;
  private openSink: MediaSink | undefined;

  constructor(
    private readonly fields: MediaJsonFields,
    private readonly limits: MediaJsonLimits,
    private readonly open: OpenSink,
  ) {}

  /** Fresh big buffers per document would make the garbage collector run often: taken once, kept. */
  private get scratch(): Buffer {
    return (this.scratchBuffer ??= Buffer.allocUnsafe(SCRATCH_BYTES));
  }

  /**
   * Starts a new document with the same fields, limits and buffers (the frames of one event
   * stream). Call after `end()`.
   */
  reset(): void {
    this.stack.length = 0;
    this.mode = { kind: 'none' };
    this.outLength = 0;
    this.mediaBytes = 0;
    this.mediaCount = 0;
    this.pathCounts.clear();
    this.aliasedRead.clear();
    this.aliasedReferences.clear();
    this.scratchLength = 0;
    this.openSink = undefined;
  }

  /** Reads one chunk of the body. */
  async push(chunk: Buffer): Promise<void> {
    let pos = 0;
    while (pos < chunk.length) {
      const mode = this.mode;
      if (mode.kind === 'none') pos = this.structural(chunk, pos);
      else if (mode.kind === 'plain') pos = this.plain(mode, chunk, pos);
      else pos = await this.media(chunk, pos);
    }
    await this.flushData();
  }

  /** The body ended: the JSON that remains (media replaced by tokens). */
  end(): Buffer {
    if (this.mode.kind !== 'none') throw badRequest('invalid_json', 'The request body is not valid JSON (it ends inside a string).');
    return this.out.subarray(0, this.outLength);
  }

  /** Drops an unfinished sink (the body failed or was cut off). */
  abort(err: Error): void {
    this.openSink?.abort(err);
    this.openSink = undefined;
  }

  get mediaBytesRead(): number {
    return this.mediaBytes;
  }

  // --- outside strings

  private structural(chunk: Buffer, start: number): number {
    for (let pos = start; pos < chunk.length; pos++) {
      const c = chunk[pos]!;
      const top = this.stack.at(-1);
      switch (c) {
        case QUOTE: {
          this.emit(chunk, start, pos);
          return this.openString(pos + 1, top);
        }
        case 0x7b /* { */:
          this.stack.push({ kind: 'object', key: undefined, expectKey: true });
          break;
        case 0x5b /* [ */:
          this.stack.push({ kind: 'array', index: 0 });
          break;
        case 0x7d /* } */:
        case 0x5d /* ] */:
          this.stack.pop();
          break;
        case 0x2c /* , */:
          if (top?.kind === 'object') top.expectKey = true;
          else if (top?.kind === 'array') top.index++;
          break;
        case 0x3a /* : */:
          if (top?.kind === 'object') top.expectKey = false;
          break;
      }
    }
    this.emit(chunk, start, chunk.length);
    return chunk.length;
  }

  /** After an opening quote at `pos - 1`: decides what the string is. */
  private openString(pos: number, top: Container | undefined): number {
    if (top?.kind === 'object' && top.expectKey) {
      this.emitByte(QUOTE);
      this.mode = { kind: 'plain', isKey: true, escape: false, key: [] };
      return pos;
    }
    const media = this.mediaParam();
    if (media === undefined) {
      this.emitByte(QUOTE);
      this.mode = { kind: 'plain', isKey: false, escape: false, key: undefined };
      return pos;
    }
    const { param, path, base64, twinParam } = media;
    const twin = twinParam === undefined ? undefined : this.aliasedRead.get(twinParam);
    const referenceTwin = twinParam === undefined || twin !== undefined ? undefined : this.aliasedReferences.get(twinParam);
    if (twin === undefined && referenceTwin === undefined) this.count(path, param);
    if (base64) {
      const sink = this.open(param, '');
      this.openSink = sink;
      this.mode = { kind: 'data', param, sink, escape: { at: 'none' }, carry: '', padded: false, bytes: 0, bare: true, hash: undefined, twin: undefined };
    } else this.mode = { kind: 'media', param, path, bytes: [], escape: { at: 'none' }, aliased: twinParam !== undefined, twin, referenceTwin };
    return pos;
  }

  /** Counts a media string against the limit of its path, if it has one, and of all paths. */
  private count(path: string, param: string): void {
    const own = this.fields.maxCounts?.get(path);
    if (own) {
      const counter = own.counter ?? path;
      const n = (this.pathCounts.get(counter) ?? 0) + 1;
      this.pathCounts.set(counter, n);
      if (n > own.max) throw own.tooMany(param);
    }
    this.mediaCount++;
    if (this.mediaCount > this.limits.maxMediaCount) {
      throw tooLarge('too_many_media_inputs', `At most ${this.limits.maxMediaCount} media inputs are accepted per request.`, param);
    }
  }

  /**
   * The media parameter name and path of a value string, whether it is bare base64, and at an
   * aliased path the param of its twin (`first_frame` for `firstFrame`); undefined when it is none.
   */
  private mediaParam(): { param: string; path: string; base64: boolean; twinParam?: string } | undefined {
    if (this.stack.length > MAX_PATH_DEPTH) return undefined;
    let path = '';
    let param = '';
    const indexes: number[] = [];
    for (const c of this.stack) {
      if (c.kind === 'array') {
        path += '[]';
        param += `[${c.index}]`;
        indexes.push(c.index);
      } else {
        if (c.key === undefined) return undefined;
        const name = path === '' ? c.key : `.${c.key}`;
        path += name;
        param += name;
      }
    }
    if (this.fields.dataUrlPaths?.has(path)) {
      const alias = this.fields.aliases?.get(path);
      if (alias === undefined) return { param, path, base64: false };
      let i = 0;
      return { param, path, base64: false, twinParam: alias.replace(/\[\]/g, () => `[${indexes[i++]}]`) };
    }
    if (this.fields.base64Paths?.has(path)) return { param, path, base64: true };
    return undefined;
  }

  // --- strings copied as they are

  private plain(mode: Extract<StringMode, { kind: 'plain' }>, chunk: Buffer, start: number): number {
    let pos = start;
    while (pos < chunk.length) {
      if (mode.escape) {
        mode.escape = false;
        mode.key?.push(chunk[pos]!);
        pos++;
        continue;
      }
      const stop = indexOfEither(chunk, QUOTE, BACKSLASH, pos);
      const end = stop === -1 ? chunk.length : stop;
      if (mode.key && mode.key.length <= MAX_KEY_BYTES) for (let i = pos; i < end && mode.key.length <= MAX_KEY_BYTES; i++) mode.key.push(chunk[i]!);
      if (stop === -1) {
        this.emit(chunk, start, chunk.length);
        return chunk.length;
      }
      if (chunk[stop] === BACKSLASH) {
        mode.key?.push(BACKSLASH);
        mode.escape = true;
        pos = stop + 1;
        continue;
      }
      // The closing quote.
      this.emit(chunk, start, stop + 1);
      if (mode.isKey) this.setKey(mode.key!);
      this.mode = { kind: 'none' };
      return stop + 1;
    }
    this.emit(chunk, start, chunk.length);
    return chunk.length;
  }

  private setKey(raw: number[]): void {
    const top = this.stack.at(-1);
    if (top?.kind !== 'object') return;
    if (raw.length > MAX_KEY_BYTES) {
      top.key = undefined;
      return;
    }
    const text = Buffer.from(raw).toString('utf8');
    try {
      top.key = text.includes('\\') ? (JSON.parse(`"${text}"`) as string) : text;
    } catch {
      top.key = undefined; // the final JSON.parse reports it
    }
  }

  // --- media strings

  /** Reads a media string (unescaping it) until its closing quote or the chunk's end. */
  private async media(chunk: Buffer, start: number): Promise<number> {
    let pos = start;
    while (pos < chunk.length) {
      const mode = this.mode as MediaMode;
      if (mode.escape.at !== 'none') {
        const char = this.escapeStep(mode, chunk[pos]!);
        pos++;
        if (char !== undefined) await this.take(Buffer.from(char, 'utf8'));
        continue;
      }
      // The run up to the next quote or backslash is taken as it is.
      const stop = indexOfEither(chunk, QUOTE, BACKSLASH, pos);
      const end = stop === -1 ? chunk.length : stop;
      if (end > pos) await this.take(chunk.subarray(pos, end));
      if (stop === -1) return chunk.length;
      pos = stop + 1;
      if (chunk[stop] === BACKSLASH) (this.mode as MediaMode).escape = { at: 'backslash' };
      else {
        await this.closeMedia();
        return pos;
      }
    }
    return chunk.length;
  }

  /** One byte of an escape sequence; returns the character once the sequence is complete. */
  private escapeStep(mode: MediaMode, c: number): string | undefined {
    const state = mode.escape;
    if (state.at === 'backslash') {
      if (c === 0x75 /* u */) {
        mode.escape = { at: 'unicode', hex: '' };
        return undefined;
      }
      mode.escape = { at: 'none' };
      const char = SIMPLE_ESCAPES[c];
      if (char === undefined) throw badRequest('invalid_json', 'The request body is not valid JSON (a bad escape sequence in a string).');
      return char;
    }
    if (state.at === 'unicode') {
      state.hex += String.fromCharCode(c);
      if (state.hex.length < 4) return undefined;
      mode.escape = { at: 'none' };
      if (!/^[0-9a-fA-F]{4}$/.test(state.hex)) throw badRequest('invalid_json', 'The request body is not valid JSON (a bad \\u escape in a string).');
      return String.fromCharCode(Number.parseInt(state.hex, 16));
    }
    return undefined;
  }

  /** Unescaped bytes of the media string, in order. */
  private async take(bytes: Buffer): Promise<void> {
    let mode = this.mode as MediaMode;
    let rest = bytes;
    if (mode.kind === 'media') {
      // Still deciding: a data URL starts `data:` and has its `;base64,` within MAX_PREFIX bytes.
      const comma = rest.indexOf(0x2c);
      const upto = comma === -1 ? rest.length : comma + 1;
      for (let i = 0; i < upto; i++) mode.bytes.push(rest[i]!);
      rest = rest.subarray(upto);
      const head = Buffer.from(mode.bytes).toString('latin1');
      if (!'data:'.startsWith(head.slice(0, 5).toLowerCase())) {
        // Not a copy of its twin's data URL: counted as every other media string (after a reference twin: once read whole).
        if (mode.twin) this.count(mode.path, mode.param);
        this.mode = mode = { kind: 'reference', param: mode.param, path: mode.path, bytes: mode.bytes, escape: mode.escape, aliased: mode.aliased, referenceTwin: mode.referenceTwin };
      } else if (comma === -1) {
        if (head.length > MAX_PREFIX) throw this.notADataUrl(mode.param);
        return;
      } else {
        const match = DATA_URL_PREFIX.exec(head);
        if (!match || match[0].length !== head.length) throw this.notADataUrl(mode.param);
        // A data URL where its other spelling carried a reference: another input (and an alias conflict).
        if (mode.referenceTwin !== undefined) this.count(mode.path, mode.param);
        // The twin of a data URL already read is only compared with it: no sink.
        const sink = mode.twin ? undefined : this.open(mode.param, match[1]!.toLowerCase().replace('jpg', 'jpeg'));
        this.openSink = sink;
        const hash = mode.aliased ? createHash('sha256') : undefined;
        this.mode = mode = { kind: 'data', param: mode.param, sink, escape: mode.escape, carry: '', padded: false, bytes: 0, bare: false, hash, twin: mode.twin };
      }
    }
    if (mode.kind === 'reference') {
      for (const b of rest) mode.bytes.push(b);
      if (mode.bytes.length > this.limits.maxReferenceChars) {
        throw badRequest('invalid_data_url', `'${mode.param}' must be a base64 image data URL, a file id or an https URL (it is longer than ${this.limits.maxReferenceChars} bytes).`, mode.param);
      }
      return;
    }
    let pos = 0;
    while (pos < rest.length) {
      const n = Math.min(rest.length - pos, SCRATCH_BYTES - this.scratchLength);
      rest.copy(this.scratch, this.scratchLength, pos, pos + n);
      this.scratchLength += n;
      pos += n;
      if (this.scratchLength === SCRATCH_BYTES) await this.flushData();
    }
  }

  /** Decodes the base64 characters gathered so far (whole quads; the rest carries over). */
  private async flushData(final = false): Promise<void> {
    const mode = this.mode;
    if (mode.kind !== 'data' || (this.scratchLength === 0 && !final)) return;
    const fresh = this.scratch.toString('latin1', 0, this.scratchLength);
    this.scratchLength = 0;
    // '=' only pads the very end: after the first one, nothing but '=' may follow.
    const pad = fresh.indexOf('=');
    if (mode.padded && fresh.length > 0 && !/^=*$/.test(fresh)) throw this.invalidBase64(mode.param);
    if (!mode.padded && pad !== -1 && !/^=*$/.test(fresh.slice(pad))) throw this.invalidBase64(mode.param);
    if (pad !== -1) mode.padded = true;
    const text = mode.carry + fresh;
    const usable = final ? text.length : text.length - (text.length % 4);
    if (usable % 4 !== 0) throw this.invalidBase64(mode.param);
    mode.carry = text.slice(usable);
    if (usable === 0) return;
    const quads = text.slice(0, usable);
    const padding = quads.endsWith('==') ? 2 : quads.endsWith('=') ? 1 : 0;
    const data = Buffer.from(quads, 'base64');
    // Buffer.from skips characters outside the alphabet: a clean body decodes to exactly 3/4 of it.
    if (quads.endsWith('===') || data.length !== (usable / 4) * 3 - padding) throw this.invalidBase64(mode.param);
    mode.bytes += data.length;
    mode.hash?.update(data);
    if (mode.twin) {
      if (mode.bytes > mode.twin.bytes) throw this.aliasConflict(mode.twin, mode.param);
      return;
    }
    this.mediaBytes += data.length;
    if (this.mediaBytes > this.limits.maxMediaBytes) {
      throw tooLarge('media_total_too_large', `Media inputs exceed ${this.limits.maxMediaBytes} bytes in total.`, mode.param);
    }
    if (mode.bytes > this.limits.maxItemBytes) throw tooLarge('media_too_large', `'${mode.param}' is larger than ${this.limits.maxItemBytes} bytes.`, mode.param);
    await mode.sink?.write(data);
  }

  private async closeMedia(): Promise<void> {
    const mode = this.mode as MediaMode;
    if (mode.kind === 'data') {
      await this.flushData(true);
      this.openSink = undefined;
      this.mode = { kind: 'none' };
      if (mode.bytes === 0) {
        // An empty data URL is a mistake; an empty bare string is as good as absent (an answer with a `url` instead).
        if (!mode.bare) throw badRequest('invalid_data_url', `'${mode.param}' is empty.`, mode.param);
        mode.sink?.abort(new Error('empty'));
        this.emitString('');
        return;
      }
      const sha256 = mode.hash?.digest('hex');
      if (mode.twin) {
        // The same image under the field's other spelling: the twin's token, nothing counted or stored.
        if (mode.bytes !== mode.twin.bytes || sha256 !== mode.twin.sha256) throw this.aliasConflict(mode.twin, mode.param);
        this.emitString(mode.twin.token);
        return;
      }
      const token = await mode.sink!.end();
      if (sha256 !== undefined && !this.aliasedRead.has(mode.param)) this.aliasedRead.set(mode.param, { param: mode.param, token, bytes: mode.bytes, sha256 });
      this.emitString(token);
      return;
    }
    const value = Buffer.from(mode.bytes).toString('utf8');
    if (mode.kind === 'media' && value.toLowerCase().startsWith('data:')) throw this.notADataUrl(mode.param);
    // A short string (`""`) that never showed what it is: no copy of its twin either.
    if (mode.kind === 'media' && mode.twin) this.count(mode.path, mode.param);
    if (mode.aliased) {
      // The same reference under the field's other spelling is one input; another one counts (normalization refuses the pair).
      if (mode.referenceTwin !== undefined) {
        if (value !== mode.referenceTwin) this.count(mode.path, mode.param);
      } else if ((mode.kind === 'reference' || mode.twin === undefined) && !this.aliasedReferences.has(mode.param)) this.aliasedReferences.set(mode.param, value);
    }
    this.mode = { kind: 'none' };
    this.emitString(value);
  }

  private notADataUrl(param: string): ApiError {
    return badRequest('invalid_data_url', `'${param}' must be a base64 image data URL (data:image/png;base64,...), a file id or an https URL.`, param);
  }

  private aliasConflict(twin: ReadDataUrl, param: string): ApiError {
    return badRequest('alias_conflict', `'${twin.param}' and '${param}' are the same field and must agree (they carry different images).`, param);
  }

  private invalidBase64(param: string): ApiError {
    return badRequest('invalid_data_url', `'${param}' is not valid base64.`, param);
  }

  // --- output

  private emitString(value: string): void {
    const json = Buffer.from(JSON.stringify(value), 'utf8');
    this.emit(json, 0, json.length);
  }

  private emitByte(c: number): void {
    this.reserve(1);
    this.out[this.outLength++] = c;
  }

  private emit(chunk: Buffer, start: number, end: number): void {
    if (end <= start) return;
    this.reserve(end - start);
    chunk.copy(this.out, this.outLength, start, end);
    this.outLength += end - start;
  }

  private reserve(n: number): void {
    const needed = this.outLength + n;
    if (needed > this.limits.maxOtherBytes) {
      throw tooLarge('body_too_large', `The request body, media inputs aside, exceeds the limit of ${this.limits.maxOtherBytes} bytes.`);
    }
    if (needed <= this.out.length) return;
    const grown = Buffer.allocUnsafe(Math.min(this.limits.maxOtherBytes, Math.max(needed, this.out.length * 2)));
    this.out.copy(grown, 0, 0, this.outLength);
    this.out = grown;
  }
}
