//! Events of one worker interleaved between the pieces of another (`Piecewise`), as a caller
//! outside `Shared`'s writer turns could apply them: the index stays whole. A clear left halfway
//! is finished by the worker's next event; a store goes on from its last block stored, or is
//! dropped as a store with an unknown parent when the worker no longer holds that block. Between
//! the pieces of a clear, the figures count what the worker still holds.

use kvplane_core::event::{KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::hash::hash_blocks;
use kvplane_core::hash::{Algo, HashOptions};
use kvplane_core::index::{Index, IndexConfig, IndexStats, MatchOptions, Piecewise, WorkerKey};

const BS: usize = 2;

fn worker(w: u64) -> WorkerKey {
  WorkerKey {
    worker_id: w,
    dp_rank: 0,
  }
}

/// A stored event: blocks with engine ids `ids` and one token pair each from `content`.
fn stored(parent: Option<u64>, ids: &[u64], content: u32) -> KvEvent {
  KvEvent::Stored(StoredEvent {
    parent_block_hash: parent,
    block_hashes: ids.to_vec(),
    token_ids: (0..(ids.len() * BS) as u32)
      .map(|t| content * 1000 + t)
      .collect(),
    block_size: BS as u32,
    ..Default::default()
  })
}

fn removed(ids: &[u64]) -> KvEvent {
  KvEvent::Removed(RemovedEvent {
    block_hashes: ids.to_vec(),
    ..Default::default()
  })
}

fn apply(index: &mut Index, w: u64, ev: &KvEvent) {
  index.apply(worker(w), ev).unwrap();
}

/// Applies the rest of `p`.
fn finish(index: &mut Index, p: &mut Piecewise<'_>) {
  while index.apply_piece(p).unwrap() {}
}

/// Figures without heap bytes (lists grown in pieces can keep more capacity).
fn figures(index: &Index) -> IndexStats {
  let mut s = index.stats();
  s.bytes = 0;
  s
}

/// Per worker, how many leading blocks of each of `chains` (token lists) it holds.
fn matches(index: &Index, chains: &[Vec<u32>]) -> Vec<Vec<(WorkerKey, u32)>> {
  let opts = HashOptions::new(Algo::Xxh3, BS);
  chains
    .iter()
    .map(|t| {
      let keys = hash_blocks(t, &opts, false).unwrap().hashes;
      let mut m: Vec<_> = index
        .find_matches(&keys, &MatchOptions::default())
        .scores
        .into_iter()
        .collect();
      m.sort();
      m
    })
    .collect()
}

/// The tree sizes given for `w` by the queries of `chains` that match it.
fn tree_sizes_of(index: &Index, chains: &[Vec<u32>], w: WorkerKey) -> Vec<u64> {
  let opts = HashOptions::new(Algo::Xxh3, BS);
  chains
    .iter()
    .flat_map(|t| {
      let keys = hash_blocks(t, &opts, false).unwrap().hashes;
      index
        .find_matches(&keys, &MatchOptions::default())
        .tree_sizes
        .into_iter()
        .filter(move |(k, _)| *k == w)
        .map(|(_, n)| n)
    })
    .collect()
}

/// Worker 1 holds 100 root chains of 2 blocks (ids 1000..1200), worker 2 the first 50 of them.
fn two_workers() -> (Index, Vec<Vec<u32>>) {
  let mut index = Index::new(IndexConfig::default());
  let mut chains = Vec::new();
  for c in 0..100u32 {
    let ids = [1000 + 2 * c as u64, 1001 + 2 * c as u64];
    let ev = stored(None, &ids, c);
    apply(&mut index, 1, &ev);
    if c < 50 {
      apply(&mut index, 2, &ev);
    }
    let KvEvent::Stored(s) = ev else {
      unreachable!()
    };
    chains.push(s.token_ids);
  }
  (index, chains)
}

/// The figures' own agreement: memberships are the workers' blocks, and no worker holds more
/// blocks unreachable than it holds.
fn check_figures(s: &IndexStats) {
  let held: u64 = s.per_worker.iter().map(|w| w.blocks).sum();
  assert_eq!(
    s.memberships, held,
    "memberships against the workers' blocks"
  );
  for w in &s.per_worker {
    assert!(w.unreachable_blocks <= w.blocks, "{w:?}");
  }
}

#[test]
fn between_the_pieces_of_a_clear_the_figures_count_what_the_worker_still_holds() {
  let (mut index, chains) = two_workers();
  let clear = KvEvent::Cleared;
  let mut p = Piecewise::new(worker(1), &clear, 1);
  let mut seen = vec![200];
  while index.apply_piece(&mut p).unwrap() {
    let s = figures(&index);
    check_figures(&s);
    assert_eq!(s.per_worker[1].blocks, 100, "the other worker untouched");
    assert_eq!(index.worker_blocks(worker(1)), s.per_worker[0].blocks);
    // A query that still matches the worker gives the same tree size.
    let sizes = tree_sizes_of(&index, &chains, worker(1));
    assert_eq!(sizes.is_empty(), s.per_worker[0].blocks == 0);
    assert!(
      sizes.iter().all(|&n| n == s.per_worker[0].blocks),
      "{sizes:?}"
    );
    seen.push(s.per_worker[0].blocks);
  }
  seen.push(figures(&index).per_worker[0].blocks);
  // 16 entries of the worker's map a piece (1-block pieces), each on an edge of 2 blocks.
  assert!(
    (5..=16).contains(&seen.len()),
    "a clear of 200 blocks in pieces: {seen:?}"
  );
  assert!(seen.windows(2).all(|w| w[1] <= w[0]), "{seen:?}");
  assert!(seen[1..seen.len() - 1].iter().any(|&b| 0 < b && b < 200));
  assert_eq!(*seen.last().unwrap(), 0);
  let s = figures(&index);
  assert_eq!((s.memberships, s.blocks), (100, 100));
  assert_eq!(matches(&index, &chains[..1])[0], vec![(worker(2), 2)]);
}

#[test]
fn a_clear_left_halfway_is_finished_by_the_workers_next_event() {
  let next_events = [
    ("a store", stored(None, &[7, 8], 500)),
    ("a removal", removed(&[1000, 1199])),
    ("a clear", KvEvent::Cleared),
  ];
  for (what, next) in &next_events {
    for whole in [true, false] {
      let (mut index, chains) = two_workers();
      let clear = KvEvent::Cleared;
      let mut p = Piecewise::new(worker(1), &clear, 1);
      for _ in 0..3 {
        assert!(index.apply_piece(&mut p).unwrap());
      }
      drop(p);
      if whole {
        apply(&mut index, 1, next);
      } else {
        finish(&mut index, &mut Piecewise::new(worker(1), next, 1));
      }
      // The same as the clear applied whole before the event.
      let (mut expected, _) = two_workers();
      apply(&mut expected, 1, &KvEvent::Cleared);
      apply(&mut expected, 1, next);
      let how = if whole { "whole" } else { "in pieces" };
      assert_eq!(figures(&index), figures(&expected), "{what} {how}");
      check_figures(&figures(&index));
      assert_eq!(matches(&index, &chains), matches(&expected, &chains));
    }
  }
}

/// Worker 1 holds chain P (ids 1, 2) and chain Q (id 3); then stores S (ids 11..16) after P's
/// last block, in pieces of 2 blocks, with `between` applied after its first piece.
fn store_with_between(between: &KvEvent) -> Index {
  let mut index = Index::new(IndexConfig::default());
  apply(&mut index, 1, &stored(None, &[1, 2], 1));
  apply(&mut index, 1, &stored(None, &[3], 2));
  let s = stored(Some(2), &[11, 12, 13, 14, 15, 16], 3);
  let mut p = Piecewise::new(worker(1), &s, 2);
  assert!(index.apply_piece(&mut p).unwrap());
  apply(&mut index, 1, between);
  finish(&mut index, &mut p);
  index
}

fn drop_count(s: &IndexStats, name: &str) -> u64 {
  s.drops.iter().find(|d| d.0.name() == name).unwrap().1
}

#[test]
fn a_store_goes_on_from_its_last_block_after_another_event_of_its_worker() {
  // Block 3 is not on the store's way: the store ends as if it had come first.
  let index = store_with_between(&removed(&[3]));
  let mut expected = Index::new(IndexConfig::default());
  apply(&mut expected, 1, &stored(None, &[1, 2], 1));
  apply(&mut expected, 1, &stored(None, &[3], 2));
  apply(
    &mut expected,
    1,
    &stored(Some(2), &[11, 12, 13, 14, 15, 16], 3),
  );
  apply(&mut expected, 1, &removed(&[3]));
  assert_eq!(figures(&index), figures(&expected));
  assert_eq!(index.worker_blocks(worker(1)), 8);
  assert!(!index.needs_recovery(worker(1)));
}

#[test]
fn a_store_whose_last_block_went_between_its_pieces_drops_the_rest_as_an_unknown_parent() {
  for between in [removed(&[12]), KvEvent::Cleared] {
    let index = store_with_between(&between);
    // What an engine would have sent: the first two blocks, the event between, then the rest
    // after block 12.
    let mut expected = Index::new(IndexConfig::default());
    apply(&mut expected, 1, &stored(None, &[1, 2], 1));
    apply(&mut expected, 1, &stored(None, &[3], 2));
    let whole = stored(Some(2), &[11, 12, 13, 14, 15, 16], 3);
    let KvEvent::Stored(w) = &whole else {
      unreachable!()
    };
    let first = KvEvent::Stored(StoredEvent {
      block_hashes: w.block_hashes[..2].to_vec(),
      token_ids: w.token_ids[..2 * BS].to_vec(),
      ..w.clone()
    });
    let rest = KvEvent::Stored(StoredEvent {
      parent_block_hash: Some(12),
      block_hashes: w.block_hashes[2..].to_vec(),
      token_ids: w.token_ids[2 * BS..].to_vec(),
      ..w.clone()
    });
    apply(&mut expected, 1, &first);
    apply(&mut expected, 1, &between);
    apply(&mut expected, 1, &rest);
    let s = figures(&index);
    assert_eq!(s, figures(&expected), "{between:?}");
    assert_eq!(drop_count(&s, "unknown_parent"), 1);
    assert!(index.needs_recovery(worker(1)));
    check_figures(&s);
  }
}

/// Pieces a clear of worker 1 takes, a piece of 1 block at a time.
fn clear_pieces(index: &mut Index) -> usize {
  let clear = KvEvent::Cleared;
  let mut p = Piecewise::new(worker(1), &clear, 1);
  let mut pieces = 1;
  while index.apply_piece(&mut p).unwrap() {
    pieces += 1;
  }
  assert_eq!(index.worker_blocks(worker(1)), 0);
  pieces
}

#[test]
fn a_clear_takes_pieces_by_the_blocks_left_not_by_the_size_of_the_map() {
  // One chain of 2,000 blocks is one edge: its first piece rids it of the worker, and the clear
  // ends there, however many entries its map has left.
  let mut index = Index::new(IndexConfig::default());
  let ids: Vec<u64> = (1..=2000).collect();
  apply(&mut index, 1, &stored(None, &ids, 1));
  assert_eq!(clear_pieces(&mut index), 1);
  assert_eq!(figures(&index).blocks, 0);

  // 2,000 one-block chains, 1,900 of them removed: the map keeps the buckets of 2,000 entries,
  // the clear takes pieces for the 100 left (16 a piece).
  let mut index = Index::new(IndexConfig::default());
  for c in 0..2000u64 {
    apply(&mut index, 1, &stored(None, &[10_000 + c], c as u32));
  }
  let gone: Vec<u64> = (100..2000).map(|c| 10_000 + c).collect();
  apply(&mut index, 1, &removed(&gone));
  assert_eq!(index.worker_blocks(worker(1)), 100);
  let pieces = clear_pieces(&mut index);
  assert!((7..=9).contains(&pieces), "{pieces} pieces");
  assert_eq!(figures(&index).blocks, 0);
}

/// Blocks per worker in the index's tree dump (what a recovery from it would give).
fn dumped(index: &Index, w: u64) -> usize {
  index
    .dump()
    .iter()
    .filter(|d| d.worker == worker(w))
    .flat_map(|d| &d.events)
    .map(|e| e.block_hashes.len())
    .sum()
}

#[test]
fn a_store_goes_on_after_a_piece_of_another_event_and_from_a_block_held_under_another_id() {
  // The last block of the store's first piece is one the worker already held under another
  // engine id; a removal of an unrelated block comes between the pieces.
  let mut index = Index::new(IndexConfig::default());
  let mut expected = Index::new(IndexConfig::default());
  let KvEvent::Stored(mut s) = stored(None, &[21, 22, 23, 24], 1) else {
    unreachable!()
  };
  s.token_ids[2 * BS..].iter_mut().for_each(|t| *t += 77_000);
  let s = KvEvent::Stored(s);
  for ix in [&mut index, &mut expected] {
    apply(ix, 1, &stored(None, &[1, 2], 1));
    apply(ix, 1, &stored(None, &[50], 9));
  }
  apply(&mut expected, 1, &s);
  apply(&mut expected, 1, &removed(&[50]));
  let mut p = Piecewise::new(worker(1), &s, 2);
  assert!(index.apply_piece(&mut p).unwrap());
  apply(&mut index, 1, &removed(&[50]));
  finish(&mut index, &mut p);
  assert_eq!(figures(&index), figures(&expected));
  assert_eq!(index.worker_blocks(worker(1)), 4);
  assert!(!index.needs_recovery(worker(1)));

  // A removal applied a piece at a time, its second piece between the store's second and third:
  // it takes the store's last block, so the rest is dropped as after an unknown parent.
  let mut index = Index::new(IndexConfig::default());
  apply(&mut index, 1, &stored(None, &[1, 2], 1));
  let s = stored(Some(2), &[11, 12, 13, 14, 15, 16], 3);
  let r = removed(&[99, 14]);
  let mut ps = Piecewise::new(worker(1), &s, 2);
  let mut pr = Piecewise::new(worker(1), &r, 1);
  assert!(index.apply_piece(&mut ps).unwrap()); // 11, 12
  assert!(index.apply_piece(&mut pr).unwrap()); // 99: not held
  assert!(index.apply_piece(&mut ps).unwrap()); // 13, 14
  assert!(!index.apply_piece(&mut pr).unwrap()); // 14
  assert!(!index.apply_piece(&mut ps).unwrap()); // 15, 16 dropped
  let s = figures(&index);
  assert_eq!(drop_count(&s, "unknown_parent"), 1);
  assert!(index.needs_recovery(worker(1)));
  assert_eq!(index.worker_blocks(worker(1)), 5);
  assert_eq!(dumped(&index, 1), 5);
  check_figures(&s);
}

#[test]
fn a_store_whose_edge_was_freed_and_taken_by_another_worker_between_its_pieces_is_dropped() {
  let mut index = Index::new(IndexConfig::default());
  let s = stored(None, &[11, 12, 13, 14, 15, 16], 3);
  let r = removed(&[99, 14, 13, 12, 11]);
  let mut ps = Piecewise::new(worker(1), &s, 2);
  let mut pr = Piecewise::new(worker(1), &r, 1);
  assert!(index.apply_piece(&mut ps).unwrap()); // 11, 12
  assert!(index.apply_piece(&mut pr).unwrap()); // 99: not held
  assert!(index.apply_piece(&mut ps).unwrap()); // 13, 14
  finish(&mut index, &mut pr); // the store's edge freed
  apply(&mut index, 2, &stored(None, &[21, 22, 23, 24, 25], 7)); // takes that edge id
  assert!(!index.apply_piece(&mut ps).unwrap());
  let s = figures(&index);
  assert_eq!(drop_count(&s, "unknown_parent"), 1);
  assert_eq!(
    (
      index.worker_blocks(worker(1)),
      index.worker_blocks(worker(2))
    ),
    (0, 5)
  );
  assert_eq!((dumped(&index, 1), dumped(&index, 2)), (0, 5));
  check_figures(&s);
}

#[test]
fn a_store_resumed_while_a_clear_of_its_worker_is_under_way_finishes_the_clear_first() {
  let mut index = Index::new(IndexConfig::default());
  for c in 0..100u64 {
    apply(&mut index, 1, &stored(None, &[1000 + c], c as u32));
  }
  let s = stored(Some(1000), &[11, 12, 13, 14], 3);
  let mut ps = Piecewise::new(worker(1), &s, 2);
  assert!(index.apply_piece(&mut ps).unwrap());
  let clear = KvEvent::Cleared;
  let mut pc = Piecewise::new(worker(1), &clear, 1);
  assert!(index.apply_piece(&mut pc).unwrap());
  // The store's rest: after the clear, its parent is gone.
  assert!(!index.apply_piece(&mut ps).unwrap());
  assert_eq!(index.worker_blocks(worker(1)), 0);
  assert!(!index.apply_piece(&mut pc).unwrap(), "the clear is done");
  let s = figures(&index);
  assert_eq!(drop_count(&s, "unknown_parent"), 1);
  assert!(
    index.needs_recovery(worker(1)),
    "the drop's recovery mark kept"
  );
  assert_eq!((s.blocks, s.memberships), (0, 0));
}
