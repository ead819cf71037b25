import { Counter, Gauge, Registry } from 'prom-client';
import type { KvEventPublisher } from '../../publisher.js';
import type { GrpcStats } from '../grpc/server.js';

const INDEX_DROPS = ['unknown_parent', 'unknown_removed', 'duplicate_store', 'unsupported_layout'] as const;

/** Recovery answers served over HTTP, by kind, and requests refused (429) while others ran. */
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
): Registry {
  const registry = new Registry();
  const stats = () => publisher.stats();
  const index = () => (publisher.closed ? undefined : publisher.indexer.stats());
  const counter = (name: string, help: string, read: () => number) =>
    new Counter({
      name,
      help,
      registers: [registry],
      collect() {
        this.reset();
        this.inc(read());
      },
    });
  const gauge = (name: string, help: string, read: () => number) =>
    new Gauge({
      name,
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
    name: 'kvplane_events_dropped_total',
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
    'kvplane_replay_refused_total',
    'ZMQ replay requests refused (the end marker alone): too many were waiting',
    () => stats().replay.refused,
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
  gauge(
    'kvplane_replay_sessions',
    'ZMQ replays in progress (each holds at most its send budget)',
    () => stats().replay.sessions,
  );
  new Counter({
    name: 'kvplane_recover_requests_total',
    help: '/kv_recover requests, by answer kind, Refused (429) or Abandoned (not read within the send timeout)',
    labelNames: ['answer'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [answer, n] of Object.entries(recover)) this.inc({ answer }, n);
    },
  });
  if (grpc) {
    gauge('kvplane_grpc_subscribers', 'Open gRPC SubscribeKvEvents streams', () => grpc().subscribers);
    gauge('kvplane_grpc_max_lag_batches', 'The most batches any gRPC subscriber has waiting', () => grpc().maxLag);
    gauge('kvplane_grpc_queued_bytes', 'Bytes queued in kvplane for gRPC subscribers', () => grpc().queuedBytes);
    counter('kvplane_grpc_batches_sent_total', 'Batches handed to gRPC subscribers', () => grpc().batchesSent);
    counter(
      'kvplane_grpc_cut_off_total',
      'gRPC subscribers cut off for falling behind (RESOURCE_EXHAUSTED)',
      () => grpc().cutOff,
    );
    new Counter({
      name: 'kvplane_grpc_subscribes_total',
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
