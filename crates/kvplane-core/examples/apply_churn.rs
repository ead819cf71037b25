//! Profiling target: store/remove churn of 16-block events with 1M blocks resident, the same
//! workload as the index bench's apply report.
//! usage: apply_churn [rounds]
use kvplane_core::index::{Index, IndexConfig, StoredBlocks, WorkerKey};
use std::time::Instant;

/// Event `k`'s engine hashes: cheap and deterministic, so the churn loop can regenerate the ids
/// of any event to remove it.
fn hashes(k: u64, out: &mut [u64; 16]) {
  for (i, h) in out.iter_mut().enumerate() {
    *h = mix(k * 16 + i as u64 + 1);
  }
}

/// Event `k`'s tokens: pairs of a 64-bit sequence from a random start, so no two events share
/// a block.
fn tokens(k: u64, tokens: &mut [u32; 256]) {
  let base = mix(!k);
  for (j, pair) in tokens.chunks_exact_mut(2).enumerate() {
    let x = base.wrapping_add(j as u64 * 0x9E37_79B9_7F4A_7C15);
    pair[0] = x as u32;
    pair[1] = (x >> 32) as u32;
  }
}

fn mix(k: u64) -> u64 {
  let p = (k as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
  (p as u64) ^ ((p >> 64) as u64)
}

fn worker(k: u64) -> WorkerKey {
  WorkerKey {
    worker_id: k % 64,
    dp_rank: 0,
  }
}

fn main() {
  let rounds: u64 = std::env::args()
    .nth(1)
    .and_then(|a| a.parse().ok())
    .unwrap_or(4);
  let resident = (1 << 20) / 16;
  let per_round = 65_536;
  let mut index = Index::new(IndexConfig {
    retain_tokens: false,
    ..Default::default()
  });
  let (mut hbuf, mut tbuf, mut old) = ([0u64; 16], [0u32; 256], [0u64; 16]);
  let store = |index: &mut Index, k: u64, hbuf: &mut [u64; 16], tbuf: &mut [u32; 256]| {
    hashes(k, hbuf);
    tokens(k, tbuf);
    let blocks = StoredBlocks {
      block_hashes: hbuf,
      parent_block_hash: None,
      token_ids: tbuf,
      block_size: 16,
      content_hashes: &[],
      keys: &[],
    };
    index.store_blocks(worker(k), blocks).unwrap();
  };
  for k in 0..resident {
    store(&mut index, k, &mut hbuf, &mut tbuf);
  }
  for r in 0..rounds {
    let t = Instant::now();
    for i in 0..per_round {
      // Remove the oldest resident event, store a new one: 1M stays resident.
      let gone = r * per_round + i;
      hashes(gone, &mut old);
      index.remove_blocks(worker(gone), &old);
      store(&mut index, gone + resident, &mut hbuf, &mut tbuf);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
      "round {r}: {:.2} M block ops/s ({} memberships)",
      (per_round * 32) as f64 / s / 1e6,
      index.stats().memberships
    );
  }
}
