use crate::chunk::EventChunk;
use crate::codec::{self, Format};
use crate::columns::Columns;
use crate::event::{Batch, EventRef, KvEvent, RemovedEvent, StoredEvent};

fn chunk(medium: Option<&str>, lora: Option<(i64, &str)>) -> EventChunk {
  EventChunk::from_columns(&Columns {
    kinds: &[0, 1, 2, 0, 0],
    hash_counts: &[2, 1, 0, 1, 0],
    hashes: &[u64::MAX, 200, 7, 1 << 40],
    parents: &[0, 0, 0, 5, 0],
    has_parent: &[0, 0, 0, 1, 0],
    tokens: &[1, 300, 70_000, 4, u32::MAX, 0],
    block_size: 2,
    medium,
    lora_id: lora.map(|l| l.0),
    lora_name: lora.map(|l| l.1),
  })
  .unwrap()
}

fn objects() -> EventChunk {
  EventChunk::from_events(vec![
    KvEvent::Stored(StoredEvent {
      block_hashes: vec![9],
      token_ids: vec![1, 2],
      block_size: 2,
      group_idx: Some(3),
      session_id: Some("s".into()),
      ..Default::default()
    }),
    KvEvent::Removed(RemovedEvent {
      block_hashes: vec![9],
      locality: Some("LOCAL".into()),
      ..Default::default()
    }),
  ])
}

/// Column events (vLLM's from prepared bytes) encode as the same events whole do.
#[test]
fn writes_what_the_batch_encoder_writes_in_every_format() {
  let chunks = [
    chunk(Some("GPU"), None),
    chunk(None, Some((-3, "adapter"))),
    objects(),
    chunk(
      Some("CPU_TIER_WITH_A_LONG_NAME_OVER_31_BYTES"),
      Some((7, "x")),
    ),
  ];
  let refs: Vec<EventRef<'_>> = chunks.iter().flat_map(|c| c.iter()).collect();
  for format in [Format::Vllm, Format::VllmLegacy, Format::Sglang] {
    for dp_rank in [None, Some(3)] {
      let batch = Batch {
        seq: 0,
        ts: 1.5,
        dp_rank,
        events: refs.iter().map(|e| e.to_event()).collect(),
      };
      let bytes = codec::encode_events(0, 1.5, &refs, dp_rank, format);
      assert_eq!(bytes, codec::encode(&batch, format), "{format:?}");
    }
  }
}
