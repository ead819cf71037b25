import { createRequire } from 'node:module';
import { batchesByRank } from './churn.mjs';
import { nextHash, rand } from './prng.mjs';
const require = createRequire(import.meta.url);
const { LocalIndexer, encodeBatch } = require('../dist/index.js');
const BS = 16;
const tokens = (blocks) => Uint32Array.from({ length: blocks * BS }, () => rand() % 150000);
const stored = (blocks, parent = null) => ({ type: 'stored', blockHashes: BigUint64Array.from({ length: blocks }, nextHash), parentBlockHash: parent, tokenIds: tokens(blocks), blockSize: BS, medium: 'GPU' });
const ranks = 64;
const resident = [];
for (let i = 0; i < (1 << 20) / 16; i++) resident.push({ rank: i % ranks, ev: stored(16) });
const churn = [];
for (let i = 0; i < 16384; i++) { const old = resident[i]; churn.push({ rank: old.rank, ev: { type: 'removed', blockHashes: old.ev.blockHashes, medium: 'GPU' } }); churn.push({ rank: old.rank, ev: stored(16) }); }
const load = [];
for (let r = 0; r < ranks; r++) { const evs = resident.filter((e) => e.rank === r).map((e) => e.ev); for (let i = 0; i < evs.length; i += 1024) load.push(encodeBatch({ ts: 1, dpRank: r, events: evs.slice(i, i + 1024) }, 'vllm')); }
const batches = batchesByRank(churn).map((b) => encodeBatch({ ts: 2, ...b }, 'vllm'));
const ops = churn.reduce((n, c) => n + c.ev.blockHashes.length, 0);
for (let round = 0; round < 3; round++) {
const ix = new LocalIndexer({ blockSize: BS, retainTokens: false, bufferSteps: 16 });
for (const b of load) ix.applyEncoded(b, 'vllm');
let t = performance.now();
for (const b of batches) ix.applyEncoded(b, 'vllm');
const s = (performance.now() - t) / 1000;
console.log(batches.length, 'batches', (ops / s / 1e6).toFixed(2), 'M block ops/s');
ix.close();
}
