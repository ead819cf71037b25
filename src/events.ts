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
}

export interface RemovedEvent {
  type: 'removed';
  blockHashes: BigUint64Array | readonly bigint[];
  medium?: string;
  groupIdx?: number;
}

/** Every block of that worker (DP rank) is gone. */
export interface ClearedEvent {
  type: 'cleared';
}

export type KvEvent = StoredEvent | RemovedEvent | ClearedEvent;

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
  type: 'stored' | 'removed' | 'cleared';
  blockHashes?: BigUint64Array;
  parentBlockHash?: bigint;
  tokenIds?: Uint32Array;
  blockSize?: number;
  loraId?: bigint;
  loraName?: string;
  medium?: string;
  groupIdx?: number;
  cacheSalt?: string;
}

export interface KvEventBatchOut {
  seq: bigint;
  ts: number;
  dpRank?: number;
  events: KvEventOut[];
}
