use super::*;
use crate::chunk::EventChunk;
use crate::columns::Columns;
use crate::event::{Batch, EventRef, KvEvent};

#[test]
fn subscribe_requests_round_trip_and_skip_unknown_fields() {
  for start in [0, 1, 300, u64::MAX] {
    assert_eq!(
      decode_subscribe_request(&encode_subscribe_request(start))
        .unwrap()
        .start,
      start
    );
  }
  assert!(encode_subscribe_request(0).is_empty());
  // start 5 plus `load_records_before_first_batch = true` (field 2), and a newer field 9.
  assert_eq!(
    decode_subscribe_request(&[0x08, 5, 0x10, 1, 0x48, 7]).unwrap(),
    SubscribeRequest {
      start: 5,
      load_records_early: true
    }
  );
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
  let std = f("grpc.health.v1.Health");
  assert_eq!(encode_health_response(std, true, "ignored"), [0x08, 1]);
  assert_eq!(encode_health_response(std, false, "ignored"), [0x08, 2]);
  assert!(HealthForm::of_service("other.Service").is_err());
}

/// A `SchedulerLoad` as SGLang's servicer answers `GetLoads`, by hand.
fn scheduler_load(rank: i32, running: u64, usage: f64, memory: bool) -> Vec<u8> {
  use crate::codec::protobuf::{put_key, put_len_delimited, put_varint, I64, VARINT};
  let mut l = Vec::new();
  if rank != 0 {
    put_key(&mut l, 1, VARINT);
    put_varint(&mut l, rank as u64);
  }
  put_key(&mut l, 2, VARINT);
  put_varint(&mut l, running);
  put_key(&mut l, 3, VARINT);
  put_varint(&mut l, 4);
  put_key(&mut l, 5, VARINT);
  put_varint(&mut l, 4096);
  put_key(&mut l, 7, I64);
  l.extend_from_slice(&usage.to_le_bytes());
  put_key(&mut l, 11, VARINT);
  put_varint(&mut l, 256);
  if memory {
    // MemoryMetrics { weight_gb: 1.5, token_capacity: 7 }
    put_len_delimited(&mut l, 12, |m| {
      put_key(m, 1, I64);
      m.extend_from_slice(&1.5f64.to_le_bytes());
      put_key(m, 4, VARINT);
      put_varint(m, 7);
    });
  }
  put_key(&mut l, 17, VARINT);
  put_varint(&mut l, 900);
  l
}

#[test]
fn get_loads_answers_become_each_batch_s_load_record_and_load_only_batches() {
  use crate::codec::protobuf::put_len_delimited;
  let mut answer = Vec::new();
  put_len_delimited(&mut answer, 1, |o| {
    o.extend_from_slice(b"2026-11-25T00:00:00Z")
  });
  put_len_delimited(&mut answer, 4, |o| {
    o.extend_from_slice(&scheduler_load(0, 3, 0.25, true))
  });
  put_len_delimited(&mut answer, 4, |o| {
    o.extend_from_slice(&scheduler_load(1, 9, 0.5, false))
  });
  let loads = EngineLoads::decode(&answer, &SGLANG_LOADS).unwrap();
  assert_eq!(loads.ranks(), vec![0, 1]);
  assert_eq!(get_loads_request(), b"\x12\x03all");

  // A batch of rank 1 gets rank 1's record; its events and fields stay as they were.
  let batch = Batch {
    seq: 7,
    ts: 2.0,
    dp_rank: Some(1),
    events: vec![KvEvent::Cleared],
  };
  let enc = |b: &Batch| {
    let mut out = Vec::new();
    encode_batch(
      b.seq,
      b.ts,
      b.dp_rank,
      b.events.iter().map(EventRef::of),
      &mut out,
    );
    out
  };
  let bytes = enc(&batch);
  let opts = RecordOpts {
    sample: 3,
    age_ms: 40,
    load_only: false,
    telemetry: false,
  };
  let with = loads.attach(&bytes, opts).unwrap();
  assert_eq!(&with[..bytes.len()], &bytes[..]);
  assert_eq!(decode_batch(&with).unwrap().batch, batch);
  // EngineLoad { running 9, waiting 4, waiting_uncached 900, token_usage 0.5,
  // max_running 256, age_ms 40, sample 3 }: field 8 of the batch.
  let mut want = vec![0x42, 0];
  want.extend_from_slice(&[0x08, 9, 0x10, 4, 0x18, 0x84, 0x07, 0x21]);
  want.extend_from_slice(&0.5f64.to_le_bytes());
  want.extend_from_slice(&[0x30, 0x80, 0x02, 0x38, 40, 0x40, 3]);
  want[1] = (want.len() - 2) as u8;
  assert_eq!(&with[bytes.len()..], &want[..]);
  // A rank the answer does not cover: no record.
  let other = enc(&Batch {
    dp_rank: Some(5),
    ..batch.clone()
  });
  assert_eq!(loads.attach(&other, opts).unwrap(), other);

  // Load-only batches: one per rank, the last seq repeated, no events, with the telemetry
  // (rank 0's used tokens and its memory section copied through as field 13).
  let only = loads.load_only(
    7,
    3.0,
    RecordOpts {
      telemetry: true,
      ..opts
    },
  );
  assert_eq!(only.len(), 2);
  let d = decode_batch(&only[0]).unwrap().batch;
  assert_eq!((d.seq, d.dp_rank, d.events.len()), (7, Some(0), 0));
  let tail = &only[0][only[0].len() - 13..];
  assert_eq!(tail[0], 0x6a, "EngineLoad.memory (13) ends the record");
  assert!(only[0].windows(2).any(|w| w == [0x48, 1]), "load_only set");
  assert!(
    only[0].windows(3).any(|w| w == [0x58, 0x80, 0x20]),
    "num_used_tokens 4096"
  );
}
