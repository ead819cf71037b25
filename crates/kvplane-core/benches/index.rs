//! Index benchmarks (criterion + a latency/memory report): apply throughput with 1M blocks
//! resident, find_matches for an 8k-token request against 128 workers x 16k blocks, bytes per
//! membership, and tree-dump time for 1M blocks.
//!
//!   cargo bench -p kvplane-core --bench index
//!
//! The workload: every worker holds two of 8 shared system prompts (64 blocks each) and private
//! conversations of 256 blocks chained under them; 8 workers also hold prefixes of one shared
//! conversation at different depths, which the request continues (512 blocks of 16 tokens).

use criterion::Criterion;
use kvplane_core::event::{KvEvent, StoredEvent};
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

/// Churn event `k`'s 16 engine hashes: cheap and deterministic, so the churn can regenerate the
/// ids of any event to remove it.
fn churn_hashes(k: u64, out: &mut [u64; 16]) {
  for (i, h) in out.iter_mut().enumerate() {
    *h = splitmix(k * 16 + i as u64 + 1);
  }
}

/// Stores churn event `k`: 16 blocks of distinct tokens on worker `k % 64`.
fn churn_store(index: &mut Index, k: u64, hbuf: &mut [u64; 16], tbuf: &mut [u32; 256]) {
  churn_hashes(k, hbuf);
  // Token pairs of a 64-bit sequence from a random start: no two events share a block.
  let base = splitmix(!k);
  for (j, pair) in tbuf.chunks_exact_mut(2).enumerate() {
    let x = base.wrapping_add(j as u64 * 0x9E37_79B9_7F4A_7C15);
    pair[0] = x as u32;
    pair[1] = (x >> 32) as u32;
  }
  let blocks = StoredBlocks {
    block_hashes: hbuf,
    parent_block_hash: None,
    token_ids: tbuf,
    block_size: BS as u32,
    content_hashes: &[],
    keys: &[],
  };
  index.store_blocks(churn_worker(k), blocks).unwrap();
}

fn churn_worker(k: u64) -> WorkerKey {
  worker((k % 64) as usize)
}

fn splitmix(k: u64) -> u64 {
  let mut z = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
  z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
  z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
  z ^ (z >> 31)
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

  // Apply: churn (store 16-block events, remove old ones) with 1M blocks resident. Each event's
  // ids and tokens are generated into reused buffers inside the timed loop (their cost counts),
  // so they are in cache the way a decoder leaves them; the index's 1M blocks are not.
  let resident = (1u64 << 20) / 16;
  let mut index = Index::new(IndexConfig {
    retain_tokens: false,
    ..Default::default()
  });
  let (mut hbuf, mut tbuf, mut old) = ([0u64; 16], [0u32; 256], [0u64; 16]);
  for k in 0..resident {
    churn_store(&mut index, k, &mut hbuf, &mut tbuf);
  }
  let memberships = index.stats().memberships;
  let churn = 131_072u64;
  let t = Instant::now();
  for gone in 0..churn {
    churn_hashes(gone, &mut old);
    index.remove_blocks(churn_worker(gone), &old);
    churn_store(&mut index, gone + resident, &mut hbuf, &mut tbuf);
  }
  let secs = t.elapsed().as_secs_f64();
  let ops = churn * 32;
  assert_eq!(index.stats().memberships, memberships);
  println!(
    "REPORT apply: {:.2} M block ops/s ({} ops, store+remove churn, {} memberships resident, hashing included)",
    ops as f64 / secs / 1e6,
    ops,
    memberships
  );
  let mut gone = churn;
  c.bench_function("apply 16-block stored + removed event, 1M resident", |b| {
    b.iter(|| {
      churn_hashes(gone, &mut old);
      index.remove_blocks(churn_worker(gone), &old);
      churn_store(&mut index, gone + resident, &mut hbuf, &mut tbuf);
      gone += 1;
    })
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
