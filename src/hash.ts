import type { HashBlocksOptions as NativeHashBlocksOptions } from '../index.js';
import { type AbortOptions, abortable } from './abort.js';
import { awaitNative, callNative, invalidArg } from './errors.js';
import native from './native.js';
import { nativeTokens } from './tokens.js';

/** Block hashing algorithms, as docs/protocol.md#block-hashing names them. */
export type HashAlgo =
  | 'xxh3'
  | 'xxh3_content'
  | 'vllm_sha256_cbor'
  | 'vllm_sha256'
  | 'vllm_xxhash_cbor'
  | 'vllm_xxhash'
  | 'sglang_sha256'
  | 'trtllm_v1_block_key'
  | 'trtllm_v2_sha256'
  | 'trtllm_v2_sha256_64';

/**
 * One vLLM extra key: a string, an integer (a safe-integer number or a bigint), bytes, or a tuple
 * of extra keys (e.g. `[mmHash, offset]`), nested to any depth up to 8.
 */
export type ExtraKey = string | number | bigint | Uint8Array | readonly ExtraKey[];

export interface HashBlocksOptions {
  /** Algorithm. Default `'xxh3'` (the Dynamo/SMG content hash). */
  algo?: HashAlgo;
  /** Tokens per block (1 to 2^20). Only full blocks are hashed. */
  blockSize: number;
  /**
   * The hash the chain continues from: a `bigint` for `xxh3` and `trtllm_v1_block_key`, the full
   * digest bytes for the digest algorithms (vLLM, SGLang, TRT-LLM V2).
   */
  parent?: bigint | Uint8Array;
  /** vLLM: the LoRA adapter name, hashed as the first extra key of every block. */
  loraName?: string;
  /** TensorRT-LLM (V1 and V2): the LoRA task id. */
  loraId?: bigint;
  /**
   * vLLM: salt hashed as an extra key of the request's first block (not when `parent` is given).
   * SGLang: the chain starts from SHA-256("sglang-cache-salt-v1\0" + salt). TensorRT-LLM: the salt
   * id is the first 8 bytes (LE) of SHA-256(salt), mixed into the root. An empty salt is no salt
   * for vLLM and SGLang.
   */
  cacheSalt?: string;
  /**
   * TensorRT-LLM: the salt id itself (instead of `cacheSalt`), e.g. from
   * `trtllmCacheSaltId(salt, { hash: 'blake3' })` for older TensorRT-LLM routers.
   */
  cacheSaltId?: bigint;
  /**
   * vLLM: the engine's `PYTHONHASHSEED`; the root parent is `NONE_HASH = hash(seed)`. Default
   * `'vllm-none-hash'` for the SHA-256 variants; required (or `parent`) for the xxhash variants.
   */
  noneHashSeed?: string;
  /** vLLM: extra keys hashed with every block after the LoRA name (multimodal hashes, ...). */
  extraKeys?: readonly ExtraKey[];
  /**
   * vLLM: extra keys hashed with the request's first block only, after `cacheSalt`. vLLM ≥ 0.33
   * tags its keys: pass `extraKeys: [['lora', name, path]]` and
   * `firstBlockExtraKeys: [['cache_salt', salt]]` to hash as it does.
   */
  firstBlockExtraKeys?: readonly ExtraKey[];
  /** Also return the raw digests (digest algorithms only). */
  digests?: boolean;
}

/** Hashes with their raw digests. */
export interface HashDigests {
  /** One u64 per full block. */
  hashes: BigUint64Array;
  /** `hashes.length * digestSize` bytes: each block's digest in order. */
  digests: Buffer;
  /** Bytes per digest (32 for SHA-256, 16 for XXH3-128). */
  digestSize: number;
}

export type Tokens = Uint32Array | readonly number[];

const OPTION_KEYS: ReadonlySet<string> = new Set([
  'algo',
  'blockSize',
  'parent',
  'loraName',
  'loraId',
  'cacheSalt',
  'cacheSaltId',
  'noneHashSeed',
  'extraKeys',
  'firstBlockExtraKeys',
  'digests',
]);

function nativeArgs(
  tokens: Tokens,
  options: HashBlocksOptions,
): [Uint32Array | Float64Array, NativeHashBlocksOptions, boolean] {
  if (typeof options !== 'object' || options === null) invalidArg('options must be an object');
  // A misspelt option would silently change the hash: refuse unknown keys.
  for (const key of Object.keys(options)) {
    if (!OPTION_KEYS.has(key)) invalidArg(`unknown hashBlocks option ${JSON.stringify(key)}`);
  }
  const { digests = false, ...rest } = options;
  if (typeof digests !== 'boolean') invalidArg('digests must be a boolean');
  return [nativeTokens(tokens), rest as NativeHashBlocksOptions, digests];
}

/**
 * Chained hash of every full block of `tokens`, exactly as the engine named by `algo` computes it.
 * A trailing partial block is not hashed.
 *
 * @example
 * const hashes = hashBlocks(new Uint32Array(tokens), { algo: 'vllm_sha256', blockSize: 16 });
 */
export function hashBlocks(tokens: Tokens, options: HashBlocksOptions & { digests: true }): HashDigests;
export function hashBlocks(tokens: Tokens, options: HashBlocksOptions): BigUint64Array;
export function hashBlocks(tokens: Tokens, options: HashBlocksOptions): BigUint64Array | HashDigests {
  const [toks, opts, digests] = nativeArgs(tokens, options);
  return callNative(() => (digests ? native.hashBlocksWithDigests(toks, opts) : native.hashBlocks(toks, opts)));
}

/**
 * `hashBlocks` off the JS thread, for bulk inputs. Always resolves with the digests form; bad input
 * rejects (the tokens are read before it returns).
 */
export async function hashBlocksAsync(tokens: Tokens, options: HashBlocksOptions & AbortOptions): Promise<HashDigests> {
  const { signal, ...hashing } = options;
  const [toks, opts, digests] = callNative(() => nativeArgs(tokens, hashing));
  return abortable(signal, () => awaitNative(() => native.hashBlocksAsync(toks, opts, digests)));
}

/** Each block's digest as lowercase hex (the TensorRT-LLM V2 wire form, SGLang's hash string). */
export function digestsHex(d: HashDigests): string[] {
  const out: string[] = [];
  for (let i = 0; i < d.hashes.length; i++) {
    out.push(d.digests.toString('hex', i * d.digestSize, (i + 1) * d.digestSize));
  }
  return out;
}

/** The signed (two's-complement) view of a u64 hash, as SGLang and the SMG proto carry it. */
export function toInt64(value: bigint): bigint {
  return callNative(() => native.toInt64(value));
}

/** The unsigned view of a signed 64-bit hash. */
export function toUint64(value: bigint): bigint {
  return callNative(() => native.toUint64(value));
}

/** The same hashes seen as signed 64-bit values (no copy). */
export function signedView(hashes: BigUint64Array): BigInt64Array {
  return new BigInt64Array(hashes.buffer, hashes.byteOffset, hashes.length);
}

/**
 * TensorRT-LLM's salt id of a `cache_salt` string: the first 8 bytes (little-endian) of its
 * SHA-256 digest, or with `{ hash: 'blake3' }` of its BLAKE3 digest as older TensorRT-LLM routers
 * computed it.
 */
export function trtllmCacheSaltId(salt: string, options: { hash?: 'sha256' | 'blake3' } = {}): bigint {
  return callNative(() => native.trtllmCacheSaltId(salt, options.hash));
}
