//! The relay's per-payload work on the link thread: one engine payload (vLLM's msgpack, 128
//! events) decoded, applied to the index, encoded in the log's format and logged
//! (`LocalIndexer::relay_coalesced`), on the workload of bench/relay.mjs.
//!
//!   cargo bench -p kvplane-core --bench relay
//!
//! The workload: 1,024 payloads replayed in a cycle, each 64 one-block stores of 16 tokens in
//! chains of 4 (medium GPU) and 64 removals of the blocks stored 8 payloads earlier, with the
//! fields vLLM 0.33's block pool sets on every event (`group_idx` 0, and one nil extra key per
//! stored block).

use criterion::{Criterion, Throughput};
use kvplane_core::codec::value::Value;
use kvplane_core::codec::{self, Dialect, Format};
use kvplane_core::event::{Batch, KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::local_indexer::{LocalIndexer, LocalIndexerConfig};
use std::hint::black_box;

const EVENTS: usize = 128;
const STORES: usize = EVENTS / 2;
const CYCLE: usize = 1024;

fn payloads() -> Vec<Vec<u8>> {
  let hash = |batch: usize, i: usize| (batch * STORES + i + 1) as u64;
  (0..CYCLE)
    .map(|b| {
      let mut events = Vec::with_capacity(EVENTS);
      for i in 0..STORES {
        events.push(KvEvent::Stored(StoredEvent {
          block_hashes: vec![hash(b, i)],
          parent_block_hash: (i % 4 != 0).then(|| hash(b, i - 1)),
          token_ids: (0..16)
            .map(|t| ((b * STORES + i) * 16 + t) as u32)
            .collect(),
          block_size: 16,
          medium: Some("GPU".into()),
          group_idx: Some(0),
          extra_keys: Some(Value::Array(vec![Value::Nil])),
          ..Default::default()
        }));
      }
      let old = (b + CYCLE - 8) % CYCLE;
      for i in (0..STORES).rev() {
        events.push(KvEvent::Removed(RemovedEvent {
          block_hashes: vec![hash(old, i)],
          medium: Some("GPU".into()),
          group_idx: Some(0),
          ..Default::default()
        }));
      }
      let batch = Batch {
        seq: 0,
        ts: 1.5,
        dp_rank: None,
        events,
      };
      codec::encode(&batch, Format::Vllm)
    })
    .collect()
}

fn main() {
  let mut c = Criterion::default().sample_size(20).configure_from_args();
  let payloads = payloads();
  let mut ix = LocalIndexer::new(LocalIndexerConfig::default()).unwrap();
  let mut next = 0;
  let mut g = c.benchmark_group("relay");
  g.throughput(Throughput::Elements(EVENTS as u64));
  g.bench_function("a 128-event vLLM payload, relayed", |b| {
    b.iter(|| {
      let p = &payloads[next % CYCLE];
      next += 1;
      black_box(ix.relay_coalesced(&[p], Dialect::Vllm, Some(0)).unwrap());
    })
  });
  g.throughput(Throughput::Elements(4 * EVENTS as u64));
  g.bench_function("4 such payloads, relayed as one", |b| {
    b.iter(|| {
      let i = next % CYCLE;
      next += 4;
      let group: Vec<&[u8]> = (i..i + 4).map(|k| &payloads[k % CYCLE][..]).collect();
      black_box(ix.relay_coalesced(&group, Dialect::Vllm, Some(0)).unwrap());
    })
  });
  g.finish();
  c.final_summary();
}
