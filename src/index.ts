export { KvPlaneError, type KvPlaneErrorCode } from './errors.js';
export type {
  ClearedEvent,
  KvEvent,
  KvEventBatch,
  KvEventBatchOut,
  KvEventOut,
  RemovedEvent,
  StoredEvent,
} from './events.js';
export {
  digestsHex,
  type ExtraKey,
  type HashAlgo,
  type HashBlocksOptions,
  type HashDigests,
  hashBlocks,
  hashBlocksAsync,
  signedView,
  type Tokens,
  toInt64,
  toUint64,
  trtllmCacheSaltId,
} from './hash.js';
export {
  type ApplyResult,
  type FindMatchesOptions,
  type IndexerStats,
  LocalIndexer,
  type LocalIndexerOptions,
  type Matches,
  type Recovery,
  type Worker,
  type WorkerEvents,
} from './indexer.js';
