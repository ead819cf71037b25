//! Decode + apply of encoded vLLM batches, phase by phase: 1M blocks resident over 64 ranks, then
//! churn batches of one rank (remove the rank's oldest 16-block event, store a new one), as the
//! codec bench's first part. Prints block ops/s for decode only, decode + `Index::apply`, and
//! `LocalIndexer::apply_encoded` (decode, apply, re-encode for the replay log).
//!
//!   cargo run --release -p kvplane-core --example apply_encoded_churn -- [rounds]

use kvplane_core::codec::{self, Dialect, Format};
use kvplane_core::event::{Batch, KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::index::{Index, IndexConfig, WorkerKey};
use kvplane_core::local_indexer::{LocalIndexer, LocalIndexerConfig};
use std::time::Instant;

fn main() {
  let rounds: usize = std::env::args()
    .nth(1)
    .and_then(|a| a.parse().ok())
    .unwrap_or(3);
  let mut x = 0x9E37_79B9_7F4A_7C15u64;
  let mut next = move || {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
  };
  let ranks = 64;
  let resident = (1 << 20) / 16;
  let churn = 16_384;
  let stored: Vec<StoredEvent> = (0..resident + churn)
    .map(|_| StoredEvent {
      block_hashes: (0..16).map(|_| next()).collect(),
      token_ids: (0..256).map(|_| (next() % 150_000) as u32).collect(),
      block_size: 16,
      medium: Some("GPU".into()),
      ..Default::default()
    })
    .collect();
  let batch = |rank: usize, events: Vec<KvEvent>| Batch {
    seq: 0,
    ts: 1.0,
    dp_rank: Some(rank as i32),
    events,
  };
  let load: Vec<Vec<u8>> = (0..resident)
    .map(|i| {
      codec::encode(
        &batch(i % ranks, vec![KvEvent::Stored(stored[i].clone())]),
        Format::Vllm,
      )
    })
    .collect();
  let work: Vec<Vec<u8>> = (0..churn)
    .map(|i| {
      let removed = KvEvent::Removed(RemovedEvent {
        block_hashes: stored[i].block_hashes.clone(),
        medium: Some("GPU".into()),
        ..Default::default()
      });
      let new = KvEvent::Stored(stored[resident + i].clone());
      codec::encode(&batch(i % ranks, vec![removed, new]), Format::Vllm)
    })
    .collect();
  let ops = (churn * 32) as f64;
  for r in 0..rounds {
    let t = Instant::now();
    let mut n = 0;
    for b in &work {
      n += codec::decode(b, Dialect::Vllm).unwrap().batches.len();
    }
    let decode = t.elapsed().as_secs_f64();
    assert_eq!(n, churn);

    let cfg = LocalIndexerConfig {
      index: IndexConfig {
        retain_tokens: false,
        ..Default::default()
      },
      stream: kvplane_core::stream::StreamConfig {
        buffer_steps: 16,
        ..Default::default()
      },
      ..Default::default()
    };
    let mut ix = LocalIndexer::new(cfg).unwrap();
    for b in &load {
      ix.apply_encoded(b, Dialect::Vllm).unwrap();
    }
    let t = Instant::now();
    for b in &work {
      ix.apply_encoded(b, Dialect::Vllm).unwrap();
    }
    let full = t.elapsed().as_secs_f64();
    assert_eq!(ix.index().stats().memberships, 1 << 20);

    let mut index = Index::new(IndexConfig {
      retain_tokens: false,
      ..Default::default()
    });
    decode_apply(&mut index, &load);
    let t = Instant::now();
    decode_apply(&mut index, &work);
    let apply = t.elapsed().as_secs_f64();
    println!(
      "{{\"round\":{r},\"decode_only\":{:.2},\"decode_apply\":{:.2},\"apply_encoded\":{:.2}}}  (M block ops/s)",
      ops / decode / 1e6,
      ops / apply / 1e6,
      ops / full / 1e6
    );
  }
}

/// Decodes each payload and applies its events to the index (no log, no re-encoding).
fn decode_apply(index: &mut Index, payloads: &[Vec<u8>]) {
  for b in payloads {
    let d = codec::decode(b, Dialect::Vllm).unwrap();
    for batch in &d.batches {
      let w = WorkerKey {
        worker_id: 0,
        dp_rank: batch.dp_rank.unwrap_or(0) as u32,
      };
      for e in &batch.events {
        index.apply(w, e).unwrap();
      }
    }
  }
}
