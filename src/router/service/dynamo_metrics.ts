import { Counter, Gauge, Histogram, type Registry as PromRegistry } from 'prom-client';
import type { RouterIndexStats } from '../router_index.js';
import type { Registry } from './registry.js';

/**
 * Request latency buckets of Dynamo's indexer: 100 µs doubling twenty times (to 52.4 s).
 */
const DURATION_BUCKETS = Array.from({ length: 20 }, (_, k) => 0.0001 * 2 ** k);

/**
 * The statuses Dynamo's indexer counts applied events under, every one written for every kind (as
 * it does); kvplane's index has the first four.
 */
const EVENT_STATUSES = [
  'ok',
  'parent_block_not_found',
  'block_not_found',
  'invalid_block',
  'allocation_failed',
  'capacity_exhausted',
  'indexer_invariant_violation',
  'ownership_degree_overflow',
  'unsupported_residency_domain',
];

/** A subscription's state as the listener status Dynamo's indexer counts. */
const LISTENER_STATUS: Record<string, string> = {
  live: 'active',
  connecting: 'pending',
  recovering: 'pending',
  backoff: 'pending',
};

/**
 * The `dynamo_kvindexer_*` families of Dynamo's standalone indexer, with its names, labels and
 * buckets, and its `dynamo_kvrouter_kv_cache_events_applied`, beside kvplane's own: dashboards and alerts written for that indexer read this one
 * too (docs/protocol.md#router-side-kvplane-indexer). `answered` is called once per request to a
 * route, when its answer is sent.
 */
export function dynamoIndexerMetrics(
  registry: Registry,
  prom: PromRegistry,
  prefix: string,
  /** Each index's stats, read once per scrape. */
  indexStats: () => Array<[string, RouterIndexStats]>,
): { answered(route: string, method: string, status: number, seconds: number): void } {
  const name = (n: string) => `${prefix}dynamo_kvindexer_${n}`;
  const requests = new Counter({
    name: name('requests_total'),
    help: 'HTTP requests by route and method',
    labelNames: ['endpoint', 'method'],
    registers: [prom],
  });
  const errors = new Counter({
    name: name('errors_total'),
    help: 'HTTP answers with a 4xx or 5xx status, by route',
    labelNames: ['endpoint', 'status_class'],
    registers: [prom],
  });
  const duration = new Histogram({
    name: name('request_duration_seconds'),
    help: 'seconds from a request to its answer, by route',
    labelNames: ['endpoint'],
    buckets: DURATION_BUCKETS,
    registers: [prom],
  });
  new Gauge({
    name: name('models'),
    help: '(model, routing group) indexes',
    registers: [prom],
    collect() {
      this.set(registry.indexes().length);
    },
  });
  new Gauge({
    name: name('workers'),
    help: 'registered instances',
    registers: [prom],
    collect() {
      this.set(registry.instances().size);
    },
  });
  new Gauge({
    name: name('listeners'),
    help: 'followed (instance, rank) streams by status: active (live), pending (connecting or recovering), failed, paused',
    labelNames: ['status'],
    registers: [prom],
    collect() {
      const n: Record<string, number> = { active: 0, pending: 0, failed: 0, paused: 0 };
      for (const [, ix] of registry.indexes()) {
        for (const s of ix.subscriptionStats()) {
          const status = LISTENER_STATUS[s.state];
          if (status !== undefined) n[status] = (n[status] ?? 0) + 1;
        }
      }
      for (const [status, v] of Object.entries(n)) this.set({ status }, v);
    },
  });
  new Counter({
    name: `${prefix}dynamo_kvrouter_kv_cache_events_applied`,
    help: 'engine KV cache events applied to the indexes, by event type and outcome',
    labelNames: ['event_type', 'status'],
    registers: [prom],
    collect() {
      this.reset();
      const n = new Map<string, number>();
      for (const [, st] of indexStats()) {
        for (const e of st.events) n.set(`${e.kind} ${e.outcome}`, (n.get(`${e.kind} ${e.outcome}`) ?? 0) + e.count);
      }
      for (const kind of ['cleared', 'removed', 'stored']) {
        for (const status of EVENT_STATUSES) this.inc({ event_type: kind, status }, n.get(`${kind} ${status}`) ?? 0);
      }
    },
  });
  return {
    answered(route, method, status, seconds) {
      requests.inc({ endpoint: route, method });
      if (status >= 400) errors.inc({ endpoint: route, status_class: status >= 500 ? '5xx' : '4xx' });
      duration.observe({ endpoint: route }, seconds);
    },
  };
}
