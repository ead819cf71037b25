// Codec benchmarks, each side by side with its baseline in the same run:
//  1. decode + apply of encoded vLLM batches (1M blocks resident, store/remove churn):
//     LocalIndexer.applyEncoded against @msgpack/msgpack + the pure-TS Map index;
//  2. vLLM msgpack encode and decode against msgspec (Python) on the same payloads: kvplane's core
//     (examples/codec_throughput.rs) and its JS API (encodeBatch / decodeBatches);
//  3. /kv_recover of a 1M-block tree dump (dump + encode) against the TS index + JSON.stringify.
//
//   npm run build && npm run bench:codec
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { decode as msgpackDecode } from '@msgpack/msgpack';
import { TsIndex } from './baseline/ts-index.mjs';
import { batchesByRank } from './churn.mjs';
import { pinToOneCpu } from './pin.mjs';
import { nextHash, rand } from './prng.mjs';
import { settle } from './settle.mjs';

const CPU = pinToOneCpu();

const require = createRequire(import.meta.url);
const { LocalIndexer, encodeBatch, decodeBatches } = require('../dist/index.js');
const root = new URL('..', import.meta.url).pathname;

const BS = 16;
const tokens = (blocks) => Uint32Array.from({ length: blocks * BS }, () => rand() % 150000);
const stored = (blocks, parent = null) => ({
  type: 'stored',
  blockHashes: BigUint64Array.from({ length: blocks }, nextHash),
  parentBlockHash: parent,
  tokenIds: tokens(blocks),
  blockSize: BS,
  medium: 'GPU',
});
const rows = [];
const row = (what, kv, base, ratio, target) => rows.push({ what, kv, base, ratio, target });
const M = (v) => `${(v / 1e6).toFixed(2)} M`;
const best = (n, fn) => {
  let b = Number.POSITIVE_INFINITY;
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    fn();
    b = Math.min(b, (performance.now() - t) / 1000);
  }
  return b;
};

// The pure-TS consumer: @msgpack/msgpack, then the fields the TS index needs.
function tsApplyEncoded(ts, bytes) {
  const [, events, dp] = msgpackDecode(bytes, { useBigInt64: true });
  for (const e of events) {
    if (e.type === 'BlockStored') {
      ts.apply(dp ?? 0, {
        type: 'stored',
        blockHashes: e.block_hashes.map(BigInt),
        parentBlockHash: e.parent_block_hash === null ? null : BigInt(e.parent_block_hash),
        tokenIds: Uint32Array.from(e.token_ids),
        blockSize: e.block_size,
      });
    } else if (e.type === 'BlockRemoved') {
      ts.apply(dp ?? 0, { type: 'removed', blockHashes: e.block_hashes.map(BigInt) });
    } else if (e.type === 'AllBlocksCleared') {
      ts.apply(dp ?? 0, { type: 'cleared' });
    }
  }
}

// --- 1. decode + apply, 1M blocks resident ----------------------------------------------------
{
  const ranks = 64;
  const resident = [];
  for (let i = 0; i < (1 << 20) / 16; i++) resident.push({ rank: i % ranks, ev: stored(16) });
  const churn = [];
  for (let i = 0; i < 16384; i++) {
    const old = resident[i];
    churn.push({ rank: old.rank, ev: { type: 'removed', blockHashes: old.ev.blockHashes, medium: 'GPU' } });
    churn.push({ rank: old.rank, ev: stored(16) });
  }
  const load = [];
  for (let r = 0; r < ranks; r++) {
    const evs = resident.filter((e) => e.rank === r).map((e) => e.ev);
    for (let i = 0; i < evs.length; i += 1024)
      load.push(encodeBatch({ ts: 1, dpRank: r, events: evs.slice(i, i + 1024) }, 'vllm'));
  }
  // About 2 events per batch (64-event windows over 64 ranks), and about 16 (1024-event windows).
  const small = batchesByRank(churn).map((b) => encodeBatch({ ts: 2, ...b }, 'vllm'));
  const big = batchesByRank(churn, 1024).map((b) => encodeBatch({ ts: 2, ...b }, 'vllm'));
  const ops = churn.reduce((n, c) => n + c.ev.blockHashes.length, 0);
  const kvplane = async (batches) => {
    const ix = new LocalIndexer({ blockSize: BS, retainTokens: false, bufferSteps: 16 });
    for (const b of load) ix.applyEncoded(b, 'vllm');
    const resident = ix.stats().memberships;
    await settle();
    const t = performance.now();
    for (const b of batches) ix.applyEncoded(b, 'vllm');
    const s = (performance.now() - t) / 1000;
    if (ix.stats().memberships !== resident)
      throw new Error(`resident changed: ${ix.stats().memberships} vs ${resident}`);
    ix.close();
    return { s, resident };
  };
  const kv = await kvplane(small);
  const kvBig = await kvplane(big);
  const ts = new TsIndex();
  for (const b of load) tsApplyEncoded(ts, b);
  await settle();
  const t = performance.now();
  for (const b of small) tsApplyEncoded(ts, b);
  const tsS = (performance.now() - t) / 1000;
  const rate = (s) => `${M(churn.length / s)} events/s, ${M(ops / s)} block ops/s`;
  row(
    `decode + apply of encoded vLLM batches (store + remove churn, ${kv.resident} blocks resident, ${small.length} batches of ~2 events)`,
    rate(kv.s),
    rate(tsS),
    `${(tsS / kv.s).toFixed(1)}x`,
    '≥ 10 M block ops/s',
  );
  row(
    `the same events in ${big.length} batches of ~16 events`,
    rate(kvBig.s),
    rate(tsS),
    `${(tsS / kvBig.s).toFixed(1)}x`,
    '≥ 10 M block ops/s',
  );
}

// --- 2. encode / decode vs msgspec ------------------------------------------------------------
{
  const payloads = [];
  for (let b = 0; b < 100; b++) {
    const events = [];
    for (let i = 0; i < 1024; i++) {
      if (rand() % 10 < 7) events.push(stored(1 + (rand() % 2), rand() % 4 ? nextHash() : null));
      else
        events.push({
          type: 'removed',
          blockHashes: BigUint64Array.from({ length: 1 + (rand() % 4) }, nextHash),
          medium: 'GPU',
        });
    }
    payloads.push(encodeBatch({ ts: 1732000000 + b, dpRank: 0, events }, 'vllm'));
  }
  const dir = mkdtempSync(join(tmpdir(), 'kvplane-bench-'));
  const file = join(dir, 'payloads.bin');
  const parts = [];
  for (const p of payloads) {
    const len = Buffer.alloc(4);
    len.writeUInt32LE(p.length);
    parts.push(len, p);
  }
  writeFileSync(file, Buffer.concat(parts));
  const events = payloads.length * 1024;
  const run = (cmd, args) => JSON.parse(execFileSync('taskset', ['-c', CPU, cmd, ...args], { cwd: root }).toString());
  execFileSync('cargo', ['build', '--release', '-q', '-p', 'kvplane-core', '--example', 'codec_throughput'], {
    cwd: root,
  });
  const core = run(join(root, 'target/release/examples/codec_throughput'), [file, '7']);
  const ref = run('python3', ['bench/codec_ref.py', file, '7']);
  rmSync(dir, { recursive: true });
  const decoded = payloads.map((p) => decodeBatches(p, 'vllm').batches[0]);
  const jsDec = best(5, () => {
    for (const p of payloads) decodeBatches(p, 'vllm');
  });
  const jsEnc = best(5, () => {
    for (const b of decoded) encodeBatch(b, 'vllm');
  });
  const rate = (s) => `${M(events / s)} events/s`;
  row(
    'vLLM msgpack encode, core (100 x 1024-event batches)',
    rate(core.encode_s),
    `msgspec ${ref.msgspec}: ${rate(ref.encode_s)}`,
    `${(ref.encode_s / core.encode_s).toFixed(1)}x`,
    'faster than msgspec',
  );
  row(
    'vLLM msgpack decode, core (into the normalized model)',
    rate(core.decode_s),
    `msgspec (typed structs): ${rate(ref.decode_s)}`,
    `${(ref.decode_s / core.decode_s).toFixed(1)}x`,
    'faster than msgspec',
  );
  row(
    'vLLM msgpack encode, JS API (`encodeBatch` from JS objects)',
    rate(jsEnc),
    rate(ref.encode_s),
    `${(ref.encode_s / jsEnc).toFixed(2)}x`,
    '',
  );
  row(
    'vLLM msgpack decode, JS API (`decodeBatches` into JS objects)',
    rate(jsDec),
    rate(ref.decode_s),
    `${(ref.decode_s / jsDec).toFixed(2)}x`,
    '',
  );
}

// --- 3. /kv_recover of a 1M-block tree dump ---------------------------------------------------
// Each side with only its own index in the heap (the baseline's object graph slows every GC).
{
  const ranks = 64;
  const perRank = [];
  for (let r = 0; r < ranks; r++) {
    let parent = null;
    const evs = [];
    for (let i = 0; i < 1024; i++) {
      const ev = stored(16, i % 64 === 0 ? null : parent);
      parent = ev.blockHashes[15];
      evs.push(ev);
    }
    perRank.push(evs);
  }
  const ix = new LocalIndexer({ blockSize: BS, retainTokens: true, bufferSteps: 16 });
  for (const [dpRank, evs] of perRank.entries()) ix.applyBatch({ dpRank, events: evs });
  const blocks = ix.stats().memberships;
  let json = 0;
  let mp = 0;
  let kvJ = Number.POSITIVE_INFINITY;
  let kvM = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 3; i++) {
    let t = performance.now();
    json = (await ix.recover()).length;
    kvJ = Math.min(kvJ, (performance.now() - t) / 1000);
    t = performance.now();
    mp = (await ix.recover(undefined, undefined, 'msgpack')).length;
    kvM = Math.min(kvM, (performance.now() - t) / 1000);
  }
  ix.close();
  global.gc();
  const ts = new TsIndex();
  perRank.forEach((evs, r) => {
    for (const ev of evs) ts.apply(r, ev);
  });
  let text = '';
  const tsS = best(3, () => {
    text = JSON.stringify({ TreeDump: ts.dump() }, (_, v) =>
      typeof v === 'bigint' ? v.toString() : v instanceof Uint32Array ? Array.from(v) : v,
    );
  });
  row(
    `/kv_recover TreeDump of ${blocks} blocks with tokens (dump + encode)`,
    `JSON ${kvJ.toFixed(3)} s (${(json / 1e6).toFixed(0)} MB), msgpack ${kvM.toFixed(3)} s (${(mp / 1e6).toFixed(0)} MB)`,
    `${tsS.toFixed(3)} s (${(text.length / 1e6).toFixed(0)} MB JSON)`,
    `${(tsS / kvJ).toFixed(1)}x (JSON)`,
    '≤ 1 s',
  );
}

console.log(`codecs vs baselines, same run; ${cpus()[0]?.model ?? '?'}, node ${process.version}, pinned to CPU ${CPU}`);
console.log('| measure | kvplane | baseline | ratio | target |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.what} | ${r.kv} | ${r.base} | ${r.ratio} | ${r.target} |`);
