/**
 * Packed result layouts: where each field of a result that crosses from Rust as one typed array
 * lies in it. The binding packs with the same offsets (`crates/kvplane-node/src/layout.rs`); a
 * test checks both sides agree through the binding's `matchesLayout`.
 */

/** Byte offsets of a packed `findMatches` result for `n` workers, and its length in u64 words. */
export interface MatchesLayout {
  words: number;
  workerIds: number;
  treeSizes: number;
  dpRanks: number;
  blocks: number;
}

/**
 * `n` u64 worker ids, `n` u64 tree sizes, then `n` u32 DP ranks and `n` u32 leading-block counts,
 * each u32 run padded to whole u64 words: `2n + 2 * ceil(n / 2)` words in all, little-endian.
 */
export function matchesLayout(n: number): MatchesLayout {
  const half = Math.ceil(n / 2);
  return { words: 2 * n + 2 * half, workerIds: 0, treeSizes: 8 * n, dpRanks: 16 * n, blocks: 16 * n + 8 * half };
}

/** The number of workers in a packed `findMatches` result of `words` u64 words (`3n` or `3n + 1`). */
export function matchesCount(words: number): number {
  return Math.floor(words / 3);
}
