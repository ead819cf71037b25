//! Times a `/kv_recover` TreeDump of 1M blocks with tokens: dump, then JSON and msgpack encoding.
//!
//!   cargo run --release -p kvplane-core --example recover_dump

use kvplane_core::codec::recover;
use kvplane_core::event::{Batch, KvEvent, StoredEvent};
use kvplane_core::local_indexer::{LocalIndexer, LocalIndexerConfig};
use std::time::Instant;

fn main() {
  let mut ix = LocalIndexer::new(LocalIndexerConfig {
    stream: kvplane_core::stream::StreamConfig {
      buffer_steps: 16,
      ..Default::default()
    },
    ..Default::default()
  })
  .expect("a valid config");
  let mut h = 1u64;
  let mut tok = 7u32;
  for rank in 0..64 {
    let mut events = Vec::new();
    let mut parent = None;
    for i in 0..1024 {
      let hashes: Vec<u64> = (0..16)
        .map(|_| {
          h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
          h
        })
        .collect();
      let tokens: Vec<u32> = (0..256)
        .map(|_| {
          tok = tok.wrapping_mul(1103515245).wrapping_add(12345);
          tok % 150_000
        })
        .collect();
      let p = if i % 64 == 0 { None } else { parent };
      parent = Some(hashes[15]);
      events.push(KvEvent::Stored(StoredEvent {
        block_hashes: hashes,
        parent_block_hash: p,
        token_ids: tokens,
        block_size: 16,
        ..Default::default()
      }));
    }
    ix.apply_batch(Batch {
      seq: 0,
      ts: 1.0,
      dp_rank: Some(rank),
      events,
    })
    .unwrap();
  }
  let t = Instant::now();
  let answer = ix.get_events(None, None);
  let dump_s = t.elapsed().as_secs_f64();
  let t = Instant::now();
  let json = recover::to_json(&answer);
  let json_s = t.elapsed().as_secs_f64();
  let t = Instant::now();
  let mp = recover::to_msgpack(&answer);
  let mp_s = t.elapsed().as_secs_f64();
  let t = Instant::now();
  drop(answer);
  let drop_s = t.elapsed().as_secs_f64();
  println!(
    "blocks {}: dump {dump_s:.3} s, json {json_s:.3} s ({} MB), msgpack {mp_s:.3} s ({} MB), drop {drop_s:.3} s",
    ix.index().stats().memberships,
    json.len() / 1_000_000,
    mp.len() / 1_000_000
  );
}
