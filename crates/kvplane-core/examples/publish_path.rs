//! The publish path in the core, phase by phase, on the publish bench's workload (single-block
//! stored events of 16 tokens in chains of 64, alternating with removals of the block stored
//! 4096 events earlier; batches of 1024): columns -> queue, then drains (index apply, vLLM
//! msgpack encoding, replay log; with `proto` 1, the gRPC stream's protobuf too). Best of N
//! rounds; prints JSON.
//!
//!   cargo run --release -p kvplane-core --example publish_path -- [events] [rounds] [proto]

use kvplane_core::chunk::EventChunk;
use kvplane_core::columns::Columns;
use kvplane_core::local_indexer::{LocalIndexer, LocalIndexerConfig};
use kvplane_core::stream::queue::EventQueue;
use std::time::Instant;

const WINDOW: usize = 4096;

struct Workload {
  kinds: Vec<u8>,
  counts: Vec<u32>,
  hashes: Vec<u64>,
  parents: Vec<u64>,
  has_parent: Vec<u8>,
  tokens: Vec<u32>,
  token_start: Vec<usize>,
}

fn workload(n: usize) -> Workload {
  let mut w = Workload {
    kinds: Vec::with_capacity(n),
    counts: vec![1; n],
    hashes: Vec::with_capacity(n),
    parents: Vec::with_capacity(n),
    has_parent: Vec::with_capacity(n),
    tokens: Vec::with_capacity(n * 16),
    token_start: Vec::with_capacity(n + 1),
  };
  let mut stored = Vec::new();
  let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
  let mut i = 0;
  while w.kinds.len() < n {
    x = x
      .wrapping_mul(6_364_136_223_846_793_005)
      .wrapping_add(1_442_695_040_888_963_407);
    stored.push(x);
    w.token_start.push(w.tokens.len());
    w.kinds.push(0);
    w.hashes.push(x);
    w.has_parent.push(u8::from(i % 64 != 0));
    w.parents.push(if i % 64 != 0 { stored[i - 1] } else { 0 });
    w.tokens.extend((0..16).map(|s| ((x >> s) & 0x7fff) as u32));
    if i >= WINDOW && w.kinds.len() < n {
      w.token_start.push(w.tokens.len());
      w.kinds.push(1);
      w.hashes.push(stored[i - WINDOW]);
      w.parents.push(0);
      w.has_parent.push(0);
    }
    i += 1;
  }
  w.token_start.push(w.tokens.len());
  w
}

fn columns(w: &Workload, at: usize, end: usize) -> Columns<'_> {
  Columns {
    kinds: &w.kinds[at..end],
    hash_counts: &w.counts[at..end],
    hashes: &w.hashes[at..end],
    parents: &w.parents[at..end],
    has_parent: &w.has_parent[at..end],
    tokens: &w.tokens[w.token_start[at]..w.token_start[end]],
    block_size: 16,
    medium: Some("GPU"),
    lora_id: None,
    lora_name: None,
  }
}

fn main() {
  let mut args = std::env::args().skip(1);
  let n: usize = args
    .next()
    .map_or(2_000_000, |v| v.parse().expect("events"));
  let rounds: usize = args.next().map_or(3, |v| v.parse().expect("rounds"));
  let proto = args.next().is_some_and(|v| v == "1");
  let w = workload(n);
  let (mut best_push, mut best_drain) = (f64::MAX, f64::MAX);
  let mut bytes = 0;
  for _ in 0..rounds {
    let mut ix = LocalIndexer::new(LocalIndexerConfig::default()).unwrap();
    ix.set_format(kvplane_core::codec::Format::SmgProto, proto);
    let mut q = EventQueue::new(usize::MAX);
    let (mut push, mut drain) = (0.0, 0.0);
    bytes = 0;
    // As the JS publisher does: columns of 1024 events go in, a drain takes up to 16k.
    let mut at = 0;
    while at < n {
      let end = (at + 16 * 1024).min(n);
      let t = Instant::now();
      let mut b = at;
      while b < end {
        let e = (b + 1024).min(end);
        q.push(EventChunk::from_columns(&columns(&w, b, e)).unwrap());
        b = e;
      }
      push += t.elapsed().as_secs_f64();
      let t = Instant::now();
      let d = ix.drain(&mut q, 16 * 1024, 0.0, None).unwrap();
      drain += t.elapsed().as_secs_f64();
      bytes += d
        .batches
        .iter()
        .map(|b| b.encodings.iter().map(|(_, p)| p.len()).sum::<usize>())
        .sum::<usize>();
      at = end;
    }
    best_push = best_push.min(push);
    best_drain = best_drain.min(drain);
  }
  println!(
    "{{\"events\":{n},\"push_s\":{best_push:.4},\"drain_s\":{best_drain:.4},\"events_per_sec\":{:.0},\"bytes\":{bytes}}}",
    n as f64 / (best_push + best_drain)
  );
}
