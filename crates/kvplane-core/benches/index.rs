//! Index benchmarks (criterion + a latency/memory report): apply throughput with 1M blocks
//! resident, find_matches for an 8k-token request against 128 workers x 16k blocks, bytes per
//! membership, and tree-dump time for 1M blocks.
//!
//!   cargo bench -p kvplane-core --bench index
//!
//! The workload: every worker holds two of 8 shared system prompts (64 blocks each) and private
//! conversations of 256 blocks chained under them; 8 workers also hold prefixes of one shared
//! conversation at different depths, which the request continues (512 blocks of 16 tokens).

use criterion::{BatchSize, Criterion};
use kvplane_core::event::{KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::hash::{hash_blocks, Algo, HashOptions};
use kvplane_core::index::{Index, IndexConfig, MatchOptions, StoredBlocks, WorkerKey};
use std::hint::black_box;
use std::time::Instant;

const BS: usize = 16;

struct Rng(u64);
impl Rng {
  fn next(&mut self) -> u64 {
    self.0 ^= self.0 << 13;
    self.0 ^= self.0 >> 7;
    self.0 ^= self.0 << 17;
    self.0
  }
  fn tokens(&mut self, blocks: usize) -> Vec<u32> {
    (0..blocks * BS)
      .map(|_| (self.next() % 150_000) as u32)
      .collect()
  }
}

fn worker(w: usize) -> WorkerKey {
  WorkerKey {
    worker_id: w as u64,
    dp_rank: 0,
  }
}

/// A stored event of `tokens` whose engine hashes are fresh ids, under `parent`.
fn stored(rng: &mut Rng, tokens: &[u32], parent: Option<u64>) -> StoredEvent {
  StoredEvent {
    block_hashes: (0..tokens.len() / BS).map(|_| rng.next()).collect(),
    parent_block_hash: parent,
    token_ids: tokens.to_vec(),
    block_size: BS as u32,
    ..Default::default()
  }
}

struct Workload {
  index: Index,
  request: Vec<u64>,
}

fn build(workers: usize, blocks_per_worker: usize, retain_tokens: bool) -> Workload {
  let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
  let prompts: Vec<Vec<u32>> = (0..8).map(|_| rng.tokens(64)).collect();
  let shared_conv = rng.tokens(448);
  let mut index = Index::new(IndexConfig {
    retain_tokens,
    ..Default::default()
  });
  for w in 0..workers {
    let mut held = 0;
    let mut prompt_tails = Vec::new();
    for p in [w % 8, (w / 8 + 1) % 8] {
      let ev = stored(&mut rng, &prompts[p], None);
      prompt_tails.push(*ev.block_hashes.last().unwrap());
      held += ev.block_hashes.len();
      index.apply(worker(w), &KvEvent::Stored(ev)).unwrap();
    }
    if w < 64 && w % 8 == 0 {
      // Prefixes of the shared conversation under prompt 0, at different depths.
      let depth = 56 + (w / 8) * 56;
      let ev = stored(&mut rng, &shared_conv[..depth * BS], Some(prompt_tails[0]));
      held += ev.block_hashes.len();
      index.apply(worker(w), &KvEvent::Stored(ev)).unwrap();
    }
    while held < blocks_per_worker {
      let n = (blocks_per_worker - held).min(256);
      let parent = prompt_tails[(rng.next() % 2) as usize];
      // Conversations arrive as stored events of 16 blocks, each chained on the previous.
      let conv = rng.tokens(n);
      let mut prev = parent;
      for chunk in conv.chunks(16 * BS) {
        let ev = stored(&mut rng, chunk, Some(prev));
        prev = *ev.block_hashes.last().unwrap();
        index.apply(worker(w), &KvEvent::Stored(ev)).unwrap();
      }
      held += n;
    }
  }
  let mut req = prompts[0].clone();
  req.extend_from_slice(&shared_conv);
  let request = hash_blocks(&req, &HashOptions::new(Algo::Xxh3, BS), false)
    .unwrap()
    .hashes;
  Workload { index, request }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
  sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
  let mut c = Criterion::default().sample_size(10).configure_from_args();

  // find_matches: 128 workers x 16k blocks, 8k-token request.
  let t = Instant::now();
  let wl = build(128, 16_384, false);
  eprintln!("built 128 x 16k index in {:.1}s", t.elapsed().as_secs_f64());
  let opts = MatchOptions::default();
  let m = wl.index.find_matches(&wl.request, &opts);
  let mut depths: Vec<u32> = m.scores.iter().map(|s| s.1).collect();
  depths.sort_unstable();
  depths.dedup();
  c.bench_function("find_matches 8k tokens vs 128x16k", |b| {
    b.iter(|| black_box(wl.index.find_matches(&wl.request, &opts)))
  });
  let mut lat = Vec::with_capacity(20_000);
  for _ in 0..20_000 {
    let t = Instant::now();
    black_box(wl.index.find_matches(black_box(&wl.request), &opts));
    lat.push(t.elapsed().as_secs_f64() * 1e6);
  }
  lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
  let req_tokens: Vec<u32> = (0..512 * BS as u32).collect();
  let t = Instant::now();
  for _ in 0..1000 {
    black_box(
      hash_blocks(
        black_box(&req_tokens),
        &HashOptions::new(Algo::Xxh3, BS),
        false,
      )
      .unwrap(),
    );
  }
  let hash_us = t.elapsed().as_secs_f64() * 1e6 / 1000.0;
  let stats = wl.index.stats();
  println!(
    "REPORT find_matches: {} workers matched at {} distinct depths; p50 {:.2} us, p99 {:.2} us (+ hashing 8k tokens {:.2} us)",
    m.scores.len(),
    depths.len(),
    percentile(&lat, 0.5),
    percentile(&lat, 0.99),
    hash_us
  );
  println!(
    "REPORT memory (no tokens): {} memberships over {} blocks, {:.1} bytes per membership",
    stats.memberships,
    stats.blocks,
    stats.bytes as f64 / stats.memberships as f64
  );
  drop(wl);

  // Apply: churn (store 16-block events, remove old ones) with 1M blocks resident.
  let mut rng = Rng(7);
  let mut index = Index::new(IndexConfig {
    retain_tokens: false,
    ..Default::default()
  });
  let mut live: std::collections::VecDeque<(usize, Vec<u64>)> = std::collections::VecDeque::new();
  let events: Vec<(usize, StoredEvent)> = (0..(1 << 20) / 16 + 32_768)
    .map(|i| {
      let toks = rng.tokens(16);
      (i % 64, stored(&mut rng, &toks, None))
    })
    .collect();
  let mut it = events.into_iter();
  for (w, ev) in it.by_ref().take((1 << 20) / 16) {
    live.push_back((w, ev.block_hashes.clone()));
    index.apply(worker(w), &KvEvent::Stored(ev)).unwrap();
  }
  let rest: Vec<(usize, StoredEvent)> = it.collect();
  let resident = index.stats().memberships;
  // The timed loop applies borrowed slices (`store_blocks` / `remove_blocks`, what the publish
  // path calls), so it measures the index, not cloning events.
  let mut live: std::collections::VecDeque<(usize, &[u64])> =
    live.iter().map(|(w, h)| (*w, &h[..])).collect();
  let t = Instant::now();
  let mut ops = 0u64;
  for (w, ev) in rest.iter() {
    let (ow, old) = live.pop_front().unwrap();
    ops += (old.len() + ev.block_hashes.len()) as u64;
    index.remove_blocks(worker(ow), old);
    live.push_back((*w, &ev.block_hashes));
    index
      .store_blocks(worker(*w), StoredBlocks::of(ev))
      .unwrap();
  }
  let secs = t.elapsed().as_secs_f64();
  println!(
    "REPORT apply: {:.2} M block ops/s ({} ops, store+remove churn, {} memberships resident, hashing included)",
    ops as f64 / secs / 1e6,
    ops,
    resident
  );
  let live: std::collections::VecDeque<(usize, Vec<u64>)> =
    live.into_iter().map(|(w, h)| (w, h.to_vec())).collect();
  let live = std::cell::RefCell::new(live);
  let index = std::cell::RefCell::new(index);
  c.bench_function("apply 16-block stored event, 1M resident", |b| {
    b.iter_batched(
      || {
        let toks = rng.tokens(16);
        stored(&mut rng, &toks, None)
      },
      |ev| {
        let (ow, old) = live.borrow_mut().pop_front().unwrap();
        let mut ix = index.borrow_mut();
        ix.apply(
          worker(ow),
          &KvEvent::Removed(RemovedEvent {
            block_hashes: old,
            ..Default::default()
          }),
        )
        .unwrap();
        live.borrow_mut().push_back((ow, ev.block_hashes.clone()));
        ix.apply(worker(ow), &KvEvent::Stored(ev)).unwrap();
      },
      BatchSize::SmallInput,
    )
  });
  drop(index);

  // Dump: 1M blocks with tokens retained.
  let wl = build(64, 16_384, true);
  let blocks = wl.index.stats().memberships;
  let t = Instant::now();
  let dump = wl.index.dump();
  let secs = t.elapsed().as_secs_f64();
  let events: usize = dump.iter().map(|d| d.events.len()).sum();
  println!(
    "REPORT dump: {blocks} memberships -> {events} stored events in {:.3} s",
    secs
  );
  c.bench_function("dump 1M blocks", |b| b.iter(|| black_box(wl.index.dump())));
  c.final_summary();
}
