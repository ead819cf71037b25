import { randomBytes } from 'node:crypto';
import type * as Native from '../../../index.js';
import { callNative, KvPlaneError } from '../../errors.js';
import native from '../../native.js';

export { jsonExact } from '../../json.js';

/**
 * JSON with u64s: request bodies are parsed with every integer too large for a double kept exact,
 * and answers are written with bigints as exact integers (instance ids and block hashes are u64).
 */

/** A 4xx answer: its status and message, sent as `{"error": message}`. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** Runs `f`; a bad argument it rejects (`ERR_INVALID_ARG`) is answered `status`. */
export function badInputAs<T>(status: number, f: () => T): T {
  try {
    return f();
  } catch (err) {
    if (err instanceof KvPlaneError && err.code === 'ERR_INVALID_ARG') throw new HttpError(status, err.message);
    throw err;
  }
}

/**
 * The start of the strings `parseJsonExact` puts where long integer literals were: a NUL, then a
 * random word drawn once per process, so no string a client sends can pass for one.
 */
const BIG = `\u0000int:${randomBytes(8).toString('hex')}:`;

/**
 * Parses JSON text, keeping integer literals beyond 2^53 exact: they come back as marker strings
 * that `u64Field` and `i64Field` read. Malformed text is a 400.
 */
export function parseJsonExact(text: string): unknown {
  // Most bodies have no such literal (token ids are u32): parse them as they are.
  if (!/\d{16}/.test(text)) return parseJson(text);
  let out = '';
  let at = 0;
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: skip to its closing quote.
      i++;
      while (i < n && text.charCodeAt(i) !== 0x22) i += text.charCodeAt(i) === 0x5c ? 2 : 1;
      i++;
      continue;
    }
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      let j = i + 1;
      while (j < n && numberChar(text.charCodeAt(j))) j++;
      const tok = text.slice(i, j);
      // Only a JSON integer (no leading zero): anything else is left for `JSON.parse` to refuse.
      if (/^-?[1-9]\d{15,}$/.test(tok)) {
        // The marker's NUL written escaped: JSON strings take no raw control characters.
        out += `${text.slice(at, i)}"\\u0000${BIG.slice(1)}${tok}"`;
        at = j;
      }
      i = j;
      continue;
    }
    i++;
  }
  out += text.slice(at);
  return parseJson(out);
}

/** A `/query` body (`{token_ids, model_name, routing_group?, lora_name?, cache_salt?}`), read by the core. */
export function parseTokenQuery(bytes: Buffer): Native.TokenQueryOut {
  return queryBody(() => native.parseTokenQuery(bytes));
}

/** A `/query_by_hash` body (`{block_hashes, model_name, routing_group?, cache_salt?}`), read by the core. */
export function parseHashQuery(bytes: Buffer): Native.HashQueryOut {
  return queryBody(() => native.parseHashQuery(bytes));
}

/**
 * A query's body read by the core (a long prompt's holds hundreds of thousands of numbers, which
 * JS would parse into an object each): malformed JSON is a 400, a missing or mistyped field a 422.
 */
function queryBody<T>(read: () => T): T {
  try {
    return callNative(read);
  } catch (err) {
    if (err instanceof KvPlaneError && (err.code === 'ERR_DECODE' || err.code === 'ERR_INVALID_ARG')) {
      throw new HttpError(err.code === 'ERR_DECODE' ? 400 : 422, err.message);
    }
    throw err;
  }
}

/** A character of a JSON number: a digit, `.`, `e`, `E`, `+` or `-`. */
function numberChar(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || c === 0x2e || c === 0x65 || c === 0x45 || c === 0x2b || c === 0x2d;
}

/** `JSON.parse`, a 400 for malformed text. */
function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new HttpError(400, `Failed to parse the request body as JSON: ${(err as Error).message}`);
  }
}

function bigOf(v: unknown): bigint | null {
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt(v);
  if (typeof v === 'string' && v.startsWith(BIG)) return BigInt(v.slice(BIG.length));
  return null;
}

/**
 * The longest name or endpoint a registration keeps. Each is kept for as long as the worker is
 * registered, written to the state file on every change and repeated in the labels of every
 * metric of its index: without a bound, a few 2 MB names made one `/metrics` scrape 349 MB.
 */
export const NAME_CHARS = 1024;

/** Half of a UTF-16 surrogate pair without its other half. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Field readers: a missing or mistyped field is a 422, as Dynamo's indexer answers. */
export class Fields {
  constructor(readonly body: Record<string, unknown>) {}

  static of(v: unknown): Fields {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) {
      throw new HttpError(422, 'the request body must be a JSON object');
    }
    return new Fields(v as Record<string, unknown>);
  }

  #missing(name: string): never {
    throw new HttpError(422, `missing field \`${name}\``);
  }

  #bad(name: string, want: string): never {
    throw new HttpError(422, `${name}: invalid value, expected ${want}`);
  }

  has(name: string): boolean {
    return this.body[name] !== undefined && this.body[name] !== null;
  }

  u64(name: string): bigint {
    if (!this.has(name)) this.#missing(name);
    const v = bigOf(this.body[name]);
    if (v === null || v < 0n || v > 0xffffffffffffffffn) this.#bad(name, 'u64');
    return v;
  }

  u32(name: string): number;
  u32(name: string, dflt: number): number;
  u32(name: string, dflt?: number): number {
    if (!this.has(name)) return dflt ?? this.#missing(name);
    const v = this.body[name];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > 0xffffffff) this.#bad(name, 'u32');
    return v;
  }

  str(name: string): string;
  str(name: string, dflt: string | null): string | null;
  str(name: string, dflt?: string | null): string | null {
    if (!this.has(name)) return dflt === undefined ? this.#missing(name) : dflt;
    const v = this.body[name];
    // A long integer literal is a marker string here, and still not a string.
    if (typeof v !== 'string' || v.startsWith(BIG)) this.#bad(name, 'a string');
    // `JSON.parse` takes an escaped half of a surrogate pair alone (`"\ud800"`), which is no
    // Unicode text: a JSON parser over UTF-8 (Dynamo's indexer's) refuses it as malformed.
    if (LONE_SURROGATE.test(v)) throw new HttpError(400, `${name}: a lone surrogate (\\u escape) is not Unicode text`);
    return v;
  }

  /** A string the indexer keeps (a name, an endpoint): at most `NAME_CHARS` characters. */
  name(name: string): string;
  name(name: string, dflt: string | null): string | null;
  name(name: string, dflt?: string | null): string | null {
    const v = dflt === undefined ? this.str(name) : this.str(name, dflt);
    if (v !== null && v.length > NAME_CHARS) this.#bad(name, `a string of at most ${NAME_CHARS} characters`);
    return v;
  }
}
