// The publish benches' workload as columns: single-block stored events (16 tokens, chains of 64)
// alternating with removals of the block stored 4096 events earlier; the same sequence as
// publish_ref.py generates.

const WINDOW = 4096;

export function workload(n) {
  const kinds = new Uint8Array(n);
  const hashCounts = new Uint32Array(n).fill(1);
  const hashes = new BigUint64Array(n);
  const parents = new BigUint64Array(n);
  const hasParent = new Uint8Array(n);
  const tokens = new Uint32Array(n * 16);
  const tokenStart = new Uint32Array(n + 1);
  const stored = [];
  let x = 0x9e3779b97f4a7c15n;
  let e = 0;
  let t = 0;
  for (let i = 0; e < n; i++) {
    x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
    stored.push(x);
    tokenStart[e] = t;
    kinds[e] = 0;
    hashes[e] = x;
    if (i % 64 !== 0) {
      parents[e] = stored[i - 1];
      hasParent[e] = 1;
    }
    const lo = Number(x & 0xffffffffn);
    const hi = Number(x >> 32n);
    // Token s is (x >> s) & 0x7fff, as in publish_ref.py.
    for (let s = 0; s < 16; s++) tokens[t++] = ((s === 0 ? lo : (lo >>> s) | (hi << (32 - s))) >>> 0) & 0x7fff;
    e++;
    if (i >= WINDOW && e < n) {
      tokenStart[e] = t;
      kinds[e] = 1;
      hashes[e] = stored[i - WINDOW];
      e++;
    }
  }
  tokenStart[e] = t;
  return { n, kinds, hashCounts, hashes, parents, hasParent, tokens: tokens.subarray(0, t), tokenStart };
}

/** Events `at..end` of a workload as `publishColumns` input. */
export function publishColumnsOf(w, at, end) {
  return {
    kinds: w.kinds.subarray(at, end),
    hashCounts: w.hashCounts.subarray(at, end),
    hashes: w.hashes.subarray(at, end),
    parents: w.parents.subarray(at, end),
    hasParent: w.hasParent.subarray(at, end),
    tokens: w.tokens.subarray(w.tokenStart[at], w.tokenStart[end]),
    blockSize: 16,
    medium: 'GPU',
  };
}
