//! Packed result layouts: results that cross to JS as one typed array, and where each field
//! lies in it. `src/layout.ts` reads them with the same offsets; a test checks both sides agree
//! through `matchesLayout`.

use napi_derive::napi;

/// Where the fields of a packed `findMatches` result for `n` workers lie, in bytes from the start
/// of its `BigUint64Array`: `n` u64 worker ids, `n` u64 tree sizes, then `n` u32 DP ranks and `n`
/// u32 leading-block counts, each u32 run padded to whole u64 words. All little-endian.
#[napi(object)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchesLayout {
  /// u64 words in all.
  pub words: u32,
  pub worker_ids: u32,
  pub tree_sizes: u32,
  pub dp_ranks: u32,
  pub blocks: u32,
}

impl MatchesLayout {
  pub fn of(n: u32) -> MatchesLayout {
    let half = n.div_ceil(2);
    MatchesLayout {
      words: 2 * n + 2 * half,
      worker_ids: 0,
      tree_sizes: 8 * n,
      dp_ranks: 16 * n,
      blocks: 16 * n + 8 * half,
    }
  }
}

/// The layout of a packed `findMatches` result for `n` workers.
#[napi]
pub fn matches_layout(n: u32) -> MatchesLayout {
  MatchesLayout::of(n)
}

/// Packs matching results (see [`MatchesLayout`]).
pub fn pack_matches(m: &kvplane_core::index::Matches) -> Vec<u64> {
  let n = m.scores.len();
  let at = MatchesLayout::of(n as u32);
  let mut out = vec![0u64; at.words as usize];
  let word = |byte: u32| byte as usize / 8;
  for (i, ((w, blocks), (_, size))) in m.scores.iter().zip(&m.tree_sizes).enumerate() {
    let shift = if i % 2 == 0 { 0 } else { 32 };
    out[word(at.worker_ids) + i] = w.worker_id;
    out[word(at.tree_sizes) + i] = *size;
    out[word(at.dp_ranks) + i / 2] |= (w.dp_rank as u64) << shift;
    out[word(at.blocks) + i / 2] |= (*blocks as u64) << shift;
  }
  out
}
