import { Counter, Gauge, Registry as PromRegistry } from 'prom-client';
import type { MetricsOptions } from '../../transports/http/metrics.js';
import type { RouterIndexStats } from '../router_index.js';
import type { SubscriptionStats } from '../subscriptions/subscription.js';
import { dynamoIndexerMetrics } from './dynamo_metrics.js';
import type { Registry } from './registry.js';

/**
 * The indexer's Prometheus metrics: requests and errors by route, and per worker its stream's
 * state (last seq, seconds since its last batch, recoveries by kind, restarts, reconnects), read
 * from the subscriptions' counters at scrape time.
 *
 * In a private registry the per-worker families are written as exposition text beside the
 * registry's own: a router follows many workers, and series objects per worker per family cost
 * milliseconds a scrape. In the application's registry (`into.registry`) they are registered as
 * metrics of their own, so that the application's scrape has them too.
 */
export function indexerMetrics(
  registry: Registry,
  into: MetricsOptions = {},
  /** Lines the access log could not write, when there is one. */
  accessLogErrors?: () => number,
): {
  prom: PromRegistry;
  /**
   * A request to a route answered, with its status and duration: kvplane's families and Dynamo's
   * indexer's (`dynamo_metrics.ts`), which leave `/metrics` itself out (its errors aside).
   */
  answered(route: string, method: string, status: number, seconds: number): void;
  /** The scrape's text: every figure read once. */
  scrape(): Promise<string>;
} {
  const prom = into.registry ?? new PromRegistry();
  const prefix = into.prefix ?? '';
  const requests = new Counter({
    name: `${prefix}kvplane_indexer_requests_total`,
    help: 'HTTP requests by route',
    labelNames: ['endpoint'],
    registers: [prom],
  });
  const errors = new Counter({
    name: `${prefix}kvplane_indexer_errors_total`,
    help: 'HTTP error answers by route and status class',
    labelNames: ['endpoint', 'status_class'],
    registers: [prom],
  });
  // Read once per scrape, not once per metric: a registry collects all its metrics in one tick.
  let snap: { subs: SubscriptionStats[]; indexes: Array<[string, RouterIndexStats]> } | null = null;
  const read = () => {
    if (snap === null) {
      snap = {
        subs: registry.indexes().flatMap(([, ix]) => ix.subscriptionStats()),
        indexes: registry.indexes().map(([k, ix]) => [k, ix.stats()] as [string, RouterIndexStats]),
      };
      setImmediate(() => {
        snap = null;
      });
    }
    return snap;
  };
  const subs = () => read().subs;
  const dynamo = dynamoIndexerMetrics(registry, prom, prefix, () => read().indexes);
  /** Per-worker families: one value per worker, or per worker and kind (`byKind`). */
  const families: Array<{
    name: string;
    help: string;
    kind: 'gauge' | 'counter';
    /** A bigint is written exactly in the indexer's own text; the application's registry takes numbers. */
    read?: (s: SubscriptionStats) => number | bigint | null;
    byKind?: (s: SubscriptionStats) => Record<string, number>;
  }> = [];
  const perWorker = (
    name: string,
    help: string,
    read: (s: SubscriptionStats) => number | bigint | null,
    kind: 'gauge' | 'counter' = 'gauge',
  ) => {
    families.push({ name: prefix + name, help, kind, read });
  };
  const perWorkerText = (all: SubscriptionStats[]): string => {
    const labels = all.map((s) => `instance_id="${s.workerId}",dp_rank="${s.dpRank}"`);
    let out = '';
    for (const f of families) {
      out += `# HELP ${f.name} ${f.help}\n# TYPE ${f.name} ${f.kind}\n`;
      for (const [i, s] of all.entries()) {
        if (f.byKind) {
          for (const [kind, n] of Object.entries(f.byKind(s))) out += `${f.name}{${labels[i]},kind="${kind}"} ${n}\n`;
        } else {
          const v = f.read?.(s) ?? null;
          if (v !== null) out += `${f.name}{${labels[i]}} ${v}\n`;
        }
      }
    }
    return out;
  };
  /** A family as a metric of the application's registry, read at its scrape. */
  const asMetric = (f: (typeof families)[number]) => {
    const values = () =>
      subs().flatMap((s) => {
        const labels = { instance_id: String(s.workerId), dp_rank: s.dpRank };
        if (f.byKind)
          return Object.entries(f.byKind(s)).map(([kind, value]) => ({ labels: { ...labels, kind }, value }));
        const value = f.read?.(s) ?? null;
        return value === null ? [] : [{ labels, value: Number(value) }];
      });
    const metric = { name: f.name, help: f.help, type: f.kind, aggregator: 'sum' as const };
    return { ...metric, get: () => ({ ...metric, values: values() }), reset() {} };
  };
  new Gauge({
    name: `${prefix}kvplane_indexer_models`,
    help: '(model, routing group) indexes',
    registers: [prom],
    collect() {
      this.set(registry.indexes().length);
    },
  });
  new Gauge({
    name: `${prefix}kvplane_indexer_workers`,
    help: 'registered instances',
    registers: [prom],
    collect() {
      this.set(registry.instances().size);
    },
  });
  perWorker('kvplane_indexer_worker_last_seq', 'last seq applied from the worker (node numbering)', (s) => s.lastSeq);
  perWorker('kvplane_indexer_worker_lag_seconds', 'seconds since the last batch applied from the worker', (s) =>
    s.lastBatchAt === null ? null : (Date.now() - s.lastBatchAt) / 1000,
  );
  perWorker(
    'kvplane_indexer_worker_live',
    '1 when the worker is followed live (not connecting, recovering or backing off)',
    (s) => (s.state === 'live' ? 1 : 0),
  );
  perWorker('kvplane_indexer_worker_events_total', 'events applied from the worker', (s) => s.events, 'counter');
  perWorker('kvplane_indexer_worker_restarts_total', 'node restarts seen', (s) => s.restarts, 'counter');
  perWorker('kvplane_indexer_worker_reconnects_total', 'streams lost and opened again', (s) => s.reconnects, 'counter');
  perWorker(
    'kvplane_indexer_worker_duplicates_total',
    'batches skipped as already applied',
    (s) => s.duplicates,
    'counter',
  );
  perWorker('kvplane_indexer_worker_undecodable_total', 'batches that did not decode', (s) => s.undecodable, 'counter');
  perWorker(
    'kvplane_indexer_worker_dropped_total',
    "live batches dropped by the subscription's own receive bound, or held past 10,000 during a recovery",
    (s) => s.dropped,
    'counter',
  );
  perWorker(
    'kvplane_indexer_worker_malformed_total',
    'ZMQ messages that were not batches (frame count, seq size), live or replayed: skipped',
    (s) => s.malformed,
    'counter',
  );
  new Counter({
    name: `${prefix}kvplane_indexer_drops_total`,
    help: 'events not indexed, by index and reason',
    labelNames: ['index', 'reason'],
    registers: [prom],
    collect() {
      this.reset();
      for (const [key, st] of read().indexes) {
        for (const [reason, n] of Object.entries(st.drops)) this.inc({ index: key, reason }, n);
      }
    },
  });
  new Gauge({
    name: `${prefix}kvplane_indexer_memberships`,
    help: '(worker, block) memberships by index and tier',
    labelNames: ['index', 'tier'],
    registers: [prom],
    collect() {
      this.reset();
      for (const [key, st] of read().indexes) {
        for (const t of st.tiers) this.set({ index: key, tier: t.tier }, t.memberships);
      }
    },
  });
  new Gauge({
    name: `${prefix}kvplane_indexer_index_bytes`,
    help: 'heap bytes of each index, all tiers',
    labelNames: ['index'],
    registers: [prom],
    collect() {
      this.reset();
      for (const [key, st] of read().indexes) {
        this.set(
          { index: key },
          st.tiers.reduce((a, t) => a + t.bytes, 0),
        );
      }
    },
  });
  if (accessLogErrors) {
    new Counter({
      name: `${prefix}kvplane_indexer_access_log_errors_total`,
      help: 'access log lines that could not be written (a full disk, a removed directory)',
      registers: [prom],
      collect() {
        this.reset();
        this.inc(accessLogErrors());
      },
    });
  }
  families.push({
    name: `${prefix}kvplane_indexer_worker_recoveries_total`,
    help: 'recoveries by kind: resume (from the last seq), snapshot (rebuilt from the node), replay (gap filled from an engine), cleared (nothing to rebuild from)',
    kind: 'counter',
    byKind: (s) => ({ ...s.recoveries }),
  });
  // biome-ignore lint/suspicious/noExplicitAny: prom-client types a custom metric as its own classes
  if (into.registry) for (const f of families) prom.registerMetric(asMetric(f) as any);
  return {
    prom,
    async scrape() {
      const all = subs();
      const text = await prom.metrics();
      return into.registry ? text : text + perWorkerText(all);
    },
    answered(route, method, status, seconds) {
      if (status >= 400) errors.inc({ endpoint: route, status_class: status >= 500 ? '5xx' : '4xx' });
      if (route === '/metrics') return;
      requests.inc({ endpoint: route });
      dynamo.answered(route, method, status, seconds);
    },
  };
}
