//! Profiling target: store/remove churn of 16-block events with 1M blocks resident.
//! usage: apply_churn [rounds]
use kvplane_core::event::{KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::index::{Index, IndexConfig, WorkerKey};
use std::time::Instant;

fn main() {
  let rounds: usize = std::env::args()
    .nth(1)
    .and_then(|a| a.parse().ok())
    .unwrap_or(4);
  let mut x = 0x9E37_79B9_7F4A_7C15u64;
  let mut next = move || {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
  };
  let n_events = (1 << 20) / 16;
  let extra = 65_536;
  let events: Vec<(WorkerKey, KvEvent, KvEvent)> = (0..n_events + extra)
    .map(|i| {
      let hashes: Vec<u64> = (0..16).map(|_| next()).collect();
      let tokens: Vec<u32> = (0..256).map(|_| (next() % 150_000) as u32).collect();
      let w = WorkerKey {
        worker_id: 0,
        dp_rank: (i % 64) as u32,
      };
      let stored = KvEvent::Stored(StoredEvent {
        block_hashes: hashes.clone(),
        token_ids: tokens,
        block_size: 16,
        ..Default::default()
      });
      let removed = KvEvent::Removed(RemovedEvent {
        block_hashes: hashes,
        ..Default::default()
      });
      (w, stored, removed)
    })
    .collect();
  let mut index = Index::new(IndexConfig {
    retain_tokens: false,
    ..Default::default()
  });
  for (w, s, _) in &events[..n_events] {
    index.apply(*w, s).unwrap();
  }
  for r in 0..rounds {
    let t = Instant::now();
    let mut ops = 0u64;
    for i in 0..extra {
      // Remove the oldest resident event, store a new one: 1M stays resident.
      let old = (r * extra + i) % (n_events + extra);
      let new = (old + n_events) % (n_events + extra);
      let (wo, _, ro) = &events[old];
      let (wn, sn, _) = &events[new];
      index.apply(*wo, ro).unwrap();
      index.apply(*wn, sn).unwrap();
      ops += 32;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
      "round {r}: {:.2} M block ops/s ({} memberships)",
      ops as f64 / s / 1e6,
      index.stats().memberships
    );
  }
}
