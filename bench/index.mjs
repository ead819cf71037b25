// LocalIndexer against a pure-TS Map/Set index (bench/baseline/ts-index.mjs), side by side in
// one process on the same events: apply throughput with 1M blocks resident, findMatches for an
// 8k-token request against 128 workers x 16k blocks, bytes per membership, tree-dump time.
//
//   npm run build && npm run bench:index
import { createRequire } from 'node:module';
import { cpus } from 'node:os';
import { TsIndex } from './baseline/ts-index.mjs';
import { batchesByRank } from './churn.mjs';
import { pinToOneCpu } from './pin.mjs';
import { nextHash, rand } from './prng.mjs';
import { settle } from './settle.mjs';

pinToOneCpu();

const require = createRequire(import.meta.url);
const { LocalIndexer } = require('../dist/index.js');

const BS = 16;
const tokens = (blocks) => Uint32Array.from({ length: blocks * BS }, () => rand() % 150000);
const stored = (toks, parent) => ({
  type: 'stored',
  blockHashes: BigUint64Array.from({ length: toks.length / BS }, nextHash),
  parentBlockHash: parent,
  tokenIds: toks,
  blockSize: BS,
});
const last = (a) => a[a.length - 1];

/** The 128 x 16k workload of the Rust bench: per rank, two shared prompts + private conversations. */
function workload(ranks, blocksPerRank) {
  const prompts = Array.from({ length: 8 }, () => tokens(64));
  const shared = tokens(448);
  const perRank = [];
  for (let w = 0; w < ranks; w++) {
    const events = [];
    const tails = [];
    let held = 0;
    for (const p of [w % 8, (Math.floor(w / 8) + 1) % 8]) {
      const ev = stored(prompts[p], null);
      tails.push(last(ev.blockHashes));
      events.push(ev);
      held += 64;
    }
    if (w < 64 && w % 8 === 0) {
      const depth = 56 + (w / 8) * 56;
      events.push(stored(shared.subarray(0, depth * BS), tails[0]));
      held += depth;
    }
    while (held < blocksPerRank) {
      let prev = tails[rand() % 2];
      const n = Math.min(blocksPerRank - held, 256);
      for (let i = 0; i < n; i += 16) {
        const ev = stored(tokens(Math.min(16, n - i)), prev);
        prev = last(ev.blockHashes);
        events.push(ev);
      }
      held += n;
    }
    perRank.push(events);
  }
  const request = Uint32Array.from([...prompts[0], ...shared]);
  return { perRank, request };
}

/** Stored / removed events (one block size) as `applyColumns` input. */
function columnsOf(events) {
  const n = events.length;
  const kinds = new Uint8Array(n);
  const hashCounts = new Uint32Array(n);
  const parents = new BigUint64Array(n);
  const hasParent = new Uint8Array(n);
  const hashes = [];
  const toks = [];
  events.forEach((ev, i) => {
    kinds[i] = ev.type === 'stored' ? 0 : 1;
    hashCounts[i] = ev.blockHashes.length;
    hashes.push(...ev.blockHashes);
    if (ev.type === 'stored') {
      if (ev.parentBlockHash !== null) {
        parents[i] = ev.parentBlockHash;
        hasParent[i] = 1;
      }
      toks.push(ev.tokenIds);
    }
  });
  const tokens = new Uint32Array(toks.reduce((a, t) => a + t.length, 0));
  let at = 0;
  for (const t of toks) {
    tokens.set(t, at);
    at += t.length;
  }
  return { kinds, hashCounts, hashes: BigUint64Array.from(hashes), parents, hasParent, tokens, blockSize: BS };
}

/** Loads the events into a fresh LocalIndexer, in batches of up to 1024 events per rank. */
function loadKvplane(perRank, retainTokens) {
  const ix = new LocalIndexer({ blockSize: BS, retainTokens, bufferSteps: 16 });
  perRank.forEach((events, dpRank) => {
    for (let i = 0; i < events.length; i += 1024) ix.applyBatch({ dpRank, events: events.slice(i, i + 1024) });
  });
  return ix;
}

function loadBaseline(perRank) {
  const ts = new TsIndex();
  perRank.forEach((events, dpRank) => {
    for (const ev of events) ts.apply(dpRank, ev);
  });
  return ts;
}

const heap = () => {
  global.gc();
  global.gc();
  return process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
};
const pct = (sorted, p) => sorted[Math.round((sorted.length - 1) * p)];
const rows = [];
const row = (what, kv, base, ratio, target) => rows.push({ what, kv, base, ratio, target });

// --- findMatches + memory: 128 ranks x 16k blocks -------------------------------------------
// Each side is measured with only its own index in the heap (the baseline's ~1 GB object graph
// slows every GC), kvplane first, then the baseline, in the same run on the same events.
{
  const { perRank, request } = workload(128, 16384);
  const { hashBlocks } = require('../dist/index.js');
  const f = (v) => `${v.toFixed(1)} µs`;
  const latency = (fn) => {
    for (let i = 0; i < 2000; i++) fn();
    const lat = [];
    for (let i = 0; i < 20000; i++) {
      const t = process.hrtime.bigint();
      fn();
      lat.push(Number(process.hrtime.bigint() - t) / 1e3);
    }
    return lat.sort((a, b) => a - b);
  };
  const ix = new LocalIndexer({ blockSize: BS, retainTokens: false, bufferSteps: 16 });
  perRank.forEach((events, dpRank) => {
    for (let i = 0; i < events.length; i += 1024) ix.applyBatch({ dpRank, events: events.slice(i, i + 1024) });
  });
  const s = ix.stats();
  const kv = ix.findMatches(request);
  const kvLat = latency(() => ix.findMatches(request));
  const hashLat = latency(() => hashBlocks(request, { algo: 'xxh3', blockSize: BS }));
  ix.close();
  const before = heap();
  const ts = new TsIndex();
  perRank.forEach((events, dpRank) => {
    for (const ev of events) ts.apply(dpRank, ev);
  });
  const tsBytes = heap() - before;
  const base = ts.findMatches(hashBlocks(request, { algo: 'xxh3', blockSize: BS }));
  if (kv.blocks.length !== base.size)
    throw new Error(`kvplane matched ${kv.blocks.length} workers, baseline ${base.size}`);
  kv.dpRanks.forEach((r, i) => {
    if (base.get(r) !== kv.blocks[i]) throw new Error(`rank ${r}: kvplane ${kv.blocks[i]}, baseline ${base.get(r)}`);
  });
  const tsLat = latency(() => ts.findMatches(hashBlocks(request, { algo: 'xxh3', blockSize: BS })));
  row(
    `findMatches, 8k tokens vs 128 x 16k (${kv.blocks.length} workers matched), incl. hashing`,
    `p50 ${f(pct(kvLat, 0.5))}, p99 ${f(pct(kvLat, 0.99))}`,
    `p50 ${f(pct(tsLat, 0.5))}, p99 ${f(pct(tsLat, 0.99))}`,
    `${(pct(tsLat, 0.99) / pct(kvLat, 0.99)).toFixed(1)}x at p99`,
    `p99 ≤ 10 µs + hashing (hashBlocks alone: p99 ${f(pct(hashLat, 0.99))})`,
  );
  row(
    `bytes per (worker, block) membership, no tokens (${s.memberships} memberships)`,
    `${(s.bytes / s.memberships).toFixed(1)} B`,
    `${(tsBytes / s.memberships).toFixed(1)} B`,
    `${(tsBytes / s.bytes).toFixed(1)}x less`,
    '≤ 48 B',
  );
}

// --- apply: churn with 1M blocks resident -----------------------------------------------------
{
  const ranks = 64;
  const resident = [];
  for (let i = 0; i < (1 << 20) / 16; i++) resident.push({ rank: i % ranks, ev: stored(tokens(16), null) });
  const churn = [];
  for (let i = 0; i < 16384; i++) {
    const old = resident[i];
    churn.push({ rank: old.rank, ev: { type: 'removed', blockHashes: old.ev.blockHashes } });
    churn.push({ rank: old.rank, ev: stored(tokens(16), null) });
  }
  const perRank = Array.from({ length: ranks }, () => []);
  for (const { rank, ev } of resident) perRank[rank].push(ev);
  // One batch per rank in each 64-event window, in arrival order (about 2 events per batch);
  // and, as an engine publishing a scheduler step at a time, 1024-event windows (about 16).
  const batches = batchesByRank(churn);
  const bigBatches = batchesByRank(churn, 1024);
  const ops = churn.reduce((n, c) => n + c.ev.blockHashes.length, 0);
  const memberships = (ix) =>
    ix instanceof TsIndex ? [...ix.workers.values()].reduce((n, w) => n + w.size, 0) : ix.stats().memberships;
  const timed = async (load, apply) => {
    const ix = load();
    const before = memberships(ix);
    await settle();
    const t = performance.now();
    apply(ix);
    const s = (performance.now() - t) / 1000;
    if (memberships(ix) !== before) throw new Error('the churn changed the resident count');
    ix.close?.();
    return { s, resident: before };
  };
  // Each side with only its own index in the heap.
  const byBatch = await timed(
    () => loadKvplane(perRank, false),
    (ix) => {
      for (const b of batches) ix.applyBatch(b);
    },
  );
  // The same batches as columns (the bulk path: no JS object per event).
  const cols = (bs) => bs.map((b) => ({ dpRank: b.dpRank, cols: columnsOf(b.events) }));
  const colBatches = cols(batches);
  const byCols = await timed(
    () => loadKvplane(perRank, false),
    (ix) => {
      for (const b of colBatches) ix.applyColumns(b.cols, { dpRank: b.dpRank });
    },
  );
  const bigColBatches = cols(bigBatches);
  const byBigCols = await timed(
    () => loadKvplane(perRank, false),
    (ix) => {
      for (const b of bigColBatches) ix.applyColumns(b.cols, { dpRank: b.dpRank });
    },
  );
  const base = await timed(
    () => loadBaseline(perRank),
    (ts) => {
      for (const b of batches) for (const ev of b.events) ts.apply(b.dpRank, ev);
    },
  );
  const m = (s) => `${(ops / s / 1e6).toFixed(2)} M block ops/s`;
  const vs = (s) => `${(base.s / s).toFixed(1)}x`;
  row(
    `apply through applyBatch (event objects; store + remove churn, ${byBatch.resident} memberships resident, ${batches.length} batches of ~2 events)`,
    m(byBatch.s),
    m(base.s),
    vs(byBatch.s),
    '≥ 10 M block ops/s',
  );
  row(
    'apply through applyColumns (the same batches as columns)',
    m(byCols.s),
    m(base.s),
    vs(byCols.s),
    '≥ 10 M block ops/s',
  );
  row(
    `apply through applyColumns, 1024-event windows (${bigBatches.length} batches of ~16 events)`,
    m(byBigCols.s),
    m(base.s),
    vs(byBigCols.s),
    '≥ 10 M block ops/s',
  );
}

// --- dump: 1M blocks with tokens ------------------------------------------------------------
// Again each side with only its own index in the heap.
{
  const { perRank } = workload(64, 16384);
  const ix = loadKvplane(perRank, true);
  const blocks = ix.stats().memberships;
  let t = performance.now();
  const dump = await ix.dumpTree();
  const kvS = (performance.now() - t) / 1000;
  const events = dump.workers.reduce((n, w) => n + w.events.length, 0);
  ix.close();
  const ts = loadBaseline(perRank);
  t = performance.now();
  const base = ts.dump();
  const tsS = (performance.now() - t) / 1000;
  const baseEvents = base.reduce((n, w) => n + w.events.length, 0);
  row(
    `dumpTree, ${blocks} blocks with tokens (${events} segment events; baseline ${baseEvents} block events)`,
    `${kvS.toFixed(3)} s`,
    `${tsS.toFixed(3)} s`,
    `${(tsS / kvS).toFixed(1)}x`,
    '≤ 1 s (dump + serve)',
  );
}

console.log(
  `LocalIndexer vs pure-TS Map index, same events, same process; ${cpus()[0]?.model ?? '?'}, node ${process.version}`,
);
console.log('| measure | kvplane LocalIndexer | pure-TS baseline | ratio | target |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.what} | ${r.kv} | ${r.base} | ${r.ratio} | ${r.target} |`);
