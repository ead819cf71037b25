import { Counter, Gauge, Registry as PromRegistry } from 'prom-client';
import type { RouterIndexStats } from '../router_index.js';
import type { SubscriptionStats } from '../subscriptions/subscription.js';
import type { Registry } from './registry.js';

/**
 * The indexer's Prometheus metrics: requests and errors by route, and per worker its stream's
 * state (last seq, seconds since its last batch, recoveries by kind, restarts, reconnects), read
 * from the subscriptions' counters at scrape time.
 */
export function indexerMetrics(registry: Registry): {
  prom: PromRegistry;
  request(route: string): void;
  error(route: string, status: number): void;
  /** The scrape's text: every figure read once. */
  scrape(): Promise<string>;
} {
  const prom = new PromRegistry();
  const requests = new Counter({
    name: 'kvplane_indexer_requests_total',
    help: 'HTTP requests by route',
    labelNames: ['endpoint'],
    registers: [prom],
  });
  const errors = new Counter({
    name: 'kvplane_indexer_errors_total',
    help: 'HTTP error answers by route and status class',
    labelNames: ['endpoint', 'status_class'],
    registers: [prom],
  });
  // Read once per scrape, not once per metric.
  let snap: { subs: SubscriptionStats[]; indexes: Array<[string, RouterIndexStats]> } | null = null;
  const read = () => {
    snap ??= {
      subs: [...registry.indexes().values()].flatMap((ix) => ix.subscriptionStats()),
      indexes: [...registry.indexes()].map(([k, ix]) => [k, ix.stats()] as [string, RouterIndexStats]),
    };
    return snap;
  };
  const subs = () => read().subs;
  /**
   * Per-worker families, written as exposition text at scrape time: a router follows many
   * workers, and building a labelled series object per worker per family costs milliseconds a
   * scrape.
   */
  const families: Array<{
    name: string;
    help: string;
    kind: 'gauge' | 'counter';
    read: (s: SubscriptionStats) => number | null;
  }> = [];
  const perWorker = (
    name: string,
    help: string,
    read: (s: SubscriptionStats) => number | null,
    kind: 'gauge' | 'counter' = 'gauge',
  ) => {
    families.push({ name, help, kind, read });
  };
  const perWorkerText = (): string => {
    const all = subs();
    const labels = all.map((s) => `instance_id="${s.workerId}",dp_rank="${s.dpRank}"`);
    let out = '';
    for (const f of families) {
      out += `# HELP ${f.name} ${f.help}\n# TYPE ${f.name} ${f.kind}\n`;
      for (const [i, s] of all.entries()) {
        const v = f.read(s);
        if (v !== null) out += `${f.name}{${labels[i]}} ${v}\n`;
      }
    }
    out +=
      '# HELP kvplane_indexer_worker_recoveries_total recoveries by kind: resume (from the last seq), snapshot (rebuilt from the node), replay (gap filled from an engine), cleared (nothing to rebuild from)\n# TYPE kvplane_indexer_worker_recoveries_total counter\n';
    for (const [i, s] of all.entries()) {
      for (const [kind, n] of Object.entries(s.recoveries))
        out += `kvplane_indexer_worker_recoveries_total{${labels[i]},kind="${kind}"} ${n}\n`;
    }
    return out;
  };
  new Gauge({
    name: 'kvplane_indexer_models',
    help: '(model, routing group) indexes',
    registers: [prom],
    collect() {
      this.set(registry.indexes().size);
    },
  });
  new Gauge({
    name: 'kvplane_indexer_workers',
    help: 'registered instances',
    registers: [prom],
    collect() {
      this.set(registry.instances().size);
    },
  });
  perWorker('kvplane_indexer_worker_last_seq', 'last seq applied from the worker (node numbering)', (s) =>
    s.lastSeq === null ? null : Number(s.lastSeq),
  );
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
    "live batches dropped by the subscription's own receive bound (then recovered as a gap)",
    (s) => s.dropped,
    'counter',
  );
  new Counter({
    name: 'kvplane_indexer_drops_total',
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
    name: 'kvplane_indexer_memberships',
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
    name: 'kvplane_indexer_index_bytes',
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
  return {
    prom,
    async scrape() {
      snap = null;
      try {
        return (await prom.metrics()) + perWorkerText();
      } finally {
        snap = null;
      }
    },
    request: (route) => requests.inc({ endpoint: route }),
    error: (route, status) => errors.inc({ endpoint: route, status_class: status >= 500 ? '5xx' : '4xx' }),
  };
}
