// The router bench's workload, made the same from the same seed in every process: `WORKERS`
// workers of block size 16, each holding prefixes of random depth of some of `BASES` shared
// 8k-token sequences (so a request matches workers at many depths) and private chains, stored as
// vLLM `BlockStored` events of `BLOCKS_PER_EVENT` blocks, 16 events a batch. Engine block hashes
// are derived from the content, as vLLM's are (the same blocks have the same hash on every
// worker): the chained `xxh3` hash of the tokens.
import { hashBlocks } from '../dist/index.mjs';

export const BS = 16;
export const BASE_TOKENS = 8192;
export const BASES = 32;
export const BLOCKS_PER_EVENT = 4;
export const EVENTS_PER_BATCH = 16;

function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function bases(seed) {
  const r = rng(seed);
  return Array.from({ length: BASES }, () => Uint32Array.from({ length: BASE_TOKENS }, () => Math.floor(r() * 32000)));
}

/**
 * Worker `w`'s chains: `shared` prefixes of bases (random depth) and `privateChains` chains of
 * `privateBlocks` blocks of its own tokens. Returns the stored events (engine hashes unique to
 * the worker) and the number of blocks.
 */
export function workerEvents(w, seed, { shared = 12, privateChains = 8, privateBlocks = 512 } = {}) {
  const b = bases(seed);
  const r = rng(seed * 7919 + w + 1);
  const events = [];
  let blocks = 0;
  const chain = (tokens) => {
    const all = hashBlocks(tokens, { algo: 'xxh3', blockSize: BS });
    let parent = null;
    for (let i = 0; i < tokens.length / BS; i += BLOCKS_PER_EVENT) {
      const n = Math.min(BLOCKS_PER_EVENT, tokens.length / BS - i);
      const hashes = Array.from(all.subarray(i, i + n));
      events.push({
        type: 'stored',
        blockHashes: hashes,
        parentBlockHash: parent,
        tokenIds: tokens.subarray(i * BS, (i + n) * BS),
        blockSize: BS,
        medium: 'GPU',
      });
      parent = hashes[n - 1];
      blocks += n;
    }
  };
  const picked = new Set();
  while (picked.size < shared) picked.add(Math.floor(r() * BASES));
  for (const s of picked) {
    const depth = 1 + Math.floor(r() * (BASE_TOKENS / BS));
    chain(b[s].subarray(0, depth * BS));
  }
  for (let c = 0; c < privateChains; c++) {
    chain(Uint32Array.from({ length: privateBlocks * BS }, () => 32000 + Math.floor(r() * 100000)));
  }
  return { events, blocks };
}

/** 8k-token requests: a base sequence whole, or with its tail from a random block on changed. */
export function queries(n, seed) {
  const b = bases(seed);
  const r = rng(seed + 99);
  return Array.from({ length: n }, () => {
    const q = Uint32Array.from(b[Math.floor(r() * BASES)]);
    if (r() < 0.5) {
      const from = Math.floor(r() * (BASE_TOKENS / BS)) * BS;
      for (let i = from; i < q.length; i++) q[i] = 200000 + Math.floor(r() * 1000);
    }
    return q;
  });
}
