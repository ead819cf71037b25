use super::*;
use crate::chunk::EventChunk;
use crate::columns::Columns;
use crate::event::{Batch, EventRef, KvEvent};

#[test]
fn subscribe_requests_round_trip_and_skip_unknown_fields() {
  for start in [0, 1, 300, u64::MAX] {
    assert_eq!(
      decode_subscribe_request(&encode_subscribe_request(start)).unwrap(),
      start
    );
  }
  assert!(encode_subscribe_request(0).is_empty());
  // start 5 plus `load_records_before_first_batch = true` (field 2).
  assert_eq!(decode_subscribe_request(&[0x08, 5, 0x10, 1]).unwrap(), 5);
  assert!(decode_subscribe_request(&[0x08]).is_err());
  assert!(
    decode_subscribe_request(&[0x0a, 1, 0]).is_err(),
    "field 1 must be a varint"
  );
}

#[test]
fn long_fields_get_multi_byte_length_prefixes_and_columns_encode_as_events_do() {
  // Events of 1, 20 and 300 blocks: bodies under 128 bytes, over 128 and over 16 KiB.
  for blocks in [1usize, 20, 300] {
    let hashes: Vec<u64> = (0..blocks as u64).map(|i| u64::MAX - i).collect();
    let tokens: Vec<u32> = (0..blocks as u32 * 16).map(|t| t * 4099).collect();
    let cols = Columns {
      kinds: &[0, 1],
      hash_counts: &[blocks as u32, blocks as u32],
      hashes: &[hashes.clone(), hashes.clone()].concat(),
      parents: &[42, 0],
      has_parent: &[1, 0],
      tokens: &tokens,
      block_size: 16,
      medium: Some("cpu"),
      lora_id: Some(3),
      lora_name: Some("a"),
    };
    let chunk = EventChunk::from_columns(&cols).unwrap();
    let refs: Vec<EventRef<'_>> = chunk.iter().collect();
    let batch = Batch {
      seq: 9,
      ts: 1.5,
      dp_rank: Some(2),
      events: refs.iter().map(EventRef::to_event).collect(),
    };
    let owned = batch.events.iter().map(EventRef::of);
    let (mut by_events, mut by_refs) = (Vec::new(), Vec::new());
    encode_batch(batch.seq, batch.ts, batch.dp_rank, owned, &mut by_events);
    encode_batch(9, 1.5, Some(2), refs.iter().copied(), &mut by_refs);
    assert_eq!(by_refs, by_events, "{blocks} blocks");
    let back = decode_batch(&by_refs).unwrap().batch;
    assert_eq!((back.seq, back.dp_rank), (9, Some(2)));
    match (&back.events[0], &batch.events[0]) {
      (KvEvent::Stored(got), KvEvent::Stored(want)) => {
        assert_eq!(got.block_hashes, want.block_hashes);
        assert_eq!(got.token_ids, want.token_ids);
        assert_eq!(got.parent_block_hash, Some(42));
        assert_eq!(got.lora_name.as_deref(), Some("a"));
      }
      other => panic!("{other:?}"),
    }
    match &back.events[1] {
      KvEvent::Removed(r) => assert_eq!(r.block_hashes, hashes),
      other => panic!("{other:?}"),
    }
  }
  assert_eq!(cache_level_of_medium(Some("cpu_Tier2")), Some(2));
  assert_eq!(cache_level_of_medium(Some("tape")), None);
  assert_eq!(locality_enum(Some("Remote")), Some(2));
}

#[test]
fn refuses_truncated_and_overlong_input() {
  assert!(decode_batch(&[0x1a, 0x05, 0x08]).is_err());
  assert!(decode_batch(&[0x08; 11]).is_err());
  assert!(
    decode_batch(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err()
  );
}

#[test]
fn health_responses_take_each_engines_shape() {
  let f = |s: &str| HealthForm::of_service(s).unwrap();
  let vllm = f("vllm.grpc.engine.VllmEngine");
  assert_eq!(encode_health_response(vllm, true, ""), [0x08, 0x01]);
  assert_eq!(
    encode_health_response(vllm, false, "down"),
    [0x12, 4, b'd', b'o', b'w', b'n']
  );
  let trt = f("trtllm.TrtllmService");
  assert_eq!(
    encode_health_response(trt, true, "ignored"),
    [0x0a, 2, b'O', b'K']
  );
  assert_eq!(encode_health_response(trt, false, "x"), [0x0a, 1, b'x']);
  assert_eq!(
    f("sglang.grpc.scheduler.SglangScheduler"),
    HealthForm::HealthyMessage
  );
  assert_eq!(
    f("tokenspeed.grpc.scheduler.TokenSpeedScheduler"),
    HealthForm::HealthyMessage
  );
  assert!(HealthForm::of_service("other.Service").is_err());
}
