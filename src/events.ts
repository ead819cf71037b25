/** The normalized event model (spec §2). u64 values are `bigint`; hashes and tokens are typed arrays. */

export interface StoredEvent {
  type: 'stored';
  /** The engine's block hashes (opaque ids), one per block. */
  blockHashes: BigUint64Array | readonly bigint[];
  /** The engine hash of the block the chain continues from; absent or `null` for a root. */
  parentBlockHash?: bigint | null;
  /** `blockHashes.length * blockSize` token ids. */
  tokenIds: Uint32Array | readonly number[];
  blockSize: number;
  loraId?: bigint;
  loraName?: string;
  /** Storage tier (`GPU`, `CPU`, `DISK`, ...); unknown values are kept. */
  medium?: string;
  groupIdx?: number;
  cacheSalt?: string;
  /** vLLM's per-block extra keys, opaque (kept for re-encoding). */
  extraKeys?: unknown;
  kvCacheSpecKind?: string;
  kvCacheSpecSlidingWindow?: number;
  /** `LOCAL` or `REMOTE` relative to the publisher. */
  locality?: string;
  ownership?: string;
  sessionId?: string;
  /** Tokens beyond each block used in its hash, opaque. */
  lookaheadTokenIds?: unknown;
  /** The engine's byte-string hashes, when it sent bytes (`blockHashes` holds their u64 ids). */
  hashBytes?: HashBytes;
}

/** Byte-string block hashes as the engine sent them. */
export interface HashBytes {
  blocks?: readonly Uint8Array[];
  parent?: Uint8Array;
}

export interface RemovedEvent {
  type: 'removed';
  blockHashes: BigUint64Array | readonly bigint[];
  medium?: string;
  groupIdx?: number;
  locality?: string;
  ownership?: string;
  hashBytes?: { blocks?: readonly Uint8Array[] };
}

/** A change of one value (TensorRT-LLM `event_diff`). */
export interface Diff {
  old: number;
  new: number;
}

/** TensorRT-LLM only: a block changed cache level or priority. No effect on the index. */
export interface UpdatedEvent {
  type: 'updated';
  blockHash: bigint;
  cacheLevel?: Diff;
  priority?: Diff;
}

/** TensorRT-LLM only: the cache's capacity per level. No effect on the index. */
export interface CreatedEvent {
  type: 'created';
  numBlocksPerCacheLevel: readonly number[];
}

/** Every block of that worker (DP rank) is gone. */
export interface ClearedEvent {
  type: 'cleared';
}

export type KvEvent = StoredEvent | RemovedEvent | ClearedEvent | UpdatedEvent | CreatedEvent;

/** A batch of events from one DP rank. */
export interface KvEventBatch {
  /** The batch's seq; omit to take the next one. */
  seq?: bigint;
  /** Unix seconds. */
  ts?: number;
  dpRank?: number | null;
  /** At most 1024 events. */
  events: readonly KvEvent[];
}

/** An event as kvplane returns it (replay batches, tree dumps). */
export interface KvEventOut {
  type: 'stored' | 'removed' | 'cleared' | 'updated' | 'created';
  blockHashes?: BigUint64Array;
  parentBlockHash?: bigint;
  tokenIds?: Uint32Array;
  blockSize?: number;
  loraId?: bigint;
  loraName?: string;
  medium?: string;
  groupIdx?: number;
  cacheSalt?: string;
  extraKeys?: unknown;
  kvCacheSpecKind?: string;
  kvCacheSpecSlidingWindow?: number;
  locality?: string;
  ownership?: string;
  sessionId?: string;
  lookaheadTokenIds?: unknown;
  hashBytes?: { blocks?: Buffer[]; parent?: Buffer };
  blockHash?: bigint;
  cacheLevel?: Diff;
  priority?: Diff;
  numBlocksPerCacheLevel?: number[];
}

export interface KvEventBatchOut {
  seq: bigint;
  ts: number;
  dpRank?: number;
  events: KvEventOut[];
}

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
