//! `find_matches`: per worker, how many consecutive leading blocks of a request it holds.
//!
//! One walk from the request's first block down its chain: along an edge it compares the
//! request's keys with the edge's, which sit side by side; at an edge's end, or where the request
//! leaves it, the next block is an edge's first, found by its key. The workers still matching
//! change only where a span starts: entering an edge they are intersected with its first span's
//! holders, and each later span takes out the workers it loses. So a request costs its length in
//! key compares plus the holder changes along its path, however deep each worker matches.

use super::edge::Edge;
use super::table::prefetch_read;
use super::{Index, Pos, WorkerKey};

#[derive(Debug, Clone, Default)]
pub struct MatchOptions {
  /// Only score these workers.
  pub workers: Option<Vec<WorkerKey>>,
  /// Stop as soon as at most one candidate worker is left (its score is then a lower bound).
  pub early_exit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Matches {
  /// Workers holding at least the first block, with their count of consecutive leading blocks.
  pub scores: Vec<(WorkerKey, u32)>,
  /// Blocks held per (scored-candidate) worker.
  pub tree_sizes: Vec<(WorkerKey, u64)>,
}

/// `find_matches`'s buffers, kept between the queries of a thread (a query allocates only its
/// answer). Taken for the query, so a nested call starts with empty ones.
#[derive(Default)]
struct Scratch {
  /// Score per worker slot.
  score: Vec<u32>,
  /// Bit per worker slot: still matching.
  alive: Vec<u64>,
  /// Bit per worker slot: holds the block just reached.
  held: Vec<u64>,
  /// The candidates holding the first block (the workers answered for).
  answered: Vec<u32>,
}

thread_local! {
  static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// The workers still matching, as bits by slot over the words `lo..hi`.
struct Alive {
  bits: Vec<u64>,
  held: Vec<u64>,
  lo: usize,
  hi: usize,
  count: u32,
}

impl Alive {
  /// Takes out the workers of `left` (the previous span's holders not holding this one): they
  /// matched `depth` blocks.
  #[inline]
  fn drop_left(&mut self, left: &[u32], depth: u32, score: &mut [u32]) {
    for &s in left {
      let (w, bit) = ((s >> 6) as usize, 1u64 << (s & 63));
      if self.bits[w] & bit != 0 {
        self.bits[w] &= !bit;
        self.count -= 1;
        score[s as usize] = depth;
      }
    }
  }

  /// Keeps the workers in `holders` (sorted slots); the others matched `depth` blocks.
  #[inline]
  fn narrow(&mut self, holders: &[u32], depth: u32, score: &mut [u32]) {
    let (lo, hi) = (self.lo, self.hi);
    self.held[lo..hi].fill(0);
    // A word's bits are gathered in a register (an OR into memory per holder would wait for the
    // previous one's store).
    let mut i = holders.partition_point(|&h| ((h >> 6) as usize) < lo);
    while i < holders.len() {
      let w = (holders[i] >> 6) as usize;
      if w >= hi {
        break;
      }
      let mut word = 0u64;
      while i < holders.len() && (holders[i] >> 6) as usize == w {
        word |= 1 << (holders[i] & 63);
        i += 1;
      }
      self.held[w] = word;
    }
    let mut count = 0;
    for w in lo..hi {
      score_bits(w, self.bits[w] & !self.held[w], depth, score);
      self.bits[w] &= self.held[w];
      count += self.bits[w].count_ones();
    }
    self.count = count;
    // Narrow the word range to the words with workers left.
    while self.lo < self.hi && self.bits[self.lo] == 0 {
      self.lo += 1;
    }
    while self.hi > self.lo && self.bits[self.hi - 1] == 0 {
      self.hi -= 1;
    }
  }
}

/// Scores `depth` to the workers of word `w` whose bits are set in `bits`.
#[inline]
fn score_bits(w: usize, mut bits: u64, depth: u32, score: &mut [u32]) {
  while bits != 0 {
    score[w * 64 + bits.trailing_zeros() as usize] = depth;
    bits &= bits - 1;
  }
}

/// How many spans ahead of the walk their `left` is fetched: each span's lists are an
/// allocation of their own, a cache miss when the walk reaches it, and the keys of a span are
/// compared in less time than a miss takes.
const AHEAD: usize = 4;

#[inline(always)]
fn prefetch_left(edge: &Edge, si: usize) {
  if let Some(s) = edge.spans.get(si) {
    prefetch_read(s.left().as_ptr().cast());
  }
}

/// How many keys of `a` and `b` are equal from the start (four at a time while they are).
#[inline]
fn common(a: &[u64], b: &[u64]) -> usize {
  let n = a.len().min(b.len());
  let (a, b) = (&a[..n], &b[..n]);
  let mut i = 0;
  while i + 4 <= n {
    let d = (a[i] ^ b[i]) | (a[i + 1] ^ b[i + 1]) | (a[i + 2] ^ b[i + 2]) | (a[i + 3] ^ b[i + 3]);
    if d != 0 {
      break;
    }
    i += 4;
  }
  while i < n && a[i] == b[i] {
    i += 1;
  }
  i
}

impl Index {
  /// Scores workers for a request given as tokens, hashed into keys with `hash` (the options the
  /// index's keys were made with: the content chain, or the engine's algorithm).
  pub fn find_matches_tokens(
    &self,
    tokens: &[u32],
    hash: &crate::hash::HashOptions,
    opts: &MatchOptions,
  ) -> crate::error::KvResult<Matches> {
    let keys = crate::hash::hash_blocks(tokens, hash, false)?.hashes;
    Ok(self.find_matches(&keys, opts))
  }

  /// Scores every worker for a request given as its chained block hashes (the index's keys).
  pub fn find_matches(&self, seqs: &[u64], opts: &MatchOptions) -> Matches {
    let mut out = Matches::default();
    let Some(first) = seqs.first().and_then(|&k| self.edge_of_first(k)) else {
      return out;
    };
    let Scratch {
      mut score,
      alive: bits,
      held,
      answered: mut first_holders,
    } = SCRATCH.take();
    score.clear();
    score.resize(self.workers.len(), 0);
    let mut edge = &self.edges[first as usize];
    let mut answered = std::mem::take(&mut first_holders);
    answered.clear();
    answered.extend_from_slice(edge.spans[0].holders());
    if let Some(ws) = &opts.workers {
      let mut wanted: Vec<u32> = ws
        .iter()
        .filter_map(|w| self.slots.get(w).copied())
        .collect();
      wanted.sort_unstable();
      answered.retain(|s| wanted.binary_search(s).is_ok());
    }
    let words = self.workers.len().div_ceil(64);
    let mut alive = Alive {
      bits,
      held,
      lo: 0,
      hi: 0,
      count: answered.len() as u32,
    };
    alive.bits.clear();
    alive.bits.resize(words, 0);
    alive.held.clear();
    alive.held.resize(words, 0);
    if let (Some(&a), Some(&b)) = (answered.first(), answered.last()) {
      (alive.lo, alive.hi) = ((a >> 6) as usize, (b >> 6) as usize + 1);
    }
    for &s in &answered {
      alive.bits[(s >> 6) as usize] |= 1 << (s & 63);
    }
    // The walk is at block `i` of `edge`, request position `d`, inside span `si`; the workers in
    // `alive` hold blocks 0..=d.
    let (mut i, mut d, mut si) = (0usize, 0usize, 0usize);
    let n = seqs.len();
    for k in 1..=AHEAD {
      prefetch_left(edge, k);
    }
    while alive.count > 0 && !(opts.early_exit && alive.count <= 1) {
      // Along the span, as far as the request follows it.
      let end = edge.span_end(si);
      let m = common(&edge.keys[i + 1..end], &seqs[d + 1..]);
      i += m;
      d += m;
      if d + 1 == n {
        break;
      }
      let key = seqs[d + 1];
      if edge.keys.get(i + 1) == Some(&key) {
        // The next span of this edge.
        si += 1;
        i += 1;
        prefetch_left(edge, si + AHEAD);
      } else {
        let Some(e) = self.edge_of_first(key) else {
          break;
        };
        (edge, si, i) = (&self.edges[e as usize], 0, 0);
        for k in 1..=AHEAD {
          prefetch_left(edge, k);
        }
      }
      d += 1;
      if si == 0 {
        alive.narrow(edge.spans[0].holders(), d as u32, &mut score);
      } else {
        alive.drop_left(edge.spans[si].left(), d as u32, &mut score);
      }
    }
    for w in alive.lo..alive.hi {
      score_bits(w, alive.bits[w], d as u32 + 1, &mut score);
    }
    out.scores.reserve_exact(answered.len());
    out.tree_sizes.reserve_exact(answered.len());
    for &s in &answered {
      let w = &self.workers[s as usize];
      out.scores.push((w.key, score[s as usize]));
      out.tree_sizes.push((w.key, w.blocks()));
    }
    SCRATCH.set(Scratch {
      score,
      alive: alive.bits,
      held: alive.held,
      answered,
    });
    out
  }

  /// Where `keys[from]` is stored, reached along `keys` from the first of them this index holds
  /// as an edge's first block (a chain here may start at any position: a tier holds blocks whose
  /// parents are in another).
  fn locate(&self, keys: &[u64], from: usize) -> Option<Pos> {
    let mut j = 0;
    while j <= from {
      let Some(e) = self.edge_of_first(keys[j]) else {
        j += 1;
        continue;
      };
      let mut cur: Pos = (e, 0);
      while j < from {
        match self.find_child(Some(cur), keys[j + 1]) {
          Some(p) => cur = p,
          None => break,
        }
        j += 1;
      }
      if j == from {
        return Some(cur);
      }
      // `keys[j + 1]` starts no edge either (the walk looked it up): go on after it.
      j += 2;
    }
    None
  }

  /// How many consecutive keys from `keys[from]` on worker `w` holds (a lower tier's
  /// continuation of a match).
  pub fn run_from(&self, w: WorkerKey, keys: &[u64], from: usize) -> u32 {
    let Some(&slot) = self.slots.get(&w) else {
      return 0;
    };
    if from >= keys.len() {
      return 0;
    }
    let held = |p: Pos| self.edges[p.0 as usize].holds(p.1, slot);
    // A key can be stored twice in a tier: inside one worker's chain, and as the first block of
    // an edge of its own, for a worker that stored it after a parent held in another tier. The
    // worker's run goes on where it holds the key.
    let held_at = |found: Option<Pos>, key: u64| match found {
      Some(p) if held(p) => Some(p),
      _ => self
        .edge_of_first(key)
        .map(|f| (f, 0))
        .filter(|&p| Some(p) != found && held(p)),
    };
    let Some(mut cur) = held_at(self.locate(keys, from), keys[from]) else {
      return 0;
    };
    let mut n = 1;
    while let Some(&k) = keys.get(from + n as usize) {
      match held_at(self.find_child(Some(cur), k), k) {
        Some(p) => cur = p,
        None => break,
      }
      n += 1;
    }
    n
  }

  /// The workers holding the chain's first block `key` (a root here).
  pub fn holders(&self, key: u64) -> Vec<WorkerKey> {
    let Some(e) = self.edge_of_first(key) else {
      return Vec::new();
    };
    self.edges[e as usize].spans[0]
      .holders()
      .iter()
      .map(|&s| self.workers[s as usize].key)
      .collect()
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::event::{KvEvent, StoredEvent};
  use crate::hash::{Algo, HashOptions};
  use crate::index::IndexConfig;

  #[test]
  fn an_index_on_its_own_scores_workers_of_many_nodes_by_tokens() {
    let mut ix = Index::new(IndexConfig::default());
    let tokens: Vec<u32> = (0..32).collect();
    let stored = |blocks: usize| {
      KvEvent::Stored(StoredEvent {
        block_hashes: (1..=blocks as u64).collect(),
        token_ids: tokens[..blocks * 4].to_vec(),
        block_size: 4,
        ..Default::default()
      })
    };
    let w = |worker_id, dp_rank| WorkerKey { worker_id, dp_rank };
    ix.apply(w(10, 0), &stored(8)).unwrap();
    ix.apply(w(10, 1), &stored(3)).unwrap();
    ix.apply(w(20, 0), &stored(5)).unwrap();
    let hash = HashOptions::new(Algo::Xxh3, 4);
    let m = ix
      .find_matches_tokens(&tokens, &hash, &MatchOptions::default())
      .unwrap();
    let mut scores = m.scores.clone();
    scores.sort();
    assert_eq!(scores, vec![(w(10, 0), 8), (w(10, 1), 3), (w(20, 0), 5)]);
    let only = MatchOptions {
      workers: Some(vec![w(20, 0)]),
      early_exit: false,
    };
    let m = ix.find_matches_tokens(&tokens[..12], &hash, &only).unwrap();
    assert_eq!(m.scores, vec![(w(20, 0), 3)]);
  }

  #[test]
  fn orphaned_blocks_are_counted_and_never_matched() {
    let mut ix = Index::new(IndexConfig::default());
    let tokens: Vec<u32> = (0..32).collect();
    let w = WorkerKey {
      worker_id: 1,
      dp_rank: 0,
    };
    let other = WorkerKey {
      worker_id: 2,
      dp_rank: 0,
    };
    let stored = KvEvent::Stored(StoredEvent {
      block_hashes: (1..=8).collect(),
      token_ids: tokens.clone(),
      block_size: 4,
      ..Default::default()
    });
    ix.apply(w, &stored).unwrap();
    ix.apply(other, &stored).unwrap();
    let removed = |hashes: Vec<u64>| {
      KvEvent::Removed(crate::event::RemovedEvent {
        block_hashes: hashes,
        ..Default::default()
      })
    };
    let hash = HashOptions::new(Algo::Xxh3, 4);
    let scores = |ix: &Index| {
      let mut s = ix
        .find_matches_tokens(&tokens, &hash, &MatchOptions::default())
        .unwrap()
        .scores;
      s.sort();
      s
    };
    // Block 4 goes first: blocks 5..8 are held without their chain (block 5 without its parent).
    ix.apply(w, &removed(vec![4])).unwrap();
    let unreachable = |ix: &Index| ix.stats().per_worker[0].unreachable_blocks;
    assert_eq!(unreachable(&ix), 1);
    assert_eq!(scores(&ix), vec![(w, 3), (other, 8)]);
    // The rest of the chain, root side first (each removal orphans the next).
    ix.apply(w, &removed(vec![5, 6])).unwrap();
    assert_eq!(unreachable(&ix), 1);
    assert_eq!(scores(&ix), vec![(w, 3), (other, 8)]);
    ix.apply(w, &removed(vec![7, 8])).unwrap();
    assert_eq!(unreachable(&ix), 0);
    assert_eq!(scores(&ix), vec![(w, 3), (other, 8)]);
    // A parent stored again while its orphan is held: nothing is orphaned any more.
    ix.apply(w, &removed(vec![2])).unwrap();
    assert_eq!(unreachable(&ix), 1);
    ix.apply(w, &stored).unwrap();
    assert_eq!(unreachable(&ix), 0);
    assert_eq!(scores(&ix), vec![(w, 8), (other, 8)]);
    ix.apply(w, &KvEvent::Cleared).unwrap();
    assert_eq!(ix.stats().memberships, 8);
  }
}
