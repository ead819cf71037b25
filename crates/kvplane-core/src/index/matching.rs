//! `find_matches`: per worker, how many consecutive leading blocks of a request it holds.
//!
//! One walk from the request's first block down its chain: along an edge it compares the
//! request's keys with the edge's, which sit side by side; at an edge's end, or where the request
//! leaves it, the next block is an edge's first, found by its key. The workers still matching
//! are intersected with a span's holders only where a span starts, so a request costs its
//! length in key compares plus the holder changes along its path, however deep each worker
//! matches.

use super::edge::Edge;
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
  /// The workers still matching, by slot, and the next ones.
  alive: Vec<u32>,
  next: Vec<u32>,
}

thread_local! {
  static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// Keeps in `alive` the slots that are in `holders` (both sorted) and scores the others `depth`.
#[inline]
fn narrow(
  alive: &mut Vec<u32>,
  next: &mut Vec<u32>,
  holders: &[u32],
  depth: u32,
  score: &mut [u32],
) {
  next.clear();
  let mut h = 0;
  for &s in alive.iter() {
    while h < holders.len() && holders[h] < s {
      h += 1;
    }
    if h < holders.len() && holders[h] == s {
      next.push(s);
    } else {
      score[s as usize] = depth;
    }
  }
  std::mem::swap(alive, next);
}

/// How many keys of `a` and `b` are equal from the start.
#[inline]
fn common(a: &[u64], b: &[u64]) -> usize {
  a.iter().zip(b).take_while(|(x, y)| x == y).count()
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
      mut alive,
      mut next,
    } = SCRATCH.take();
    score.clear();
    score.resize(self.workers.len(), 0);
    alive.clear();
    let mut edge = &self.edges[first as usize];
    alive.extend_from_slice(&edge.spans[0].holders);
    if let Some(ws) = &opts.workers {
      let mut wanted: Vec<u32> = ws
        .iter()
        .filter_map(|w| self.slots.get(w).copied())
        .collect();
      wanted.sort_unstable();
      alive.retain(|s| wanted.binary_search(s).is_ok());
    }
    let answered = alive.clone();
    // The walk is at block `i` of `edge`, request position `d`, inside span `si`; `alive` holds
    // blocks 0..=d.
    let (mut i, mut d, mut si) = (0usize, 0usize, 0usize);
    let n = seqs.len();
    while !alive.is_empty() && !(opts.early_exit && alive.len() <= 1) {
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
      } else {
        let Some(e) = self.edge_of_first(key) else {
          break;
        };
        (edge, si, i) = (&self.edges[e as usize], 0, 0);
      }
      let holders = &edge.spans[si].holders;
      d += 1;
      narrow(&mut alive, &mut next, holders, d as u32, &mut score);
    }
    for &s in &alive {
      score[s as usize] = d as u32 + 1;
    }
    for &s in &answered {
      let w = &self.workers[s as usize];
      out.scores.push((w.key, score[s as usize]));
      out.tree_sizes.push((w.key, w.engine.len() as u64));
    }
    SCRATCH.set(Scratch { score, alive, next });
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
      j += 1;
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
    let Some(mut cur) = self.locate(keys, from) else {
      return 0;
    };
    let mut n = 0;
    loop {
      if !self.edges[cur.0 as usize].holds(cur.1, slot) {
        return n;
      }
      n += 1;
      let j = from + n as usize;
      match keys.get(j).and_then(|&k| self.find_child(Some(cur), k)) {
        Some(p) => cur = p,
        None => return n,
      }
    }
  }

  /// The workers holding the chain's first block `key` (a root here).
  pub fn holders(&self, key: u64) -> Vec<WorkerKey> {
    let Some(e) = self.edge_of_first(key) else {
      return Vec::new();
    };
    let edge: &Edge = &self.edges[e as usize];
    edge.spans[0]
      .holders
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
