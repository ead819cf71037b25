/**
 * The normalized event model (docs/protocol.md#events), as the binding declares it: these types
 * come from the generated declarations (`index.d.ts`), never from a copy. u64 values are
 * `bigint`; hashes and tokens may be typed arrays.
 */
import type * as native from '../index.js';

/** A KV cache event, discriminated by `type`. */
export type KvEvent = native.KvEvent;
/** Blocks stored, chained from `parentBlockHash`. */
export type StoredEvent = Extract<KvEvent, { type: 'stored' }>;
/** Blocks removed. */
export type RemovedEvent = Extract<KvEvent, { type: 'removed' }>;
/** Every block of that worker (DP rank) is gone. */
export type ClearedEvent = Extract<KvEvent, { type: 'cleared' }>;
/** TensorRT-LLM only: a block changed cache level or priority. No effect on the index. */
export type UpdatedEvent = Extract<KvEvent, { type: 'updated' }>;
/** TensorRT-LLM only: the cache's capacity per level. No effect on the index. */
export type CreatedEvent = Extract<KvEvent, { type: 'created' }>;
/** Byte-string block hashes as the engine sent them. */
export type HashBytes = native.HashBytesIn;
/** A change of one value (TensorRT-LLM `event_diff`). */
export type Diff = native.DiffIo;
/** A batch of events from one DP rank. */
export type KvEventBatch = native.BatchIn;
/** An event as kvplane returns it (replay batches, tree dumps). */
export type KvEventOut = native.EventOut;
/** A batch as kvplane returns it. */
export type KvEventBatchOut = native.BatchOut;

/**
 * Events as columns: the bulk path of `KvEventPublisher.publishColumns` and
 * `LocalIndexer.applyColumns` (a few typed arrays for many events, no object per
 * event). `n = kinds.length`; hashes and tokens are concatenated in event order. The arrays
 * are read during the call and must not be written meanwhile (e.g. by a Worker through a
 * `SharedArrayBuffer`).
 */
export interface EventColumns {
  /** Per event: 0 stored, 1 removed, 2 cleared. */
  kinds: Uint8Array;
  /** Per event: its number of block hashes (0 for cleared). */
  hashCounts: Uint32Array;
  hashes: BigUint64Array;
  /** Per event: a stored event's parent hash, read where `hasParent` is 1. */
  parents: BigUint64Array;
  hasParent: Uint8Array;
  /** Every stored event's `hashCount * blockSize` tokens. */
  tokens: Uint32Array;
  blockSize: number;
  medium?: string;
  loraId?: bigint;
  loraName?: string;
}

/** The columns as the native calls take them: the typed arrays in order, then the block size and
 * the optional attributes (null when none). */
export function columnArgs(c: EventColumns) {
  const attrs =
    c.medium === undefined && c.loraId === undefined && c.loraName === undefined
      ? null
      : { medium: c.medium, loraId: c.loraId, loraName: c.loraName };
  return [c.kinds, c.hashCounts, c.hashes, c.parents, c.hasParent, c.tokens, c.blockSize, attrs] as const;
}
