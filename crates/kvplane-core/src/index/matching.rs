//! `find_matches`: per worker, how many consecutive leading blocks of a request it holds.
//!
//! Engines evict from the tail, so a worker's blocks are prefix-closed: if it holds block i of a
//! chain it holds blocks 0..i too. For such workers the set holding block i shrinks as i grows,
//! and two positions holding the same number of prefix-closed workers hold the same ones. A
//! bisection finds the deepest position present; parent links lead up from there, and one pass
//! reads holders only where their count changes. When some worker is not prefix-closed (an inner
//! block was removed), the search bisects between positions whose counts differ, and such
//! workers are scanned exactly.

use super::node::{Node, EMPTY, FREED};
use super::table::hash32;
use super::{Index, WorkerKey};

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

const UNSEEN: u32 = u32::MAX - 1;

/// `find_matches`'s buffers, kept between the queries of a thread (a query allocates only its
/// answer). Taken for the query, so a nested call starts with empty ones.
#[derive(Default)]
struct Scratch {
  /// Node per position (`Probe::nodes`).
  nodes: Vec<u32>,
  /// Score per worker slot.
  score: Vec<u32>,
  /// The candidates holding block 0.
  first: Vec<u32>,
}

thread_local! {
  static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

struct Probe<'a> {
  index: &'a Index,
  seqs: &'a [u64],
  /// Node index per position, UNSEEN until looked up, EMPTY when absent.
  nodes: Vec<u32>,
}

impl Probe<'_> {
  fn node(&mut self, i: usize) -> Option<&Node> {
    if self.nodes[i] == UNSEEN {
      let (key, nodes) = (self.seqs[i], &self.index.nodes);
      self.nodes[i] = self
        .index
        .by_key
        .get(hash32(key), |n| nodes[n as usize].key == key)
        .unwrap_or(EMPTY);
    }
    match self.nodes[i] {
      EMPTY => None,
      n => Some(&self.index.nodes[n as usize]),
    }
  }

  /// The deepest position present, by bisection (taking the midpoints the jump search takes
  /// next), or `None` when block 0 is absent. The table buckets of both midpoints a step can
  /// lead to are fetched while it probes, so the misses of consecutive steps overlap.
  fn deepest(&mut self) -> Option<usize> {
    let n = self.seqs.len();
    let by_key = &self.index.by_key;
    let prefetch = |seqs: &[u64], i: usize| by_key.prefetch(hash32(seqs[i]));
    if n == 0 {
      return None;
    }
    prefetch(self.seqs, n - 1);
    prefetch(self.seqs, (n - 1) / 2);
    self.node(0)?;
    let (mut lo, mut hi) = (0, n - 1);
    if self.node(hi).is_some() {
      lo = hi;
    }
    while hi > lo + 1 {
      let mid = lo + (hi - lo) / 2;
      prefetch(self.seqs, lo + (mid - lo) / 2);
      prefetch(self.seqs, mid + (hi - mid) / 2);
      if self.node(mid).is_some() {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    Some(lo)
  }

  /// Walks up from position `deepest` to 0 by parent links, filling every position's node and
  /// handing each to `visit`, deepest first. A link needs no key check: a node's key chains its
  /// parent's (the content hash, or the engine's chained hash), and a parent lives as long as a
  /// child links to it. Nodes of one chain sit together in the slab, so the walk reads
  /// neighbouring memory where separate lookups would each miss the cache; and a parent is
  /// usually the slot just before its child, so the next node is fetched on that guess while the
  /// link is still being read. A node without a link (a chain rooted in another tier) is followed
  /// by a lookup. False when a position is absent (the walk stops there).
  fn walk_up(&mut self, deepest: usize, mut visit: impl FnMut(usize, &Node)) -> bool {
    let nodes = &self.index.nodes;
    let mut cur = self.nodes[deepest];
    for i in (0..=deepest).rev() {
      let node = &nodes[cur as usize];
      visit(i, node);
      if i == 0 {
        break;
      }
      let guess = cur.wrapping_sub(1);
      let next = match self.nodes[i - 1] {
        UNSEEN if node.parent == guess => guess,
        UNSEEN => match self.link_or_lookup(node.parent, i - 1) {
          Some(n) => n,
          None => return false,
        },
        EMPTY => return false,
        n => n,
      };
      self.nodes[i - 1] = next;
      cur = next;
    }
    true
  }

  /// Position `i`'s node: `parent` when the link is set, else a lookup.
  #[cold]
  fn link_or_lookup(&mut self, parent: u32, i: usize) -> Option<u32> {
    if parent < FREED {
      return Some(parent);
    }
    self.node(i)?;
    Some(self.nodes[i])
  }

  fn has(&mut self, i: usize, slot: u32) -> bool {
    let sets = &self.index.sets;
    self.node(i).is_some_and(|n| sets.contains(n, slot))
  }

  /// Members at position i that are candidates and prefix-closed.
  fn closed_count(&mut self, i: usize, candidate: &[bool]) -> usize {
    let index = self.index;
    let Some(n) = self.node(i) else { return 0 };
    let n = *n;
    if index.open_workers == 0 && candidate.is_empty() {
      return index.sets.len(&n);
    }
    let mut c = 0;
    index.sets.for_each(&n, |s| {
      if index.workers[s as usize].prefix_closed && (candidate.is_empty() || candidate[s as usize])
      {
        c += 1;
      }
    });
    c
  }
}

impl Index {
  /// Scores every worker for a request given as its chained block hashes (the index's keys).
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

  pub fn find_matches(&self, seqs: &[u64], opts: &MatchOptions) -> Matches {
    let mut out = Matches::default();
    // Candidate filter by slot (empty = every worker).
    let mut candidate: Vec<bool> = Vec::new();
    if let Some(ws) = &opts.workers {
      candidate = vec![false; self.workers.len()];
      for w in ws {
        if let Some(&s) = self.slots.get(w) {
          candidate[s as usize] = true;
        }
      }
    }
    let is_candidate = |s: u32| candidate.is_empty() || candidate[s as usize];
    let Scratch {
      mut nodes,
      mut score,
      mut first,
    } = SCRATCH.take();
    nodes.clear();
    nodes.resize(seqs.len(), UNSEEN);
    score.clear();
    score.resize(self.workers.len(), 0);
    first.clear();
    let mut probe = Probe {
      index: self,
      seqs,
      nodes,
    };
    let deepest = probe.deepest();
    if let Some(n0) = (!seqs.is_empty()).then(|| probe.node(0).copied()).flatten() {
      self.sets.for_each(&n0, |s| {
        if is_candidate(s) {
          first.push(s);
        }
      });
    }

    let swept = match deepest {
      Some(d) if !opts.early_exit && self.open_workers == 0 => {
        self.sweep(&mut probe, d, &mut score)
      }
      Some(d) => {
        // Fills the positions the searches below read.
        probe.walk_up(d, |_, _| {});
        false
      }
      None => false,
    };
    if !swept && opts.early_exit {
      self.scan(&mut probe, &first, &mut score, true);
    } else if !swept {
      let (closed, open): (Vec<u32>, Vec<u32>) = first
        .iter()
        .partition(|&&s| self.workers[s as usize].prefix_closed);
      if !closed.is_empty() {
        self.bisect(&mut probe, &candidate, &mut score);
      }
      self.scan(&mut probe, &open, &mut score, false);
    }

    for &s in &first {
      let key = self.workers[s as usize].key;
      out.scores.push((key, score[s as usize]));
      out
        .tree_sizes
        .push((key, self.workers[s as usize].engine.len() as u64));
    }
    SCRATCH.set(Scratch {
      nodes: probe.nodes,
      score,
      first,
    });
    out
  }

  /// The node indexed under `key`, if any.
  fn node_of(&self, key: u64) -> Option<&Node> {
    let nodes = &self.nodes;
    self
      .by_key
      .get(hash32(key), |n| nodes[n as usize].key == key)
      .map(|n| &self.nodes[n as usize])
  }

  /// How many consecutive keys from `keys[from]` on worker `w` holds (a lower tier's
  /// continuation of a match).
  pub fn run_from(&self, w: WorkerKey, keys: &[u64], from: usize) -> u32 {
    let Some(&slot) = self.slots.get(&w) else {
      return 0;
    };
    let mut n = 0;
    for &key in keys.iter().skip(from) {
      match self.node_of(key) {
        Some(node) if self.sets.contains(node, slot) => n += 1,
        _ => break,
      }
    }
    n
  }

  /// The workers holding the block indexed under `key`.
  pub fn holders(&self, key: u64) -> Vec<WorkerKey> {
    let mut out = Vec::new();
    if let Some(node) = self.node_of(key) {
      self
        .sets
        .for_each(node, |s| out.push(self.workers[s as usize].key));
    }
    out
  }

  /// Exact scan for `slots`: walk positions until each has left. With `early_exit`, stop when at
  /// most one is left and credit it with the depth reached.
  fn scan(&self, probe: &mut Probe<'_>, slots: &[u32], score: &mut [u32], early_exit: bool) {
    let mut alive: Vec<u32> = slots.to_vec();
    let n = probe.seqs.len();
    let mut i = 0;
    while i < n && !alive.is_empty() {
      if early_exit && alive.len() == 1 {
        break;
      }
      alive.retain(|&s| {
        let held = probe.has(i, s);
        if !held {
          score[s as usize] = i as u32;
        }
        held
      });
      i += 1;
    }
    for s in alive {
      score[s as usize] = i as u32;
    }
  }

  /// Scores when every worker is prefix-closed (the usual case): one walk up from the deepest
  /// position. Going up, a node's workers are a superset of its child's, and the same workers
  /// where their count is the same; so members are read only where the count grows, and a member
  /// not yet scored holds exactly the blocks up to there. False (nothing scored) if the walk
  /// found a position absent.
  fn sweep(&self, probe: &mut Probe<'_>, deepest: usize, score: &mut [u32]) -> bool {
    let mut count = 0;
    let done = probe.walk_up(deepest, |i, node| {
      let c = self.sets.len(node);
      if c != count {
        // c - count members are new here: stop once they are found.
        let mut new = c.saturating_sub(count);
        count = c;
        self.sets.until(node, |s| {
          if new == 0 {
            return false;
          }
          if score[s as usize] == 0 {
            score[s as usize] = i as u32 + 1;
            new -= 1;
          }
          new > 0
        });
      }
    });
    if !done {
      score.fill(0);
    }
    done
  }

  /// Jump search for the prefix-closed workers holding block 0.
  fn bisect(&self, probe: &mut Probe<'_>, candidate: &[bool], score: &mut [u32]) {
    let n = probe.seqs.len();
    let last = n - 1;
    let mut members = Vec::new();
    // Closed candidates at i that are not at `next` have exactly i + 1 leading blocks.
    let mut credit = |probe: &mut Probe<'_>, i: usize, next: Option<usize>, score: &mut [u32]| {
      let Some(node) = probe.node(i).copied() else {
        return;
      };
      members.clear();
      self.sets.for_each(&node, |s| {
        if self.workers[s as usize].prefix_closed && (candidate.is_empty() || candidate[s as usize])
        {
          members.push(s);
        }
      });
      for &s in &members {
        if next.is_none_or(|j| !probe.has(j, s)) {
          score[s as usize] = i as u32 + 1;
        }
      }
    };
    let mut counts = vec![u32::MAX; n];
    let mut count = |probe: &mut Probe<'_>, i: usize| {
      if counts[i] == u32::MAX {
        counts[i] = probe.closed_count(i, candidate) as u32;
      }
      counts[i]
    };
    let mut stack = Vec::with_capacity(64);
    stack.push((0usize, last));
    while let Some((lo, hi)) = stack.pop() {
      if lo == hi || count(probe, lo) == count(probe, hi) {
        continue;
      }
      if hi == lo + 1 {
        credit(probe, lo, Some(hi), score);
      } else {
        let mid = lo + (hi - lo) / 2;
        stack.push((mid, hi));
        stack.push((lo, mid));
      }
    }
    credit(probe, last, None, score);
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
  fn a_worker_whose_orphans_are_gone_is_walked_again() {
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
    // Block 4 goes first: blocks 5..8 are held without their chain, matched by a scan.
    ix.apply(w, &removed(vec![4])).unwrap();
    assert_eq!(
      (ix.open_workers, ix.stats().per_worker[0].unreachable_blocks),
      (1, 1)
    );
    assert_eq!(scores(&ix), vec![(w, 3), (other, 8)]);
    // The rest of the chain, root side first (each removal orphans the next): walked again.
    ix.apply(w, &removed(vec![5, 6])).unwrap();
    assert_eq!(ix.open_workers, 1);
    ix.apply(w, &removed(vec![7, 8])).unwrap();
    assert_eq!(
      (ix.open_workers, ix.stats().per_worker[0].unreachable_blocks),
      (0, 0)
    );
    assert_eq!(scores(&ix), vec![(w, 3), (other, 8)]);
    // A parent stored again while its orphan is held: the count stays above (a scan, still
    // right) until the orphan goes.
    ix.apply(w, &removed(vec![2])).unwrap();
    ix.apply(w, &stored).unwrap();
    assert_eq!(ix.open_workers, 1);
    assert_eq!(scores(&ix), vec![(w, 8), (other, 8)]);
    ix.apply(w, &KvEvent::Cleared).unwrap();
    assert_eq!(ix.open_workers, 0);
  }
}
