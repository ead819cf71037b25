//! Model-based test of the index: long random event sequences (stores with and without parents,
//! unknown parents, duplicates, removes of inner and leaf blocks, clears, several workers and DP
//! ranks) applied to the index and to a plain reference model. After every step `find_matches`
//! must agree with the model for every query, and a tree dump applied to an empty index must
//! reproduce the same matches. The same events applied a piece at a time (`Piecewise`) give the
//! same state, and a reader between the pieces sees the model's state after the blocks applied,
//! in its answers and in the index's figures.

use kvplane_core::event::{KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::hash::{content_hash, seq_hash};
use kvplane_core::index::{Index, IndexConfig, MatchOptions, Piecewise, WorkerKey};
use kvplane_core::shared::Shared;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BS: usize = 2;
/// The parent of an `Op::Store` made `unknown`: no worker holds it.
const UNKNOWN_PARENT: u64 = 0xdead_beef;
/// Block contents are drawn from a small alphabet so chains share prefixes across workers.
const ALPHABET: u32 = 3;

fn tokens_of(content: u32) -> Vec<u32> {
  (0..BS as u32).map(|i| content * 100 + i).collect()
}

fn key_after(parent: Option<u64>, content: u32) -> u64 {
  let c = content_hash(&tokens_of(content));
  parent.map_or(c, |p| seq_hash(p, c))
}

/// Engine ids are opaque and differ per worker (like vLLM with a random NONE_HASH).
fn engine_hash(w: usize, key: u64) -> u64 {
  key.rotate_left(7) ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn worker(w: usize) -> WorkerKey {
  WorkerKey {
    worker_id: (w / 2) as u64 + 10,
    dp_rank: (w % 2) as u32,
  }
}

#[derive(Debug, Clone)]
enum Op {
  /// Store a chain of `contents` under a parent: `None` = root, `Some(i)` = the i-th held block
  /// (mod count), or an unknown parent when `unknown`.
  Store {
    w: usize,
    parent: Option<usize>,
    unknown: bool,
    contents: Vec<u32>,
  },
  /// Remove held blocks picked by index, plus an unknown hash when `unknown`.
  Remove {
    w: usize,
    picks: Vec<usize>,
    unknown: bool,
  },
  Clear {
    w: usize,
  },
}

fn op() -> impl Strategy<Value = Op> {
  let w = 0usize..4;
  prop_oneof![
    6 => (w.clone(), proptest::option::of(0usize..64), proptest::bool::weighted(0.05), proptest::collection::vec(0..ALPHABET, 1..5))
      .prop_map(|(w, parent, unknown, contents)| Op::Store { w, parent, unknown, contents }),
    3 => (w.clone(), proptest::collection::vec(0usize..64, 1..3), proptest::bool::weighted(0.1))
      .prop_map(|(w, picks, unknown)| Op::Remove { w, picks, unknown }),
    1 => w.prop_map(|w| Op::Clear { w }),
  ]
}

/// The reference: per worker, engine hash -> block key.
#[derive(Default, Clone)]
struct Model {
  held: Vec<BTreeMap<u64, u64>>,
}

impl Model {
  fn matches(&self, query: &[u64]) -> BTreeMap<WorkerKey, u32> {
    let mut out = BTreeMap::new();
    for (w, held) in self.held.iter().enumerate() {
      let keys: HashSet<u64> = held.values().copied().collect();
      let n = query.iter().take_while(|k| keys.contains(k)).count() as u32;
      if n > 0 {
        out.insert(worker(w), n);
      }
    }
    out
  }
}

fn index_matches(index: &Index, query: &[u64]) -> BTreeMap<WorkerKey, u32> {
  index
    .find_matches(query, &MatchOptions::default())
    .scores
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// Every chain over the alphabet up to depth 4: the queries.
fn queries() -> Vec<Vec<u64>> {
  let mut out = Vec::new();
  let mut frontier: Vec<Vec<u32>> = vec![vec![]];
  for _ in 0..4 {
    let mut next = Vec::new();
    for f in &frontier {
      for c in 0..ALPHABET {
        let mut g = f.clone();
        g.push(c);
        next.push(g);
      }
    }
    for g in &next {
      let mut keys = Vec::new();
      let mut parent = None;
      for &c in g {
        let k = key_after(parent, c);
        keys.push(k);
        parent = Some(k);
      }
      out.push(keys);
    }
    frontier = next;
  }
  out
}

/// The event `op` makes of the model's state, applied to the model: what the index is given.
fn step(model: &mut Model, op: Op) -> (WorkerKey, KvEvent) {
  match op {
    Op::Store {
      w,
      parent,
      unknown,
      contents,
    } => {
      let held: Vec<(u64, u64)> = model.held[w].iter().map(|(e, k)| (*e, *k)).collect();
      let (parent_eh, mut parent_key) = match (unknown, parent) {
        (true, _) => (Some(UNKNOWN_PARENT), None),
        (false, Some(i)) if !held.is_empty() => {
          let (e, k) = held[i % held.len()];
          (Some(e), Some(k))
        }
        _ => (None, None),
      };
      let mut ev = StoredEvent {
        parent_block_hash: parent_eh,
        block_size: BS as u32,
        ..Default::default()
      };
      let mut keys = Vec::new();
      for &c in &contents {
        let k = key_after(parent_key, c);
        ev.block_hashes.push(engine_hash(w, k));
        ev.token_ids.extend(tokens_of(c));
        keys.push(k);
        parent_key = Some(k);
      }
      if !unknown {
        for (eh, k) in ev.block_hashes.iter().zip(keys) {
          model.held[w].insert(*eh, k);
        }
      }
      (worker(w), KvEvent::Stored(ev))
    }
    Op::Remove { w, picks, unknown } => {
      let held: Vec<u64> = model.held[w].keys().copied().collect();
      let mut hashes: Vec<u64> = if held.is_empty() {
        vec![]
      } else {
        picks.iter().map(|i| held[i % held.len()]).collect()
      };
      hashes.dedup();
      if unknown {
        hashes.push(0xfeed_f00d);
      }
      for h in &hashes {
        model.held[w].remove(h);
      }
      (
        worker(w),
        KvEvent::Removed(RemovedEvent {
          block_hashes: hashes,
          ..Default::default()
        }),
      )
    }
    Op::Clear { w } => {
      model.held[w].clear();
      (worker(w), KvEvent::Cleared)
    }
  }
}

fn new_model() -> Model {
  Model {
    held: vec![BTreeMap::new(); 4],
  }
}

/// Applies `ev` a piece of `blocks` blocks at a time.
fn apply_in_pieces(index: &mut Index, w: WorkerKey, ev: &KvEvent, blocks: usize) {
  let mut p = Piecewise::new(w, ev, blocks);
  while index.apply_piece(&mut p).unwrap() {}
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
  let mut index = Index::new(IndexConfig::default());
  // The same events applied a piece of 1 or 2 blocks at a time: the same state, the same drops.
  let mut by_piece = [1, 2].map(|_| Index::new(IndexConfig::default()));
  let mut model = new_model();
  let qs = queries();
  for op in ops {
    let (w, ev) = step(&mut model, op);
    index.apply(w, &ev).unwrap();
    for (ix, blocks) in by_piece.iter_mut().zip([1, 2]) {
      apply_in_pieces(ix, w, &ev, blocks);
      // Heap bytes aside: a run of blocks added in pieces can leave a list with more capacity.
      let [mut a, mut b] = [ix.stats(), index.stats()];
      (a.bytes, b.bytes) = (0, 0);
      prop_assert_eq!(a, b, "{}-block pieces", blocks);
    }
    for q in &qs {
      prop_assert_eq!(index_matches(&index, q), model.matches(q), "query {:?}", q);
      for ix in &by_piece {
        prop_assert_eq!(
          index_matches(ix, q),
          model.matches(q),
          "in pieces, query {:?}",
          q
        );
      }
    }
    let members: usize = model.held.iter().map(|h| h.len()).sum();
    let stats = index.stats();
    prop_assert_eq!(stats.memberships as usize, members);
    // Every stored block carries its tokens: the retained-token count follows the live blocks.
    prop_assert_eq!(stats.token_bytes, stats.blocks * BS as u64 * 4);
  }

  // A dump applied to an empty index reproduces every match.
  let mut rebuilt = Index::new(IndexConfig::default());
  for wd in index.dump() {
    for ev in wd.events {
      rebuilt.apply(wd.worker, &KvEvent::Stored(ev)).unwrap();
    }
  }
  for q in &qs {
    prop_assert_eq!(
      index_matches(&rebuilt, q),
      index_matches(&index, q),
      "rebuilt, query {:?}",
      q
    );
  }
  // Nothing leaks: clearing every worker frees every node.
  for w in 0..4 {
    index.apply(worker(w), &KvEvent::Cleared).unwrap();
  }
  prop_assert_eq!(index.stats().blocks, 0);
  prop_assert_eq!(index.stats().memberships, 0);
  prop_assert_eq!(index.stats().token_bytes, 0);
  Ok(())
}

proptest! {
  #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

  #[test]
  fn index_agrees_with_the_model_after_every_step(ops in proptest::collection::vec(op(), 1..120)) {
    run(ops)?;
  }
}

#[test]
fn early_exit_stops_once_one_worker_is_left() {
  let mut index = Index::new(IndexConfig::default());
  let mut chain = |w: usize, contents: &[u32]| {
    let mut ev = StoredEvent {
      block_size: BS as u32,
      ..Default::default()
    };
    let mut parent = None;
    for &c in contents {
      let k = key_after(parent, c);
      ev.block_hashes.push(engine_hash(w, k));
      ev.token_ids.extend(tokens_of(c));
      parent = Some(k);
    }
    index.apply(worker(w), &KvEvent::Stored(ev)).unwrap();
    let _ = &parent;
  };
  chain(0, &[0, 1, 2, 0]);
  chain(1, &[0]);
  let mut q = Vec::new();
  let mut parent = None;
  for c in [0, 1, 2, 0] {
    let k = key_after(parent, c);
    q.push(k);
    parent = Some(k);
  }
  let exact: HashMap<_, _> = index
    .find_matches(&q, &MatchOptions::default())
    .scores
    .into_iter()
    .collect();
  assert_eq!(exact[&worker(0)], 4);
  assert_eq!(exact[&worker(1)], 1);
  let early: HashMap<_, _> = index
    .find_matches(
      &q,
      &MatchOptions {
        early_exit: true,
        ..Default::default()
      },
    )
    .scores
    .into_iter()
    .collect();
  assert_eq!(early[&worker(1)], 1);
  assert!(
    early[&worker(0)] >= 1 && early[&worker(0)] <= 4,
    "a lower bound"
  );
}

proptest! {
  #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

  #[test]
  fn index_agrees_with_the_model_over_long_sequences(ops in proptest::collection::vec(op(), 600..1000)) {
    run(ops)?;
  }
}

#[test]
fn the_same_content_under_a_second_engine_id_is_one_membership() {
  let mut index = Index::new(IndexConfig::default());
  let chain = |base: u64| StoredEvent {
    block_hashes: vec![base, base + 1, base + 2],
    token_ids: (0..6).collect(),
    block_size: BS as u32,
    ..Default::default()
  };
  index
    .apply(worker(0), &KvEvent::Stored(chain(100)))
    .unwrap();
  index
    .apply(worker(0), &KvEvent::Stored(chain(200)))
    .unwrap();
  let s = index.stats();
  assert_eq!(s.memberships, 3);
  assert_eq!(
    s.drops
      .iter()
      .find(|d| d.0.name() == "duplicate_store")
      .unwrap()
      .1,
    3
  );
  let dump = index.dump();
  assert_eq!(dump[0].events.len(), 1);
  assert_eq!(dump[0].events[0].block_hashes, vec![100, 101, 102]);
  // The second ids were never indexed: removing them is counted as unknown.
  index
    .apply(
      worker(0),
      &KvEvent::Removed(RemovedEvent {
        block_hashes: vec![201],
        ..Default::default()
      }),
    )
    .unwrap();
  assert_eq!(index.stats().memberships, 3);
  index.apply(worker(0), &KvEvent::Cleared).unwrap();
  assert_eq!((index.stats().memberships, index.stats().blocks), (0, 0));
}

#[test]
fn branch_points_wider_than_u16_keep_exact_counts() {
  // One root with 70,000 children, held by two workers: kids and child-node counters pass u16.
  let mut index = Index::new(IndexConfig {
    retain_tokens: false,
    ..Default::default()
  });
  let n = 70_000u32;
  for w in 0..2 {
    let base = 1_000_000 * (w as u64 + 1);
    index
      .apply(
        worker(w),
        &KvEvent::Stored(StoredEvent {
          block_hashes: vec![base],
          token_ids: tokens_of(7),
          block_size: BS as u32,
          ..Default::default()
        }),
      )
      .unwrap();
    for c in 0..n {
      index
        .apply(
          worker(w),
          &KvEvent::Stored(StoredEvent {
            block_hashes: vec![base + 1 + c as u64],
            parent_block_hash: Some(base),
            token_ids: vec![c, c + 1],
            block_size: BS as u32,
            ..Default::default()
          }),
        )
        .unwrap();
    }
  }
  let s = index.stats();
  assert_eq!(
    (s.blocks, s.memberships),
    (n as u64 + 1, 2 * (n as u64 + 1))
  );
  // Worker 0 drops the root: all its children become unreachable; worker 1 keeps the tree.
  let removed = |hashes: Vec<u64>| {
    KvEvent::Removed(RemovedEvent {
      block_hashes: hashes,
      ..Default::default()
    })
  };
  index.apply(worker(0), &removed(vec![1_000_000])).unwrap();
  let s = index.stats();
  assert_eq!(s.per_worker[0].unreachable_blocks, n as u64);
  assert_eq!(s.per_worker[1].unreachable_blocks, 0);
  // Worker 1 drops its children, then worker 0 drops its (unreachable) ones.
  index
    .apply(
      worker(1),
      &removed((0..n as u64).map(|c| 2_000_001 + c).collect()),
    )
    .unwrap();
  let s = index.stats();
  assert_eq!(s.per_worker[1].unreachable_blocks, 0);
  assert_eq!(s.blocks, n as u64 + 1);
  index
    .apply(
      worker(0),
      &removed((0..n as u64).map(|c| 1_000_001 + c).collect()),
    )
    .unwrap();
  let s = index.stats();
  assert_eq!(s.per_worker[0].unreachable_blocks, 0);
  // Only worker 1's root is left; removing it frees every node.
  assert_eq!((s.blocks, s.memberships), (1, 1));
  index.apply(worker(1), &removed(vec![2_000_000])).unwrap();
  let s = index.stats();
  assert_eq!((s.blocks, s.memberships), (0, 0));
}

/// The model's states as an event is applied `blocks` blocks at a time, one per piece, from
/// `before` (the model before the event) to `after`: a store's first blocks held, a removal's
/// first hashes gone. A store with an unknown parent, a clear or an empty removal is one piece.
fn piece_states(
  before: &Model,
  after: &Model,
  w: WorkerKey,
  ev: &KvEvent,
  blocks: usize,
) -> Vec<Model> {
  let wi = (0..4).find(|&i| worker(i) == w).unwrap();
  let (hashes, storing) = match ev {
    KvEvent::Stored(s) if s.parent_block_hash != Some(UNKNOWN_PARENT) => (&s.block_hashes, true),
    KvEvent::Removed(r) => (&r.block_hashes, false),
    _ => return vec![after.clone()],
  };
  let pieces = hashes.len().div_ceil(blocks).max(1);
  (1..=pieces)
    .map(|k| {
      let mut m = before.clone();
      for h in &hashes[..(k * blocks).min(hashes.len())] {
        if storing {
          m.held[wi].insert(*h, after.held[wi][h]);
        } else {
          m.held[wi].remove(h);
        }
      }
      m
    })
    .collect()
}

/// Blocks each worker holds in the model.
fn held_counts(m: &Model) -> BTreeMap<WorkerKey, u64> {
  (0..4)
    .map(|i| (worker(i), m.held[i].len() as u64))
    .collect()
}

/// What a reader may see after some pieces: the model's answers, or while a worker is cleared,
/// the answers before the clear with that worker's counts no higher. The same for the blocks
/// each worker holds.
enum Expected {
  Exact(Vec<BTreeMap<WorkerKey, u32>>),
  Clearing(WorkerKey, Vec<BTreeMap<WorkerKey, u32>>),
}

/// Reads during writes: one thread applies the events a piece of `blocks` blocks per write lock,
/// counting the pieces beside the index; another queries meanwhile. Every answer must be the
/// model's after exactly the number of pieces counted under the same read lock: the events
/// before applied whole and the first blocks of the one under way, never any other state.
fn run_with_reader(ops: Vec<Op>, blocks: usize) -> Result<(), TestCaseError> {
  let qs = queries();
  let mut model = new_model();
  let mut events = Vec::new();
  // A dry run says how many pieces each clear takes (it goes through the worker's engine map a
  // few places a piece, so that depends on the map's size).
  let mut dry = Index::new(IndexConfig::default());
  // answers[v][q]: the model's answer to query q after v pieces.
  let mut answers = vec![Expected::Exact(
    qs.iter().map(|q| model.matches(q)).collect::<Vec<_>>(),
  )];
  let mut counts = vec![held_counts(&model)];
  for op in ops {
    let before = model.clone();
    let (w, ev) = step(&mut model, op);
    let mut p = Piecewise::new(w, &ev, blocks);
    let mut pieces = 1;
    while dry.apply_piece(&mut p).unwrap() {
      pieces += 1;
    }
    if matches!(ev, KvEvent::Cleared) {
      // Between the pieces of a clear: the worker holds some of what it held, the others all.
      let was: Vec<_> = qs.iter().map(|q| before.matches(q)).collect();
      for _ in 1..pieces {
        answers.push(Expected::Clearing(w, was.clone()));
        counts.push(held_counts(&before));
      }
      answers.push(Expected::Exact(
        qs.iter().map(|q| model.matches(q)).collect(),
      ));
      counts.push(held_counts(&model));
    } else {
      let states = piece_states(&before, &model, w, &ev, blocks);
      prop_assert_eq!(states.len(), pieces, "pieces of {:?}", ev);
      for m in states {
        answers.push(Expected::Exact(qs.iter().map(|q| m.matches(q)).collect()));
        counts.push(held_counts(&m));
      }
    }
    events.push((w, ev));
  }
  let shared = Arc::new(Shared::new((Index::new(IndexConfig::default()), 0usize)));
  let done = Arc::new(AtomicBool::new(false));
  let reader = {
    let (shared, done, qs) = (shared.clone(), done.clone(), qs.clone());
    std::thread::spawn(move || {
      let (mut seen, mut figures) = (Vec::new(), Vec::new());
      let mut q = 0;
      while !done.load(Ordering::Acquire) || seen.len() < 64 {
        let g = shared.read();
        seen.push((g.1, q, index_matches(&g.0, &qs[q])));
        if seen.len() % 8 == 0 {
          figures.push((g.1, g.0.stats()));
        }
        drop(g);
        q = (q + 1) % qs.len();
      }
      (seen, figures)
    })
  };
  for (i, (w, ev)) in events.iter().enumerate() {
    let mut p = Piecewise::new(*w, ev, blocks);
    loop {
      let mut g = shared.write();
      let more = g.0.apply_piece(&mut p).unwrap();
      g.1 += 1;
      drop(g);
      if !more {
        break;
      }
    }
    if i % 8 == 0 {
      std::thread::yield_now();
    }
  }
  done.store(true, Ordering::Release);
  let (seen, figures) = reader.join().unwrap();
  prop_assert_eq!(
    shared.read().1 + 1,
    answers.len(),
    "pieces applied against the model's"
  );
  let versions: HashSet<usize> = seen.iter().map(|s| s.0).collect();
  for (v, q, answer) in &seen {
    match &answers[*v] {
      Expected::Exact(a) => {
        prop_assert_eq!(answer, &a[*q], "after {} pieces, query {:?}", v, qs[*q])
      }
      Expected::Clearing(w, was) => {
        let was = &was[*q];
        let others = |m: &BTreeMap<WorkerKey, u32>| {
          m.iter()
            .filter(|(k, _)| *k != w)
            .map(|(k, n)| (*k, *n))
            .collect::<Vec<_>>()
        };
        prop_assert_eq!(
          others(answer),
          others(was),
          "after {} pieces (a clear of {:?})",
          v,
          w
        );
        let (now, then) = (
          answer.get(w).copied().unwrap_or(0),
          was.get(w).copied().unwrap_or(0),
        );
        prop_assert!(
          now <= then,
          "a worker being cleared matches {} blocks, {} before",
          now,
          then
        );
      }
    }
  }
  prop_assert!(!versions.is_empty());
  // The figures read between pieces: each worker's blocks the model's (while a worker is
  // cleared, no more than it held), and the memberships their sum.
  for (v, s) in &figures {
    let clearing = match &answers[*v] {
      Expected::Clearing(w, _) => Some(*w),
      Expected::Exact(_) => None,
    };
    let mut sum = 0;
    for ws in &s.per_worker {
      let model = counts[*v][&ws.worker];
      if clearing == Some(ws.worker) {
        prop_assert!(ws.blocks <= model, "after {} pieces: {:?}", v, ws);
      } else {
        prop_assert_eq!(ws.blocks, model, "after {} pieces: {:?}", v, ws);
      }
      prop_assert!(
        ws.unreachable_blocks <= ws.blocks,
        "after {} pieces: {:?}",
        v,
        ws
      );
      sum += ws.blocks;
    }
    prop_assert_eq!(s.memberships, sum, "after {} pieces", v);
  }
  Ok(())
}

proptest! {
  #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

  #[test]
  fn a_concurrent_reader_sees_the_model_between_pieces(ops in proptest::collection::vec(op(), 200..600), blocks in 1usize..4) {
    run_with_reader(ops, blocks)?;
  }
}
