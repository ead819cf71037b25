use crate::chunk::EventChunk;
use crate::codec::msgpack::Writer;
use crate::codec::value::Value;
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

fn stored(hashes: &[u64], parent: Option<u64>, medium: Option<&str>) -> StoredEvent {
  StoredEvent {
    block_hashes: hashes.to_vec(),
    parent_block_hash: parent,
    token_ids: (0..hashes.len() as u32 * 2).collect(),
    block_size: 2,
    medium: medium.map(Into::into),
    ..Default::default()
  }
}

fn removed(hashes: &[u64], medium: Option<&str>) -> KvEvent {
  KvEvent::Removed(RemovedEvent {
    block_hashes: hashes.to_vec(),
    medium: medium.map(Into::into),
    ..Default::default()
  })
}

/// Which of a chunk's events are in its columns.
fn in_columns(c: &EventChunk) -> Vec<bool> {
  c.iter()
    .map(|e| match e {
      EventRef::Stored(s) => s.chunk_attrs().is_some(),
      EventRef::Removed(r) => r.chunk_attrs().is_some(),
      _ => true,
    })
    .collect()
}

/// Views write what the batch they came from writes, in every format.
fn same_bytes(views: &[EventRef<'_>], batch: &Batch) {
  for out in [
    Format::Vllm,
    Format::VllmLegacy,
    Format::Sglang,
    Format::SmgProto,
  ] {
    let batch = Batch {
      seq: 4,
      ..batch.clone()
    };
    assert_eq!(
      codec::encode_events(4, batch.ts, views, batch.dp_rank, out),
      codec::encode(&batch, out),
      "{out:?}"
    );
  }
}

/// The relay's decoder puts plain events sharing the first ones' attributes into columns and
/// reads every other event whole, to the same events and the same bytes in every format.
#[test]
fn a_payload_decoded_into_columns_is_the_same_batch() {
  let events = vec![
    removed(&[1], Some("GPU")),
    KvEvent::Stored(stored(&[2, 3], None, Some("GPU"))),
    // Another medium, another block size, a LoRA, an extra field, byte-string hashes: whole.
    KvEvent::Stored(stored(&[4], Some(3), Some("CPU"))),
    KvEvent::Stored(StoredEvent {
      block_size: 1,
      token_ids: vec![5],
      ..stored(&[5], None, Some("GPU"))
    }),
    KvEvent::Stored(StoredEvent {
      lora_id: Some(2),
      ..stored(&[6], None, Some("GPU"))
    }),
    KvEvent::Stored(StoredEvent {
      group_idx: Some(1),
      ..stored(&[7], None, Some("GPU"))
    }),
    KvEvent::Stored(StoredEvent {
      hash_bytes: Some(Box::new(crate::event::HashBytes {
        blocks: vec![vec![8; 32]],
        parent: None,
      })),
      ..stored(&[u64::from_be_bytes([8; 8])], None, Some("GPU"))
    }),
    // A layout the index fails closed on: whole, so that it fails the same way.
    KvEvent::Stored(StoredEvent {
      token_ids: vec![1],
      ..stored(&[9], None, Some("GPU"))
    }),
    KvEvent::Cleared,
    removed(&[2, 3], Some("GPU")),
    removed(&[4], Some("CPU")),
    KvEvent::Stored(stored(&[10], Some(3), Some("GPU"))),
  ];
  let batch = Batch {
    seq: 0,
    ts: 2.5,
    dp_rank: Some(1),
    events,
  };
  for format in [Format::Vllm, Format::VllmLegacy, Format::Sglang] {
    let payload = codec::encode(&batch, format);
    let whole = super::decode_batch(&payload).unwrap().batch;
    let c = super::decode_batch_chunk(&payload).unwrap();
    assert_eq!((c.ts, c.dp_rank), (2.5, Some(1)));
    let views: Vec<EventRef<'_>> = c.chunk.iter().collect();
    let events: Vec<KvEvent> = views.iter().map(|e| e.to_event()).collect();
    assert_eq!(events, whole.events, "{format:?}");
    same_bytes(&views, &whole);
    // (SGLang's structs carry fewer fields, so fewer of its events differ.)
    let expected = match format {
      Format::Vllm => vec![
        true, true, false, false, false, false, false, false, true, true, false, true,
      ],
      // Legacy tagged arrays are read whole.
      Format::VllmLegacy => vec![
        false, false, false, false, false, false, false, false, true, false, false, false,
      ],
      _ => continue,
    };
    assert_eq!(in_columns(&c.chunk), expected, "{format:?}");
  }
  // vLLM sets the cache group on every event, and one nil extra key per block on every stored
  // one: both are the chunk's attributes.
  let group = |e: KvEvent| match e {
    KvEvent::Stored(s) => KvEvent::Stored(StoredEvent {
      group_idx: Some(0),
      extra_keys: Some(Value::Array(vec![Value::Nil; s.block_hashes.len()])),
      ..s
    }),
    KvEvent::Removed(r) => KvEvent::Removed(RemovedEvent {
      group_idx: Some(0),
      ..r
    }),
    e => e,
  };
  let grouped = Batch {
    events: vec![
      group(removed(&[1], Some("GPU"))),
      group(KvEvent::Stored(stored(&[2, 3], None, Some("GPU")))),
      group(KvEvent::Stored(stored(&[4], Some(3), Some("GPU")))),
      KvEvent::Stored(stored(&[5], Some(4), Some("GPU"))),
      group(removed(&[2], Some("GPU"))),
    ],
    ..batch
  };
  let payload = codec::encode(&grouped, Format::Vllm);
  let c = super::decode_batch_chunk(&payload).unwrap();
  assert_eq!(in_columns(&c.chunk), vec![true, true, true, false, true]);
  let views: Vec<EventRef<'_>> = c.chunk.iter().collect();
  assert_eq!(
    views.iter().map(|e| e.to_event()).collect::<Vec<_>>(),
    grouped.events
  );
  same_bytes(&views, &grouped);
  // SGLang's EAGLE token pairs are read whole; a payload that does not decode gives none.
  let mut w = Writer::new();
  w.array_len(2);
  w.f64(1.0);
  w.array_len(1);
  w.map_len(5);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  w.array_len(1);
  w.uint(5);
  w.str("parent_block_hash");
  w.nil();
  w.str("token_ids");
  w.array_len(2);
  for pair in [[1u64, 2], [2, 3]] {
    w.array_len(2);
    w.uint(pair[0]);
    w.uint(pair[1]);
  }
  w.str("block_size");
  w.uint(2);
  let payload = w.into_inner();
  let c = super::decode_batch_chunk(&payload).unwrap();
  assert_eq!(in_columns(&c.chunk), vec![false]);
  assert_eq!(
    c.chunk.iter().map(|e| e.to_event()).collect::<Vec<_>>(),
    super::decode_batch(&payload).unwrap().batch.events
  );
  assert!(super::decode_batch_chunk(&payload[..payload.len() - 1]).is_none());
}

/// Bytes of vLLM 0.33.0's own structs (`KVEventBatch`, `BlockStored`, `BlockRemoved`, encoded by
/// msgspec), shaped as its `BlockPool` emits them: four one-block stores of 16 tokens with
/// `group_idx` 0 and one nil extra key each, then a removal with `group_idx` 0, rank 0.
const VLLM_0_33_BATCH: &str = concat!(
  "93cb3ff800000000000095de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739164b170",
  "6172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0010000102030405060708090a0b0c0d0e0faa62",
  "6c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f",
  "6b65797391c0a967726f75705f69647800de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368",
  "65739165b1706172656e745f626c6f636b5f6861736864a9746f6b656e5f696473dc0010101112131415161718191a1b",
  "1c1d1e1faa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa",
  "65787472615f6b65797391c0a967726f75705f69647800de000aa474797065ab426c6f636b53746f726564ac626c6f63",
  "6b5f6861736865739166b1706172656e745f626c6f636b5f6861736865a9746f6b656e5f696473dc0010202122232425",
  "262728292a2b2c2d2e2faa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f",
  "6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800de000aa474797065ab426c6f636b53746f7265",
  "64ac626c6f636b5f6861736865739167b1706172656e745f626c6f636b5f6861736866a9746f6b656e5f696473dc0010",
  "303132333435363738393a3b3c3d3e3faa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055",
  "a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f6964780084a474797065ac426c6f636b52",
  "656d6f766564ac626c6f636b5f6861736865739164a66d656469756da3475055a967726f75705f6964780000",
);

/// What vLLM's block pool publishes goes into columns whole, and comes back out byte for byte.
#[test]
fn vllm_block_pool_events_are_read_into_columns_and_written_back_the_same() {
  let payload: Vec<u8> = (0..VLLM_0_33_BATCH.len())
    .step_by(2)
    .map(|i| u8::from_str_radix(&VLLM_0_33_BATCH[i..i + 2], 16).unwrap())
    .collect();
  let c = super::decode_batch_chunk(&payload).unwrap();
  assert_eq!(in_columns(&c.chunk), vec![true; 5]);
  let views: Vec<EventRef<'_>> = c.chunk.iter().collect();
  assert_eq!(
    codec::encode_events(0, c.ts, &views, c.dp_rank, Format::Vllm),
    payload
  );
}
