export {
  type DecodedBatches,
  type Dialect,
  decodeBatch,
  decodeBatches,
  type EncodeFormat,
  encodeBatch,
} from './codec.js';
export { KvPlaneError, type KvPlaneErrorCode } from './errors.js';
export type {
  ClearedEvent,
  CreatedEvent,
  Diff,
  EventColumns,
  HashBytes,
  KvEvent,
  KvEventBatch,
  KvEventBatchOut,
  KvEventOut,
  RemovedEvent,
  StoredEvent,
  UpdatedEvent,
} from './events.js';
export {
  type GrpcStats,
  type GrpcTlsOptions,
  KvGrpcServer,
  type KvGrpcServerOptions,
} from './grpc/server.js';
export {
  decodeSubscribeRequest,
  encodeSubscribeRequest,
  KV_EVENT_SERVICES,
  type KvEventService,
  subscribeDefinition,
  subscribePath,
} from './grpc/services.js';
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
  type EncodedApplyResult,
  type FindMatchesOptions,
  type IndexerStats,
  LocalIndexer,
  type LocalIndexerOptions,
  type LoggedBatches,
  type Matches,
  type RecoverAnswer,
  type Recovery,
  type SubscribeCursor,
  type Worker,
  type WorkerEvents,
  type ZmqFormat,
} from './indexer.js';
export {
  endpointForRank,
  type KvEventsConfig,
  kvEventsConfigFromJson,
  shouldBind,
} from './publisher/config.js';
export {
  KvEventPublisher,
  type KvEventPublisherOptions,
  type PublishedBatches,
  type PublisherStats,
} from './publisher/publisher.js';
export { KvHttpServer, type KvHttpServerOptions, type SourceInfo } from './server/http.js';
export { type EventSink, SimEngine, type SimEngineOptions, type SimStats } from './sim/engine.js';
