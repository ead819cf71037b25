import { Counter, Gauge, Registry } from 'prom-client';
import type { KvEventPublisher } from '../../publisher.js';
import type { LatencySummary } from '../../sources/engine/latency.js';
import type { RankStats } from '../../sources/engine/zmq_source.js';
import type { GrpcStats } from '../grpc/server.js';

const INDEX_DROPS = ['unknown_parent', 'unknown_removed', 'duplicate_store', 'unsupported_layout'] as const;

/** Where a server's metrics go: the application's prom-client registry, and a name prefix. */
export interface MetricsOptions {
  /**
   * Register into this registry instead of a private one (the server's `/metrics` then serves it
   * whole). Two servers in one registry need different prefixes.
   */
  registry?: Registry;
  /** Prepended to every metric name. Default none. */
  prefix?: string;
}

/**
 * `/kv_recover` requests by outcome: the answer kinds, `Refused` (429, too many at once) and
 * `Abandoned` (a client that did not read its answer within the send timeout; also counted by kind).
 */
export type RecoverCounts = Record<'Events' | 'TreeDump' | 'TooNew' | 'InvalidRange' | 'Refused' | 'Abandoned', number>;

/**
 * Prometheus metrics of a publisher, read from its counters at scrape time (nothing is counted
 * twice and nothing on the hot path touches prom-client).
 */
export function publisherMetrics(
  publisher: KvEventPublisher,
  recover: RecoverCounts,
  grpc?: () => GrpcStats,
  sources: readonly { name: string; stats?: () => Record<string, unknown> }[] = [],
  into: MetricsOptions = {},
): Registry {
  const registry = into.registry ?? new Registry();
  const prefix = into.prefix ?? '';
  const stats = () => publisher.stats();
  const index = () => (publisher.closed ? undefined : publisher.indexer.stats());
  const counter = (name: string, help: string, read: () => number) =>
    new Counter({
      name: prefix + name,
      help,
      registers: [registry],
      collect() {
        this.reset();
        this.inc(read());
      },
    });
  const gauge = (name: string, help: string, read: () => number) =>
    new Gauge({
      name: prefix + name,
      help,
      registers: [registry],
      collect() {
        this.set(read());
      },
    });
  counter('kvplane_events_published_total', 'Events published on the stream', () => stats().events);
  counter('kvplane_batches_published_total', 'Batches published on the stream', () => stats().batches);
  counter('kvplane_seq_gaps_total', 'Seqs skipped because the publish queue lost events', () => stats().gaps);
  new Counter({
    name: `${prefix}kvplane_events_dropped_total`,
    help: 'Events dropped, by reason',
    labelNames: ['reason'],
    registers: [registry],
    collect() {
      this.reset();
      const s = stats();
      this.inc({ reason: 'queue_full' }, s.drops.queue_full);
      this.inc({ reason: 'send_failed' }, s.drops.send_failed);
      const ix = index();
      for (const r of INDEX_DROPS) this.inc({ reason: r }, ix?.drops[r] ?? 0);
    },
  });
  gauge('kvplane_subscribers', 'Peers connected to the live ZMQ socket', () => stats().subscribers);
  gauge('kvplane_queue_events', 'Events waiting in the publish queue', () => stats().queued);
  gauge('kvplane_last_seq', 'Newest published seq', () => Number(stats().lastSeq));
  gauge('kvplane_index_blocks', 'Blocks in the index', () => index()?.blocks ?? 0);
  gauge('kvplane_index_memberships', '(worker, block) memberships in the index', () => index()?.memberships ?? 0);
  gauge('kvplane_index_bytes', 'Heap bytes of the index', () => index()?.bytes ?? 0);
  gauge('kvplane_replay_log_batches', 'Batches retained for replay', () => index()?.retainedBatches ?? 0);
  gauge('kvplane_replay_log_bytes', 'Payload bytes retained for replay', () => index()?.logBytes ?? 0);
  gauge('kvplane_fail_closed_ranks', 'DP ranks whose source failed closed', () => stats().failClosed.length);
  counter('kvplane_replay_requests_total', 'ZMQ replay requests', () => stats().replay.requests);
  counter(
    'kvplane_replay_malformed_total',
    'ZMQ replay requests that were not [empty, 8-byte seq] (answered with the end marker alone)',
    () => stats().replay.malformed,
  );
  counter(
    'kvplane_replay_refused_total',
    'ZMQ replay requests refused (the end marker alone): too many were waiting, in all or of its peer',
    () => stats().replay.refused,
  );
  counter(
    'kvplane_zmq_live_dropped_total',
    'Live ZMQ batches a subscriber lost because its queue (hwm) was full, over all subscribers',
    () => stats().zmqLiveDropped,
  );
  counter(
    'kvplane_zmq_live_peers_refused_total',
    'Live ZMQ subscribers cut off for holding more than 256 distinct subscriptions or 64 KiB of them',
    () => stats().zmqLiveRefused.peers,
  );
  counter(
    'kvplane_zmq_live_accept_errors_total',
    'Connections the live ZMQ socket failed to accept (out of file descriptors or memory); it goes on accepting',
    () => stats().zmqLiveRefused.acceptErrors,
  );
  counter(
    'kvplane_zmq_auth_refused_total',
    'ZMQ CURVE clients refused: their key is not among the allowed clients',
    () => stats().authRefused,
  );
  counter(
    'kvplane_replay_abandoned_total',
    'ZMQ replays abandoned (peer gone or full)',
    () => stats().replay.abandoned,
  );
  counter('kvplane_replay_batches_total', 'Batches sent by ZMQ replay', () => stats().replay.batchesSent);
  counter(
    'kvplane_replay_batches_copied_total',
    'Batches of ZMQ replays copied out of the log (the rest were sent from the replay cache)',
    () => stats().replay.batchesCopied,
  );
  gauge(
    'kvplane_replay_sessions',
    'ZMQ replays in progress (each holds at most its send budget)',
    () => stats().replay.sessions,
  );
  new Counter({
    name: `${prefix}kvplane_recover_requests_total`,
    help: '/kv_recover requests, by answer kind, Refused (429) or Abandoned (not read within the send timeout)',
    labelNames: ['answer'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [answer, n] of Object.entries(recover)) this.inc({ answer }, n);
    },
  });
  engineRankMetrics(registry, prefix, sources);
  if (grpc) {
    gauge('kvplane_grpc_subscribers', 'Open gRPC SubscribeKvEvents streams', () => grpc().subscribers);
    gauge('kvplane_grpc_max_lag_batches', 'The most batches any gRPC subscriber has waiting', () => grpc().maxLag);
    gauge('kvplane_grpc_queued_bytes', 'Bytes queued in kvplane for gRPC subscribers', () => grpc().queuedBytes);
    counter('kvplane_grpc_batches_sent_total', 'Batches handed to gRPC subscribers', () => grpc().batchesSent);
    counter(
      'kvplane_grpc_load_only_sent_total',
      "load_only batches (the engine's load between batches) sent to gRPC subscribers",
      () => grpc().loadOnlySent,
    );
    counter('kvplane_grpc_load_polls_total', "The engine's GetLoads answers polled", () => grpc().loads?.polls ?? 0);
    counter(
      'kvplane_grpc_load_poll_failures_total',
      "The engine's GetLoads polls that failed",
      () => grpc().loads?.failures ?? 0,
    );
    counter(
      'kvplane_grpc_cut_off_total',
      'gRPC subscribers cut off for falling behind (RESOURCE_EXHAUSTED)',
      () => grpc().cutOff,
    );
    new Counter({
      name: `${prefix}kvplane_grpc_subscribes_total`,
      help: 'gRPC subscriptions, by outcome',
      labelNames: ['outcome'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [outcome, n] of Object.entries(grpc().subscribes)) this.inc({ outcome }, n);
      },
    });
  }
  return registry;
}

/** What an engine source counts per rank, as `kvplane_engine_rank_total{what}`. */
const RANK_COUNTS: Array<[keyof RankStats, string]> = [
  ['applied', 'applied'],
  ['gapsFilled', 'gaps_filled'],
  ['unrecoverable', 'unrecoverable'],
  ['restarts', 'restarts'],
  ['cleared', 'cleared'],
  ['duplicates', 'duplicates'],
  ['heldDropped', 'held_dropped'],
  ['malformed', 'malformed'],
  ['undecodable', 'undecodable'],
];

/** Per source and DP rank of an engine source: connected, last engine seq, and its counts. */
function engineRankMetrics(
  registry: Registry,
  prefix: string,
  sources: readonly { name: string; stats?: () => Record<string, unknown> }[],
): void {
  const ranks = () =>
    sources.flatMap((src) =>
      ((src.stats?.().ranks as RankStats[] | undefined) ?? []).map((r) => ({ source: src.name, r })),
    );
  new Gauge({
    name: `${prefix}kvplane_engine_rank_connected`,
    help: "Whether the relay is connected to an engine rank's publisher",
    labelNames: ['source', 'rank'],
    registers: [registry],
    collect() {
      this.reset();
      for (const { source, r } of ranks()) {
        if (r.connected !== undefined) this.set({ source, rank: r.rank }, r.connected ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: `${prefix}kvplane_engine_rank_last_seq`,
    help: 'The last engine seq relayed for a rank (-1 before the first)',
    labelNames: ['source', 'rank'],
    registers: [registry],
    collect() {
      this.reset();
      for (const { source, r } of ranks()) {
        if (r.lastEngineSeq !== undefined) this.set({ source, rank: r.rank }, Number(r.lastEngineSeq ?? -1n));
      }
    },
  });
  new Gauge({
    name: `${prefix}kvplane_engine_relay_latency_seconds`,
    help: "Time engine batches spend in the relay, read off the engine's socket to handed to the outputs, over its last 8192 batches (quantile 1: the most)",
    labelNames: ['source', 'quantile'],
    registers: [registry],
    collect() {
      this.reset();
      for (const src of sources) {
        const l = src.stats?.().relayLatencyMs as LatencySummary | undefined;
        if (!l || l.count === 0) continue;
        for (const [quantile, ms] of [
          ['0.5', l.p50],
          ['0.99', l.p99],
          ['1', l.max],
        ] as const)
          this.set({ source: src.name, quantile }, ms / 1000);
      }
    },
  });
  new Counter({
    name: `${prefix}kvplane_engine_rank_total`,
    help: 'Per engine rank: batches applied, gaps filled from replay, unrecoverable gaps, restarts, clears, duplicates, held batches dropped, malformed messages, undecodable payloads',
    labelNames: ['source', 'rank', 'what'],
    registers: [registry],
    collect() {
      this.reset();
      for (const { source, r } of ranks()) {
        for (const [key, what] of RANK_COUNTS) {
          const v = r[key];
          if (typeof v === 'number') this.inc({ source, rank: r.rank, what }, v);
        }
      }
    },
  });
}
