export type { AbortOptions } from './abort.js';
export {
  type DecodedBatches,
  type Dialect,
  decodeBatch,
  decodeBatches,
  decodeRecoverAnswer,
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
  type Snapshot,
  type SubscribeCursor,
  type Worker,
  type WorkerEvents,
  type ZmqFormat,
} from './indexer.js';
export {
  KvEventPublisher,
  type KvEventPublisherOptions,
  type PublisherStats,
} from './publisher.js';
export { type DumpedIndex, readIndexerDump } from './router/indexer_dump.js';
export type { FindMatchesRequest, RouterMatches } from './router/matches.js';
export {
  type RouterDumpSegment,
  RouterIndex,
  type RouterIndexEvents,
  type RouterIndexOptions,
  type RouterIndexStats,
  type WorkerSource,
} from './router/router_index.js';
export { IndexerServer, type IndexerServerEvents, type IndexerServerOptions } from './router/service/server.js';
export type {
  RecoveryCounts,
  RecoveryKind,
  Subscription,
  SubscriptionStats,
} from './router/subscriptions/subscription.js';
export { SOURCES, type SourceEntry, type SourceSettings, sourceNames } from './sources/registry.js';
export { SimEngine, type SimEngineOptions, type SimStats } from './sources/sim/engine.js';
export { SimSource } from './sources/sim/source.js';
export type { EventSink, EventSource, SourceHealth } from './sources/source.js';
export type { BatchConsumer, EncodedBatches } from './stream/batches.js';
export type { BatchIterationOptions, BatchIterator } from './stream/iterate.js';
export { KvEventStream, type KvEventStreamOptions, type KvStreamEvents, type StreamStats } from './stream/stream.js';
export { ENGINE_METHODS, type EngineMethod } from './transports/grpc/engine_methods.js';
export {
  type GrpcStats,
  type GrpcTlsOptions,
  KvGrpcServer,
  type KvGrpcServerEvents,
  type KvGrpcServerOptions,
} from './transports/grpc/server.js';
export {
  decodeSubscribeRequest,
  ENGINE_SERVICE,
  encodeHealthResponse,
  encodeSubscribeRequest,
  KV_EVENT_SERVICES,
  type KvEventService,
  rawMethod,
  subscribeDefinition,
  subscribePath,
} from './transports/grpc/services.js';
export type { MetricsOptions } from './transports/http/metrics.js';
export {
  KvHttpServer,
  type KvHttpServerEvents,
  type KvHttpServerOptions,
  type SourceInfo,
} from './transports/http/server.js';
export { trimMemorySoon } from './transports/memory.js';
export {
  connectWarning,
  endpointForRank,
  type KvEventsConfig,
  kvEventsConfigFromJson,
  shouldBind,
  zmqAddress,
} from './transports/zmq/config.js';
export { curvePublicKey, readCurveClients, readCurveSecretKey, type ZmqCurveOptions } from './transports/zmq/curve.js';
