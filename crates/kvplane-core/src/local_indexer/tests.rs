//! LocalIndexer: apply, publish, replay and recovery together.

use super::*;
use crate::chunk::EventChunk;
use crate::codec::{self, Dialect};
use crate::columns::Columns;
use crate::event::{Batch, MAX_BATCH_EVENTS};
use crate::event::{KvEvent, StoredEvent};
use crate::stream::queue::EventQueue;
use crate::stream::{Cursor, Recovery};

fn stored(hashes: &[u64], parent: Option<u64>) -> KvEvent {
  KvEvent::Stored(StoredEvent {
    block_hashes: hashes.to_vec(),
    parent_block_hash: parent,
    token_ids: hashes.iter().flat_map(|h| [*h as u32, 7]).collect(),
    block_size: 2,
    ..Default::default()
  })
}

fn batch(events: Vec<KvEvent>) -> Batch {
  Batch {
    seq: 0,
    ts: 1.0,
    dp_rank: Some(0),
    events,
  }
}

fn indexer(buffer_steps: usize) -> LocalIndexer {
  LocalIndexer::new(LocalIndexerConfig {
    stream: StreamConfig {
      buffer_steps,
      epoch: 42,
      ..Default::default()
    },
    ..Default::default()
  })
  .unwrap()
}

#[test]
fn answers_events_from_the_log_and_a_tree_dump_before_it() {
  let mut ix = indexer(3);
  ix.apply_batch(batch(vec![stored(&[1, 2], None)])).unwrap();
  for i in 0..4u64 {
    ix.apply_batch(batch(vec![stored(&[10 + i], Some(2))]))
      .unwrap();
  }
  assert_eq!((ix.last_seq(), ix.stream().oldest_seq()), (5, Some(3)));
  match ix.get_events(Some(4), None) {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
      next_start: None,
    } => {
      assert_eq!(
        batches.iter().map(|b| b.seq).collect::<Vec<_>>(),
        vec![4, 5]
      );
      assert_eq!((last_seq, epoch), (5, 42));
    }
    other => panic!("{other:?}"),
  }
  match ix.get_events(Some(3), Some(3)) {
    Recovery::Events { batches, .. } => assert_eq!(batches.len(), 1),
    other => panic!("{other:?}"),
  }
  for start in [None, Some(1), Some(2)] {
    match ix.get_events(start, None) {
      Recovery::TreeDump {
        workers, last_seq, ..
      } => {
        assert_eq!(last_seq, 5);
        // Parents before children: the root segment [1, 2] first, then the 4 children.
        let events = &workers[0].events;
        assert_eq!(events[0].block_hashes, vec![1, 2]);
        assert_eq!(events.len(), 5);
        assert!(events[1..].iter().all(|e| e.parent_block_hash == Some(2)));
      }
      other => panic!("{other:?}"),
    }
  }
  assert!(matches!(
    ix.get_events(Some(6), None),
    Recovery::TooNew { last_seq: 5, .. }
  ));
  assert!(matches!(
    ix.get_events(Some(5), Some(4)),
    Recovery::InvalidRange { .. }
  ));
}

#[test]
fn requires_a_dense_seq_and_bounded_batches() {
  let mut ix = indexer(10);
  assert_eq!(ix.apply_batch(batch(vec![])).unwrap().seq, 1);
  let mut b = batch(vec![]);
  b.seq = 5;
  assert_eq!(
    ix.apply_batch(b).unwrap_err().code,
    crate::ErrorCode::InvalidArg
  );
  let big = batch(vec![KvEvent::Cleared; MAX_BATCH_EVENTS + 1]);
  assert_eq!(
    ix.apply_batch(big).unwrap_err().code,
    crate::ErrorCode::InvalidArg
  );
  let mut neg = batch(vec![]);
  neg.dp_rank = Some(-1);
  assert!(ix.apply_batch(neg).is_err());
  assert_eq!(ix.last_seq(), 1);
}

#[test]
fn fails_closed_on_an_unsupported_layout() {
  let mut ix = indexer(10);
  ix.apply_batch(batch(vec![stored(&[1, 2], None)])).unwrap();
  let partial = KvEvent::Stored(StoredEvent {
    block_hashes: vec![3],
    parent_block_hash: Some(2),
    token_ids: vec![1, 2, 3],
    block_size: 2,
    ..Default::default()
  });
  let report = ix.apply_batch(batch(vec![partial])).unwrap();
  assert_eq!(report.errors[0].code, crate::ErrorCode::UnsupportedLayout);
  assert!(report.errors[0]
    .message
    .starts_with("Unsupported BlockStored layout"));
  let w = WorkerKey {
    worker_id: 0,
    dp_rank: 0,
  };
  assert_eq!(
    ix.index().worker_blocks(w),
    0,
    "the worker's state is cleared"
  );
  assert!(ix.index().needs_recovery(w));
  let logged = ix.stream().replay(2, 1);
  let b = codec::zmq_msgpack::decode_batch(&logged[0].payload)
    .unwrap()
    .batch;
  assert_eq!(
    b.events,
    vec![KvEvent::Cleared],
    "published as a clear of the rank"
  );
}

#[test]
fn publishes_bounded_batches_encoded_once_and_replays_them() {
  let mut ix = indexer(100);
  let events: Vec<KvEvent> = (0..2050u64).map(|h| stored(&[h + 1], None)).collect();
  let reports = ix.publish(events, 2.5, Some(1)).unwrap();
  assert_eq!(
    reports.iter().map(|r| r.seq).collect::<Vec<_>>(),
    vec![1, 2, 3]
  );
  let decoded = codec::decode(reports[2].encodings.logged(), Dialect::Vllm).unwrap();
  assert_eq!(decoded.batches[0].events.len(), 2);
  assert_eq!(decoded.batches[0].dp_rank, Some(1));
  let replayed = ix.stream().replay(2, 10);
  assert_eq!(
    replayed.iter().map(|l| l.seq).collect::<Vec<_>>(),
    vec![2, 3]
  );
  assert_eq!(&replayed[1].payload, reports[2].encodings.logged());
  assert_eq!(ix.stream().replay(1, 1).len(), 1);
  assert!(ix.stream().replay(4, 10).is_empty());
  match ix.get_events(Some(3), None) {
    Recovery::Events { batches, .. } => {
      assert_eq!((batches[0].seq, batches[0].ts), (3, 2.5));
      assert_eq!(batches[0].events, decoded.batches[0].events);
    }
    other => panic!("{other:?}"),
  }
}

#[test]
fn the_proto_stream_is_encoded_once_per_batch_and_replays_to_the_same_bytes() {
  let mut ix = indexer(100);
  let first = ix.publish(vec![stored(&[1], None)], 1.0, Some(0)).unwrap();
  assert!(
    first[0].encodings.get(Format::SmgProto).is_none(),
    "off by default"
  );
  ix.set_format(Format::SmgProto, true);
  let mut events = vec![stored(&[2, 3], Some(1)), KvEvent::Cleared];
  events.push(KvEvent::Removed(crate::event::RemovedEvent {
    block_hashes: vec![3],
    ..Default::default()
  }));
  let live = ix.publish(events, 3.5, Some(0)).unwrap();
  let proto = live[0].encodings.get(Format::SmgProto).unwrap().clone();
  let decoded = codec::decode(&proto, Dialect::SmgProto).unwrap();
  let b = &decoded.batches[0];
  assert_eq!(
    (b.seq, b.ts, b.dp_rank, b.events.len()),
    (2, 3.5, Some(0), 3)
  );
  let replayed = ix.stream().replay_as(1, 10, Format::SmgProto);
  assert_eq!(
    replayed.iter().map(|l| l.seq).collect::<Vec<_>>(),
    vec![1, 2]
  );
  assert_eq!(&replayed[1].payload[..], &proto[..]);
  let seq1 = codec::decode(&replayed[0].payload, Dialect::SmgProto).unwrap();
  assert_eq!(seq1.batches[0].seq, 1);
  assert_eq!(
    &ix.stream().replay_as(2, 1, Format::Vllm)[0].payload,
    live[0].encodings.logged()
  );
}

#[test]
fn subscription_cursors_replay_within_the_log_and_expire_outside_it() {
  let mut ix = indexer(3);
  assert_eq!(ix.stream().cursor(0), Cursor::Live);
  assert_eq!(
    ix.stream().cursor(1),
    Cursor::Replay(1),
    "nothing published yet: 1 is next"
  );
  let expired = |requested, oldest| Cursor::Expired { requested, oldest };
  assert_eq!(ix.stream().cursor(2), expired(2, 1));
  for h in 1..=5u64 {
    ix.apply_batch(batch(vec![stored(&[h], None)])).unwrap();
  }
  // Log holds 3..=5.
  assert_eq!(ix.stream().cursor(2), expired(2, 3));
  assert_eq!(ix.stream().cursor(3), Cursor::Replay(3));
  assert_eq!(ix.stream().cursor(6), Cursor::Replay(6));
  assert_eq!(
    ix.stream().cursor(7),
    expired(7, 3),
    "a cursor of another epoch"
  );
  ix.skip_seq();
  assert_eq!(
    ix.stream().cursor(5),
    expired(5, 7),
    "the log restarts after a gap"
  );
  assert_eq!(ix.stream().cursor(7), Cursor::Replay(7));
  assert_eq!(
    crate::codec::smg::expired_cursor_message(5, 7),
    "expired KV event replay cursor: requested sequence 5, oldest available sequence 7"
  );
}

#[test]
fn a_stream_from_a_later_first_seq_expires_every_earlier_cursor() {
  let cfg = |first_seq| LocalIndexerConfig {
    stream: StreamConfig {
      first_seq,
      ..Default::default()
    },
    ..Default::default()
  };
  assert!(LocalIndexer::new(cfg(0)).is_err());
  assert!(crate::stream::clock_first_seq() > 1_700_000_000_000_000);
  let mut ix = LocalIndexer::new(cfg(1000)).unwrap();
  assert_eq!(ix.stream().last_seq(), 999);
  assert_eq!(ix.stream().cursor(1000), Cursor::Replay(1000));
  let first = ix.apply_batch(batch(vec![KvEvent::Cleared])).unwrap().seq;
  assert_eq!(first, 1000);
  ix.apply_batch(batch(vec![stored(&[1], None)])).unwrap();
  // A cursor of an earlier incarnation (below 1000) is expired, whatever its value.
  for old in [1, 7, 999] {
    assert_eq!(
      ix.stream().cursor(old),
      Cursor::Expired {
        requested: old,
        oldest: 1000
      }
    );
    assert!(matches!(
      ix.get_events(Some(old), None),
      Recovery::TreeDump { last_seq: 1001, .. }
    ));
  }
}

#[test]
fn kv_recover_answers_a_long_range_in_bounded_parts() {
  let mut ix = indexer(1000);
  let n = super::recover::RECOVER_BATCHES_PER_ANSWER as u64 * 2 + 10;
  for h in 1..=n {
    ix.apply_batch(batch(vec![stored(&[h], None)])).unwrap();
  }
  let mut start = 1;
  let mut seen = Vec::new();
  let mut parts = 0;
  loop {
    parts += 1;
    match ix.recover_query(Some(&start.to_string()), None) {
      Recovery::Events {
        batches,
        next_start,
        ..
      } => {
        assert!(batches.len() <= super::recover::RECOVER_BATCHES_PER_ANSWER);
        seen.extend(batches.iter().map(|b| b.seq));
        match next_start {
          Some(next) => start = next,
          None => break,
        }
      }
      other => panic!("expected Events, got {other:?}"),
    }
  }
  assert_eq!(parts, 3);
  assert_eq!(seen, (1..=n).collect::<Vec<_>>());
  let json = codec::recover::to_json(&ix.recover_query(Some("1"), Some("70")));
  assert!(json.contains("\"next_start\":17,\"last_seq\""), "{json}");
  // The API's get_events is not bounded.
  assert!(
    matches!(ix.get_events(Some(1), None), Recovery::Events { ref batches, next_start: None, .. } if batches.len() as u64 == n)
  );
}

#[test]
fn a_skipped_seq_is_a_gap_the_log_does_not_bridge() {
  let mut ix = indexer(100);
  ix.publish(vec![stored(&[1], None)], 1.0, None).unwrap();
  ix.skip_seq();
  let r = ix.publish(vec![stored(&[2], Some(1))], 1.0, None).unwrap();
  assert_eq!(r[0].seq, 3);
  assert_eq!(ix.stream().oldest_seq(), Some(3));
  assert!(matches!(
    ix.get_events(Some(1), None),
    Recovery::TreeDump { last_seq: 3, .. }
  ));
  // vLLM's rule: a replay from before the log starts at its oldest batch.
  assert_eq!(ix.stream().replay(1, 10)[0].seq, 3);
}

#[test]
fn logs_in_the_configured_zmq_format_only() {
  let cfg = |log_format| LocalIndexerConfig {
    stream: StreamConfig {
      log_format,
      ..Default::default()
    },
    ..Default::default()
  };
  assert!(LocalIndexer::new(cfg(Format::SmgProto)).is_err());
  let mut ix = LocalIndexer::new(cfg(Format::Sglang)).unwrap();
  let r = ix
    .publish(vec![stored(&[u64::MAX], None)], 1.0, None)
    .unwrap();
  let b = codec::zmq_msgpack::decode_batch(r[0].encodings.logged())
    .unwrap()
    .batch;
  assert_eq!(b.events, vec![stored(&[u64::MAX], None)]);
  assert!(matches!(
    ix.get_events(Some(1), None),
    Recovery::Events { .. }
  ));
}

#[test]
fn drains_a_queue_with_a_seq_gap_where_events_were_lost() {
  let mut ix = indexer(100);
  let mut q = EventQueue::new(2);
  q.push(EventChunk::from_events(vec![
    stored(&[1], None),
    stored(&[2], Some(1)),
    stored(&[3], Some(2)),
  ]));
  let d = ix.drain(&mut q, 100, 1.0, Some(0)).unwrap();
  assert_eq!((d.events, d.gaps), (2, 1));
  assert_eq!(d.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), vec![1]);
  q.push(EventChunk::from_events(vec![stored(&[4], Some(2))]));
  let d = ix.drain(&mut q, 100, 1.0, Some(0)).unwrap();
  assert_eq!(d.batches[0].seq, 3, "seq 2 stands for the lost event");
  let mut q = EventQueue::new(5000);
  q.push(EventChunk::from_events(
    (10..3010u64).map(|h| stored(&[h], None)).collect(),
  ));
  let d = ix.drain(&mut q, 2048, 1.0, None).unwrap();
  assert_eq!((d.events, d.batches.len(), q.len()), (2048, 2, 952));
}

#[test]
fn draining_columns_publishes_what_publishing_the_events_would() {
  let hashes: Vec<u64> = (1..=1500).collect();
  let parents: Vec<u64> = (0..1500).collect();
  let has_parent: Vec<u8> = (0..1500).map(|i| u8::from(i % 7 != 0)).collect();
  let tokens: Vec<u32> = (0..3000).collect();
  let stores = Columns {
    kinds: &[0; 1500],
    hash_counts: &[1; 1500],
    hashes: &hashes,
    parents: &parents,
    has_parent: &has_parent,
    tokens: &tokens,
    block_size: 2,
    medium: Some("GPU"),
    lora_id: None,
    lora_name: None,
  };
  let removes = Columns {
    kinds: &[1, 1, 2, 1],
    hash_counts: &[2, 1, 0, 1],
    hashes: &[5, 6, 9999, 3],
    parents: &[0; 4],
    has_parent: &[0; 4],
    tokens: &[],
    ..stores
  };
  let partial = KvEvent::Stored(StoredEvent {
    block_hashes: vec![77],
    token_ids: vec![1],
    block_size: 2,
    ..Default::default()
  });
  let chunks = [
    EventChunk::from_columns(&stores).unwrap(),
    EventChunk::from_events(vec![stored(&[4000], Some(10)), partial]),
    EventChunk::from_columns(&removes).unwrap(),
    EventChunk::from_events(vec![stored(&[4001], None)]),
  ];
  let events: Vec<KvEvent> = chunks
    .iter()
    .flat_map(|c| c.iter().map(|e| e.to_event()))
    .collect();
  for proto in [false, true] {
    let mut by_events = indexer(100);
    by_events.set_format(Format::SmgProto, proto);
    let want = by_events.publish(events.clone(), 2.5, Some(1)).unwrap();
    let mut by_queue = indexer(100);
    by_queue.set_format(Format::SmgProto, proto);
    let mut q = EventQueue::new(10_000);
    for c in chunks.iter().cloned() {
      q.push(c);
    }
    let got = by_queue.drain(&mut q, 10_000, 2.5, Some(1)).unwrap();
    assert_eq!(
      (got.events, got.gaps, got.batches.len()),
      (events.len(), 0, 2)
    );
    for (g, w) in got.batches.iter().zip(&want) {
      assert_eq!(g.seq, w.seq);
      assert_eq!(g.encodings.logged(), w.encodings.logged());
      assert_eq!(
        g.encodings.get(Format::SmgProto),
        w.encodings.get(Format::SmgProto)
      );
      assert_eq!(g.errors.len(), w.errors.len());
    }
    assert_eq!(
      got.batches[1].errors.len(),
      1,
      "the partial block failed closed"
    );
    assert_eq!(by_queue.index().dump(), by_events.index().dump());
    assert_eq!(by_queue.index().stats(), by_events.index().stats());
  }
  // Columns applied where they lie publish what the same columns queued as a chunk do.
  let mut in_place = indexer(100);
  let mut chunked = indexer(100);
  for cols in [&stores, &removes] {
    let got = in_place.publish_columns(cols, 2.5, Some(1)).unwrap();
    let want = chunked
      .publish_chunk(EventChunk::from_columns(cols).unwrap(), 2.5, Some(1))
      .unwrap();
    assert_eq!(got.events, want.events);
    let pairs = got.batches.iter().zip(&want.batches);
    assert!(pairs
      .clone()
      .all(|(g, w)| (g.seq, g.encodings.logged()) == (w.seq, w.encodings.logged())));
    assert_eq!(got.batches.len(), want.batches.len());
  }
  assert_eq!(in_place.index().stats(), chunked.index().stats());
  let bad = Columns {
    tokens: &tokens[1..],
    ..stores
  };
  let err = in_place.publish_columns(&bad, 2.5, Some(1)).unwrap_err();
  assert_eq!(err.code, crate::ErrorCode::InvalidArg);
  assert_eq!(in_place.last_seq(), chunked.last_seq());
}

#[test]
fn malformed_recover_parameters_are_an_invalid_range() {
  let mut ix = indexer(10);
  ix.publish(vec![stored(&[1], None)], 1.0, None).unwrap();
  for (s, e) in [
    (Some("x"), None),
    (Some("1"), Some("-2")),
    (Some("+1"), None),
    (Some(""), None),
  ] {
    assert!(
      matches!(ix.recover_query(s, e), Recovery::InvalidRange { .. }),
      "{s:?} {e:?}"
    );
  }
  assert!(matches!(
    ix.recover_query(Some("1"), None),
    Recovery::Events { .. }
  ));
  assert!(matches!(
    ix.recover_query(None, None),
    Recovery::TreeDump { .. }
  ));
  assert!(matches!(
    ix.recover_query(Some("18446744073709551615"), None),
    Recovery::TooNew { .. }
  ));
}

#[test]
fn answers_encoded_in_chunks_join_to_the_whole_answer() {
  let mut ix = indexer(8);
  for h in 1..=40u64 {
    let parent = (h > 1 && h % 5 != 1).then(|| h - 1);
    ix.apply_batch(batch(vec![stored(&[h], parent)])).unwrap();
  }
  let answers = [
    ix.get_events(Some(35), None),
    ix.tree_dump(),
    ix.get_events(Some(99), None),
    ix.recover_query(Some("x"), None),
    ix.recover_query(Some("36"), Some("37")),
  ];
  let Recovery::TreeDump { workers, .. } = &answers[1] else {
    panic!("expected a TreeDump")
  };
  let dumped = workers[0].events.len();
  assert_eq!(
    workers[0]
      .events
      .iter()
      .map(|e| e.block_hashes.len())
      .sum::<usize>(),
    40
  );
  for answer in &answers {
    for msgpack in [false, true] {
      let whole = if msgpack {
        codec::recover::to_msgpack(answer)
      } else {
        codec::recover::to_json(answer).into_bytes()
      };
      for target in [1, 7, 100] {
        let mut cursor = codec::recover::AnswerCursor::new(msgpack);
        let mut joined = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = cursor.next_chunk(answer, target) {
          assert!(!chunk.is_empty());
          joined.extend(chunk);
          chunks += 1;
        }
        assert_eq!(joined, whole, "{} target {target}", answer.kind());
        if matches!(answer, Recovery::TreeDump { .. }) {
          assert!(chunks > dumped, "{chunks} chunks");
        }
      }
    }
  }
  let json = codec::recover::to_json(&answers[1]);
  assert!(
    json.starts_with("{\"TreeDump\":{\"workers\":[{\"worker_id\":"),
    "{json}"
  );
  assert!(json.contains("]}],\"last_seq\":40,\"epoch\":"), "{json}");
  assert_eq!(json.matches("\"type\":\"BlockStored\"").count(), dumped);
}

#[test]
fn relays_waiting_engine_batches_as_one_under_the_first_timestamp() {
  let mut ix = indexer(100);
  let payload = |ts: f64, events: Vec<KvEvent>| {
    let b = Batch {
      seq: 0,
      ts,
      dp_rank: None,
      events,
    };
    codec::encode(&b, codec::Format::Vllm)
  };
  let p1 = payload(1.0, vec![stored(&[1, 2], None)]);
  let p2 = payload(2.0, vec![stored(&[3], Some(2)), stored(&[4], Some(3))]);
  let p3 = payload(3.0, vec![KvEvent::Removed(Default::default())]);
  let out = ix
    .relay_coalesced(&[&p1, &p2, &p3], Dialect::Vllm, Some(1))
    .unwrap();
  assert_eq!((out.events, out.batches.len()), (4, 1));
  let b = &codec::decode(out.batches[0].encodings.logged(), Dialect::Vllm)
    .unwrap()
    .batches[0];
  assert_eq!((b.ts, b.dp_rank, b.events.len()), (1.0, Some(1), 4));
  assert_eq!(
    &b.events[..3],
    &[
      stored(&[1, 2], None),
      stored(&[3], Some(2)),
      stored(&[4], Some(3))
    ]
  );

  // One payload that does not decode: nothing is published, and the error names it.
  let err = ix
    .relay_coalesced(&[&p1, b"\x93\x01", &p2], Dialect::Vllm, Some(1))
    .unwrap_err();
  assert!(err.message.starts_with("payload 1: "), "{}", err.message);
  assert_eq!(ix.last_seq(), 1);

  // 1024 events a batch at most; batches naming different ranks (relayed under their own, as
  // TensorRT-LLM's) stay apart.
  let many: Vec<KvEvent> = (0..700u64).map(|h| stored(&[100 + h], None)).collect();
  let big = payload(4.0, many);
  let out = ix
    .relay_coalesced(&[&big, &big], Dialect::Vllm, Some(0))
    .unwrap();
  assert_eq!(
    out.batches.iter().map(|r| r.seq).collect::<Vec<_>>(),
    vec![2, 3]
  );
  let ranked = |rank: i32| {
    let b = Batch {
      seq: 0,
      ts: 5.0,
      dp_rank: Some(rank),
      events: vec![stored(&[900 + rank as u64], None)],
    };
    codec::encode(&b, codec::Format::Vllm)
  };
  let (r5, r6) = (ranked(5), ranked(6));
  let out = ix
    .relay_coalesced(&[&r5, &r5, &r6], Dialect::Vllm, None)
    .unwrap();
  assert_eq!((out.events, out.batches.len()), (3, 2));
}

#[test]
fn the_live_tap_sees_every_logged_batch_in_seq_order_and_deferred_batches_come_first() {
  use std::sync::{Arc, Mutex};
  type Logged = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
  struct Tap(Logged);
  impl LiveTap for Tap {
    fn logged(&mut self, seq: u64, payload: &crate::stream::log::Payload) {
      self.0.lock().unwrap().push((seq, payload.to_vec()));
    }
  }
  let seen = Arc::new(Mutex::new(Vec::new()));
  let mut ix = indexer(100);
  let first = ix.apply_batch(batch(vec![stored(&[1], None)])).unwrap().seq;
  ix.set_live_tap(Some(Box::new(Tap(seen.clone()))));
  let p = codec::encode(&batch(vec![stored(&[2], Some(1))]), codec::Format::Vllm);
  // Published off the owner's thread: kept for it.
  let linked = ix.relay_encoded(&p, Dialect::Vllm, Some(0)).unwrap();
  ix.defer(linked);
  // The owner's next call reports the deferred batch before its own.
  let own = ix.clear_rank(Some(0), 2.0).unwrap();
  let out = ix.after_deferred(own);
  let seqs: Vec<u64> = out.batches.iter().map(|b| b.seq).collect();
  assert_eq!(seqs, vec![first + 1, first + 2]);
  assert_eq!(out.events, 2);
  assert_eq!(ix.take_deferred().batches.len(), 0);
  // The tap saw both as logged, in order, byte for byte.
  let tapped = seen.lock().unwrap().clone();
  assert_eq!(
    tapped,
    out
      .batches
      .iter()
      .map(|b| (b.seq, b.encodings.logged().to_vec()))
      .collect::<Vec<_>>()
  );
  ix.set_live_tap(None);
  ix.apply_batch(batch(vec![stored(&[3], Some(2))])).unwrap();
  assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn a_format_taken_up_or_dropped_while_batches_wait_gives_every_batch_in_it_in_order() {
  use crate::codec::Format;
  let mut ix = indexer(100);
  let relayed = |ix: &mut LocalIndexer, hashes: &[u64], parent: Option<u64>| {
    let p = codec::encode(&batch(vec![stored(hashes, parent)]), Format::Vllm);
    let d = ix.relay_encoded(&p, Dialect::Vllm, Some(0)).unwrap();
    ix.defer(d);
  };
  // Waiting in the outbox: one batch from before gRPC's format was taken up, one after it, one
  // after it was dropped again.
  relayed(&mut ix, &[1], None);
  ix.set_format(Format::SmgProto, true);
  relayed(&mut ix, &[2], Some(1));
  let encoded_with_it = ix.stream().replay_as(ix.last_seq(), 1, Format::SmgProto);
  ix.set_format(Format::SmgProto, false);
  relayed(&mut ix, &[3], Some(2));
  let d = ix.take_deferred();
  let seqs: Vec<u64> = d.batches.iter().map(|b| b.seq).collect();
  assert_eq!(
    d.batches[1].encodings.get(Format::SmgProto),
    Some(&encoded_with_it[0].payload),
    "a re-encoded batch has the bytes it was published with"
  );
  let replayed = |f: Format| -> Vec<Vec<u8>> {
    seqs
      .iter()
      .map(|&s| ix.stream().replay_as(s, 1, f)[0].payload.to_vec())
      .collect()
  };
  let (vllm, smg) = (replayed(Format::Vllm), replayed(Format::SmgProto));
  let bytes =
    |ps: &Vec<crate::stream::log::Payload>| ps.iter().map(|p| p.to_vec()).collect::<Vec<_>>();

  // Asked for by name: every batch, in seq order, each its own bytes.
  let out = d
    .clone()
    .into_payloads(Some(&[Format::SmgProto, Format::Vllm, Format::SmgProto]));
  assert_eq!(
    out.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
    [Format::SmgProto, Format::Vllm]
  );
  assert_eq!(bytes(&out[0].1), smg);
  assert_eq!(bytes(&out[1].1), vllm);
  // Every format any batch carries.
  let all = d.clone().into_payloads(None);
  assert_eq!(
    all.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
    [Format::Vllm, Format::SmgProto]
  );
  assert_eq!(bytes(&all[1].1), smg);
  // Nothing for no batches.
  assert!(Drained::default()
    .into_payloads(Some(&[Format::Vllm]))
    .is_empty());
}
