import { callNative, KvPlaneError } from './errors.js';
import type { KvEventBatch, KvEventBatchOut } from './events.js';
import type { Recovery } from './indexer.js';
import native from './native.js';

/**
 * Wire dialects kvplane decodes (docs/protocol.md#formats-at-a-glance):
 * - `vllm`: vLLM's ZMQ msgpack payload, every generation (tagged maps or legacy arrays, 2- to
 *   n-slot batches, int or byte-string hashes);
 * - `sglang`: SGLang's (signed hashes, EAGLE token pairs, the salted legacy slot);
 * - `trtllm`: TensorRT-LLM events over ZMQ (msgpack with vLLM's field names);
 * - `trtllm_json`: TensorRT-LLM's `/kv_cache_events` JSON list;
 * - `smg_proto`: SMG's protobuf `KvEventBatch`.
 */
export type Dialect = 'vllm' | 'sglang' | 'trtllm' | 'trtllm_json' | 'smg_proto';

/**
 * Formats kvplane encodes: `vllm` (current tagged maps, byte-identical to msgspec), `vllm_legacy`
 * (tagged arrays), `sglang` (SGLang's maps, signed hashes), `smg_proto` (`KvEventBatch`, one
 * `KvBlock` per hash, `event_id = (seq << 32) | index`).
 */
export type EncodeFormat = 'vllm' | 'vllm_legacy' | 'sglang' | 'smg_proto';

export interface DecodedBatches {
  /** Batches in order; the batch seq is the proto's, else `0n` (ZMQ carries it in a frame). */
  batches: KvEventBatchOut[];
  /** The source's event ids per batch (`trtllm_json`, `smg_proto`); empty arrays otherwise. */
  eventIds: BigUint64Array[];
  /** Events of kinds this version does not know: skipped, never guessed. */
  unknownEvents: number;
}

function bytesOf(bytes: Uint8Array | string): Buffer {
  if (typeof bytes === 'string') return Buffer.from(bytes, 'utf8');
  if (bytes instanceof Uint8Array) return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new KvPlaneError('ERR_INVALID_ARG', 'bytes must be a Uint8Array/Buffer (or a JSON string)');
}

/**
 * Decodes a payload into normalized batches. Throws `ERR_DECODE` on bytes that are not the
 * dialect, and `ERR_UNSUPPORTED_LAYOUT` (with the reason) for a stored event whose tokens do not
 * split into `blockSize` x hashes: never a guessed split.
 */
export function decodeBatches(bytes: Uint8Array | string, dialect: Dialect): DecodedBatches {
  const buf = bytesOf(bytes);
  return callNative(() => native.decodeBatches(buf, dialect)) as DecodedBatches;
}

/**
 * Reads a `/kv_recover` answer in msgpack (`format=msgpack`; docs/protocol.md#http-kv_recover) as
 * the same `Recovery` an indexer's `getEvents` returns (`ERR_DECODE` if it is not one).
 */
export function decodeRecoverAnswer(bytes: Uint8Array): Recovery {
  const buf = bytesOf(bytes);
  return callNative(() => native.decodeRecoverAnswer(buf)) as Recovery;
}

/** Decodes a payload that holds one batch (every dialect but a multi-rank `trtllm_json` list). */
export function decodeBatch(bytes: Uint8Array | string, dialect: Dialect): KvEventBatchOut & { unknownEvents: number } {
  const d = decodeBatches(bytes, dialect);
  const [only, ...rest] = d.batches;
  if (only === undefined || rest.length > 0) {
    throw new KvPlaneError(
      'ERR_INVALID_ARG',
      `the payload holds ${d.batches.length} batches (one per attention-DP rank); use decodeBatches`,
    );
  }
  return { ...only, unknownEvents: d.unknownEvents };
}

/** Encodes a batch once; the same bytes go to every subscriber. */
export function encodeBatch(batch: KvEventBatch, format: EncodeFormat): Buffer {
  return callNative(() => native.encodeBatch(batch, format));
}
