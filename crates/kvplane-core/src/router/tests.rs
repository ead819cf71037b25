use super::*;
use crate::codec::value::Value;
use crate::codec::{encode_events, Format};
use crate::event::{EventRef, RemovedEvent};
use crate::index::DropReason;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

const BS: u32 = 4;

fn stored(hashes: &[u64], parent: Option<u64>, first_token: u32, medium: &str) -> KvEvent {
  let n = hashes.len() as u32 * BS;
  KvEvent::Stored(StoredEvent {
    block_hashes: hashes.to_vec(),
    parent_block_hash: parent,
    token_ids: (first_token..first_token + n).collect(),
    block_size: BS,
    medium: Some(medium.to_string()),
    ..Default::default()
  })
}

fn w(worker_id: u64, dp_rank: u32) -> WorkerKey {
  WorkerKey { worker_id, dp_rank }
}

fn scores(a: &QueryAnswer) -> Vec<(u64, u32, u32, u32, u32)> {
  let mut v: Vec<_> = a
    .scores
    .iter()
    .map(|s| {
      (
        s.worker.worker_id,
        s.worker.dp_rank,
        s.device,
        s.host,
        s.disk,
      )
    })
    .collect();
  v.sort();
  v
}

#[test]
fn workers_of_many_nodes_are_scored_by_their_leading_device_blocks() {
  let mut r = RouterIndex::new(BS).unwrap();
  r.apply(w(1, 0), &stored(&[11, 12, 13], None, 0, "GPU"))
    .unwrap();
  r.apply(w(2, 3), &stored(&[21, 22], None, 0, "GPU"))
    .unwrap();
  r.apply(w(3, 0), &stored(&[31], None, 100, "GPU")).unwrap();
  let tokens: Vec<u32> = (0..14).collect();
  assert_eq!(
    scores(&r.query(&tokens, None, None)),
    vec![(1, 0, 3, 3, 3), (2, 3, 2, 2, 2)]
  );
  assert_eq!(r.query(&tokens[..3], None, None).scores, vec![]);
}

#[test]
fn content_keys_are_dynamos_block_hashes_chained() {
  let r = RouterIndex::new(BS).unwrap();
  // Values Dynamo's standalone indexer 1.6.1 reports as `tokens_hash` for these blocks.
  assert_eq!(
    r.request_keys(&[1, 2, 3, 4], None, None),
    vec![14643705804678351452]
  );
  assert_eq!(
    r.request_keys(&[11, 12, 13, 14], Some("lo"), None),
    vec![13863220705243705585]
  );
  assert_eq!(
    r.request_keys(&[21, 22, 23, 24], Some("lo"), Some("S1")),
    vec![11879884849184334892]
  );
  assert_eq!(
    r.request_keys(&[1, 2, 3, 4, 5, 6, 7, 8], None, None),
    r.keys_of_content_hashes(&[
      crate::hash::content_hash(&[1, 2, 3, 4]),
      crate::hash::content_hash(&[5, 6, 7, 8])
    ])
  );
}

#[test]
fn a_lora_or_salt_namespace_matches_only_requests_in_it_and_children_inherit_the_salt() {
  let mut r = RouterIndex::new(BS).unwrap();
  let KvEvent::Stored(mut first) = stored(&[1], None, 0, "GPU") else {
    unreachable!()
  };
  first.extra_keys = Some(Value::Array(vec![Value::Array(vec![Value::Str(format!(
    "{SALT_KEY_PREFIX}s1"
  ))])]));
  r.apply(w(1, 0), &KvEvent::Stored(first)).unwrap();
  r.apply(w(1, 0), &stored(&[2], Some(1), 4, "GPU")).unwrap();
  let KvEvent::Stored(mut lora) = stored(&[5, 6], None, 0, "GPU") else {
    unreachable!()
  };
  lora.lora_name = Some("adapter".into());
  r.apply(w(2, 0), &KvEvent::Stored(lora)).unwrap();
  let tokens: Vec<u32> = (0..8).collect();
  assert_eq!(
    scores(&r.query(&tokens, None, Some("s1"))),
    vec![(1, 0, 2, 2, 2)]
  );
  assert_eq!(
    scores(&r.query(&tokens, Some("adapter"), None)),
    vec![(2, 0, 2, 2, 2)]
  );
  assert_eq!(r.query(&tokens, None, None).scores, vec![]);
}

#[test]
fn lower_tiers_continue_the_device_run() {
  let mut r = RouterIndex::new(BS).unwrap();
  r.apply(w(1, 0), &stored(&[1, 2], None, 0, "GPU")).unwrap();
  r.apply(w(1, 0), &stored(&[3], Some(2), 8, "CPU")).unwrap();
  r.apply(w(1, 0), &stored(&[4], Some(3), 12, "DISK"))
    .unwrap();
  // Only offloaded: no device blocks.
  r.apply(w(2, 0), &stored(&[7, 8], None, 0, "CPU")).unwrap();
  let tokens: Vec<u32> = (0..17).collect();
  assert_eq!(
    scores(&r.query(&tokens, None, None)),
    vec![(1, 0, 2, 3, 4), (2, 0, 0, 2, 2)]
  );
  // Removal from the host tier shortens the continuation; a clear drops every tier.
  r.apply(
    w(1, 0),
    &KvEvent::Removed(RemovedEvent {
      block_hashes: vec![3],
      medium: Some("CPU".into()),
      ..Default::default()
    }),
  )
  .unwrap();
  assert_eq!(scores(&r.query(&tokens, None, None))[0], (1, 0, 2, 2, 2));
  r.apply(w(2, 0), &KvEvent::Cleared).unwrap();
  assert_eq!(scores(&r.query(&tokens, None, None)).len(), 1);
}

#[test]
fn an_offloaded_block_already_in_the_tier_under_another_workers_chain_continues_the_run() {
  // Worker 2 offloaded blocks 1-3 to the host; worker 1 keeps 1-2 on the device and offloads 3
  // after them, its parent on the device: the host tier has block 3 twice, in the middle of
  // worker 2's chain and as a chain of its own. In both orders both workers' host runs count it.
  for w2_first in [true, false] {
    let mut r = RouterIndex::new(BS).unwrap();
    let w1 = |r: &mut RouterIndex| {
      r.apply(w(1, 0), &stored(&[1, 2], None, 0, "GPU")).unwrap();
      r.apply(w(1, 0), &stored(&[3], Some(2), 8, "CPU")).unwrap();
    };
    let w2 = |r: &mut RouterIndex| {
      r.apply(w(2, 0), &stored(&[7, 8, 9], None, 0, "CPU"))
        .unwrap();
    };
    if w2_first {
      w2(&mut r);
      w1(&mut r);
    } else {
      w1(&mut r);
      w2(&mut r);
    }
    let tokens: Vec<u32> = (0..13).collect();
    assert_eq!(
      scores(&r.query(&tokens, None, None)),
      vec![(1, 0, 2, 3, 3), (2, 0, 0, 3, 3)],
      "worker 2 first: {w2_first}"
    );
  }
}

#[test]
fn foreign_media_block_sizes_and_remote_blocks_are_counted_not_indexed() {
  let mut r = RouterIndex::new(BS).unwrap();
  r.apply(w(1, 0), &stored(&[1], None, 0, "gpu")).unwrap();
  let KvEvent::Stored(mut big) = stored(&[2], None, 0, "GPU") else {
    unreachable!()
  };
  big.block_size = 2;
  big.token_ids.truncate(2);
  r.apply(w(1, 0), &KvEvent::Stored(big)).unwrap();
  let KvEvent::Stored(mut remote) = stored(&[3], None, 0, "GPU") else {
    unreachable!()
  };
  remote.locality = Some("REMOTE".into());
  r.apply(w(1, 0), &KvEvent::Stored(remote)).unwrap();
  assert_eq!(r.query(&[0, 1, 2, 3], None, None).scores, vec![]);
  assert_eq!(
    r.drops(),
    vec![
      (RouterDrop::BlockSize, 1),
      (RouterDrop::Medium, 1),
      (RouterDrop::NotLocalMain, 1)
    ]
  );
}

#[test]
fn numbered_batches_apply_in_order_and_report_duplicates_and_gaps() {
  let shared = Shared::new(RouterIndex::new(BS).unwrap());
  let batch = |seq: u64, h: u64| {
    let ev = stored(&[h], None, h as u32 * 4, "GPU");
    encode_events(seq, 0.0, &[EventRef::of(&ev)], Some(2), Format::SmgProto)
  };
  let apply = |b: &[u8], e| shared.apply_numbered(9, 0, b, e).unwrap();
  assert!(matches!(apply(&batch(5, 1), None), Numbered::Applied(a) if a.seq == 5 && a.events == 1));
  assert_eq!(apply(&batch(5, 1), Some(6)), Numbered::Duplicate(5));
  assert_eq!(apply(&batch(8, 2), Some(6)), Numbered::Gap(8));
  assert_eq!(shared.read().tier(Tier::Device).worker_blocks(w(9, 2)), 1);
}

#[test]
fn a_tree_dump_replaces_every_rank_of_the_worker() {
  let mut r = RouterIndex::new(BS).unwrap();
  r.apply(w(4, 0), &stored(&[1, 2], None, 0, "GPU")).unwrap();
  r.apply(w(4, 1), &stored(&[9], None, 40, "GPU")).unwrap();
  let KvEvent::Stored(s) = stored(&[7, 8, 9], None, 0, "GPU") else {
    unreachable!()
  };
  let dump = Recovery::TreeDump {
    workers: vec![WorkerDump {
      worker: w(0, 1),
      events: vec![s],
      contents: Vec::new(),
      keys: Vec::new(),
    }],
    last_seq: 77,
    epoch: 5,
  };
  let a = r.apply_recovery(4, dump);
  assert_eq!(
    (a.kind, a.last_seq, a.epoch, a.events),
    ("TreeDump", 77, 5, 1)
  );
  assert_eq!(r.tier(Tier::Device).worker_blocks(w(4, 0)), 0);
  assert_eq!(r.tier(Tier::Device).worker_blocks(w(4, 1)), 3);
  let segs = r.dump(Some(4));
  assert_eq!(segs.len(), 1);
  assert_eq!(segs[0].block_hashes, vec![7, 8, 9]);
}

#[test]
fn a_tree_dump_applied_beside_readers_leaves_what_one_write_leaves_and_readers_never_see_blocks_go_back(
) {
  // Worker 4 holds 3 blocks before; its dump holds 400 events of 16 blocks (one chain).
  let before = [stored(&[1, 2, 3], None, 0, "GPU")];
  let events: Vec<StoredEvent> = (0..400u64)
    .map(|i| {
      let hashes: Vec<u64> = (0..16).map(|j| 1000 + i * 16 + j).collect();
      let parent = (i > 0).then(|| 1000 + i * 16 - 1);
      let KvEvent::Stored(s) = stored(&hashes, parent, (i * 16 * BS as u64) as u32, "GPU") else {
        unreachable!()
      };
      s
    })
    .collect();
  let dump = Recovery::TreeDump {
    workers: vec![WorkerDump {
      worker: w(0, 0),
      events,
      contents: Vec::new(),
      keys: Vec::new(),
    }],
    last_seq: 9,
    epoch: 2,
  };
  let bytes = recover::to_msgpack(&dump);
  let mut one = RouterIndex::new(BS).unwrap();
  let shared = Arc::new(Shared::new(RouterIndex::new(BS).unwrap()));
  for ev in &before {
    one.apply(w(4, 0), ev).unwrap();
    shared.apply(w(4, 0), ev).unwrap();
  }
  let held = |r: &RouterIndex| r.tier(Tier::Device).worker_blocks(w(4, 0));
  let (started, done) = (
    Arc::new(AtomicBool::new(false)),
    Arc::new(AtomicBool::new(false)),
  );
  let reader = {
    let (shared, started, done) = (shared.clone(), started.clone(), done.clone());
    std::thread::spawn(move || {
      let mut seen = Vec::new();
      while !done.load(Ordering::Acquire) {
        seen.push(held(&shared.read()));
        started.store(true, Ordering::Release);
      }
      seen
    })
  };
  while !started.load(Ordering::Acquire) {
    std::hint::spin_loop();
  }
  let a = shared.apply_recovery_msgpack(4, &bytes).unwrap();
  done.store(true, Ordering::Release);
  let seen = reader.join().unwrap();
  let b = one.apply_recovery_msgpack(4, &bytes).unwrap();
  assert_eq!(
    (a.kind, a.last_seq, a.epoch, a.events),
    ("TreeDump", 9, 2, 400)
  );
  assert_eq!((b.kind, b.events), (a.kind, a.events));
  let end = shared.read();
  assert_eq!(held(&end), 6400);
  assert_eq!(end.dump(Some(4)), one.dump(Some(4)));
  assert_eq!(
    end.tier(Tier::Device).stats().memberships,
    one.tier(Tier::Device).stats().memberships
  );
  assert_eq!(end.drops(), one.drops());
  // What the reader saw: the 3 blocks before, then (the clear) a count that only grows, up to
  // the dump's. (Here it read between most pieces, some 1,600 distinct counts; that depends on
  // the scheduler, so it is not asserted.)
  let after_clear = seen.iter().position(|&n| n != 3).unwrap_or(seen.len());
  assert!(after_clear > 0, "the reader read before the recovery");
  let rest = &seen[after_clear..];
  assert!(
    rest.windows(2).all(|p| p[0] <= p[1]),
    "blocks only come back"
  );
  assert!(rest.iter().all(|&n| n <= 6400));
}

#[test]
fn a_clear_from_another_thread_never_lands_between_the_pieces_of_a_store() {
  // One thread stores 64-block chains for worker 1 (16 pieces each); another clears the worker
  // again and again. Each clear comes between two events, never inside one, so the index stays
  // consistent: every membership is a block the worker holds.
  let shared = Arc::new(Shared::new(RouterIndex::new(BS).unwrap()));
  let (done, clears) = (
    Arc::new(AtomicBool::new(false)),
    Arc::new(AtomicU32::new(0)),
  );
  let clearer = {
    let (shared, done, clears) = (shared.clone(), done.clone(), clears.clone());
    std::thread::spawn(move || {
      while !done.load(Ordering::Acquire) {
        // As one write, and a piece at a time in one turn, in turn.
        if clears.load(Ordering::Acquire) % 2 == 0 {
          shared.write().clear_worker(1, None);
        } else {
          shared.clear_worker(1, None);
        }
        clears.fetch_add(1, Ordering::AcqRel);
        std::thread::yield_now();
      }
    })
  };
  // At least 400 events, and on until 50 clears came between them.
  let mut i = 0u64;
  while i < 400 || clears.load(Ordering::Acquire) < 50 {
    let hashes: Vec<u64> = (0..64).map(|j| 1 + i * 64 + j).collect();
    let parent = (!i.is_multiple_of(4)).then(|| i * 64);
    let ev = stored(&hashes, parent, ((i % 4) * 64 * BS as u64) as u32, "GPU");
    shared.apply(w(1, 0), &ev).unwrap();
    i += 1;
  }
  done.store(true, Ordering::Release);
  clearer.join().unwrap();
  let ix = shared.read();
  let stats = ix.tier(Tier::Device).stats();
  let held: u64 = stats.per_worker.iter().map(|w| w.blocks).sum();
  assert_eq!(stats.memberships, held);
  assert!(
    stats.blocks <= held,
    "no block is kept that no one holds or hangs from"
  );
}

#[test]
fn payloads_that_arrived_together_apply_all_or_none() {
  let shared = Shared::new(RouterIndex::new(BS).unwrap());
  let batch = |h: u64| {
    let ev = stored(&[h], None, h as u32 * 4, "GPU");
    encode_events(1, 0.0, &[EventRef::of(&ev)], None, Format::Vllm)
  };
  let (a, b) = (batch(1), batch(2));
  let held = |s: &Shared<RouterIndex>| s.read().tier(Tier::Device).stats().memberships;
  // The second does not decode: the first is not applied either, so a caller going on one
  // payload at a time applies nothing twice.
  let err = shared
    .apply_payloads(9, 0, &[&a, b"\x92garbage"], Dialect::Vllm)
    .unwrap_err();
  assert!(err.message.contains("payload 1"), "{}", err.message);
  assert_eq!(held(&shared), 0);
  assert_eq!(
    shared
      .apply_payloads(9, 0, &[&a, &b], Dialect::Vllm)
      .unwrap(),
    2
  );
  assert_eq!(held(&shared), 2);
}

#[test]
fn events_applied_a_piece_at_a_time_leave_what_whole_events_leave() {
  let salted = |hashes: &[u64], parent: Option<u64>, first: u32| {
    let KvEvent::Stored(mut s) = stored(hashes, parent, first, "GPU") else {
      unreachable!()
    };
    let mut keys = vec![Value::Nil; hashes.len()];
    keys[0] = Value::Array(vec![Value::Str(format!("{SALT_KEY_PREFIX}s1"))]);
    s.extra_keys = Some(Value::Array(keys));
    KvEvent::Stored(s)
  };
  let removed = |hashes: &[u64], medium: &str| {
    KvEvent::Removed(RemovedEvent {
      block_hashes: hashes.to_vec(),
      medium: Some(medium.into()),
      ..Default::default()
    })
  };
  let events = [
    (
      w(1, 0),
      stored(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], None, 0, "GPU"),
    ),
    // Offloaded after its parent, 6 blocks in the host tier, then a duplicate of 9 blocks.
    (
      w(1, 0),
      stored(&[11, 12, 13, 14, 15, 16], Some(10), 40, "CPU"),
    ),
    (
      w(1, 0),
      stored(&[1, 2, 3, 4, 5, 6, 7, 8, 9], None, 0, "GPU"),
    ),
    // A salted chain of 6 and a child of 5 that inherits the salt.
    (w(2, 0), salted(&[21, 22, 23, 24, 25, 26], None, 0)),
    (w(2, 0), stored(&[27, 28, 29, 30, 31], Some(26), 24, "GPU")),
    // An unknown parent (one drop), a foreign medium, then inner and leaf removals.
    (
      w(2, 1),
      stored(&[41, 42, 43, 44, 45, 46, 47, 48, 49], Some(999), 0, "GPU"),
    ),
    (w(1, 0), removed(&[9, 10, 1, 2, 3, 50, 6], "GPU")),
    (w(1, 0), removed(&[11, 12, 13, 14, 15], "NVME")),
    (w(1, 0), removed(&[14, 15, 16], "CPU")),
    (w(2, 0), KvEvent::Cleared),
  ];
  let mut whole = RouterIndex::new(BS).unwrap();
  let pieces = Shared::new(RouterIndex::new(BS).unwrap());
  let tokens: Vec<u32> = (0..64).collect();
  for (i, (wk, ev)) in events.iter().enumerate() {
    whole.apply(*wk, ev).unwrap();
    pieces.apply(*wk, ev).unwrap();
    let p = pieces.read();
    for salt in [None, Some("s1")] {
      assert_eq!(
        scores(&p.query(&tokens, None, salt)),
        scores(&whole.query(&tokens, None, salt)),
        "after event {i}, salt {salt:?}"
      );
    }
    for t in [Tier::Device, Tier::Host, Tier::Disk] {
      let [mut a, mut b] = [p.tier(t).stats(), whole.tier(t).stats()];
      (a.bytes, b.bytes) = (0, 0);
      assert_eq!(a, b, "after event {i}, tier {t:?}");
    }
    assert_eq!(p.drops(), whole.drops(), "after event {i}");
    if i == 4 {
      // The salted chain and its child: 11 blocks in the salt's namespace.
      assert_eq!(
        scores(&p.query(&tokens, None, Some("s1"))),
        vec![(2, 0, 11, 11, 11)]
      );
    }
  }
  // The events did something: the device tier holds worker 1's run, and one parent was unknown.
  let p = pieces.read();
  assert!(p.tier(Tier::Device).stats().memberships > 0);
  assert!(p
    .tier(Tier::Device)
    .stats()
    .drops
    .contains(&(crate::index::DropReason::UnknownParent, 1)));
}

#[test]
fn a_dump_restored_into_an_empty_index_answers_as_the_index_dumped() {
  let mut r = RouterIndex::with_content_hashes(BS, true).unwrap();
  // Shared prompt, two workers' conversations on it (one in two ranks), a host-tier tail, a
  // LoRA's blocks, and a long chain stored in one event (restored in pieces).
  r.apply(w(1, 0), &stored(&[11, 12, 13], None, 0, "GPU"))
    .unwrap();
  r.apply(w(2, 0), &stored(&[21, 22], None, 0, "GPU"))
    .unwrap();
  r.apply(w(2, 0), &stored(&[23, 24], Some(22), 500, "GPU"))
    .unwrap();
  r.apply(w(2, 1), &stored(&[31, 32, 33], None, 0, "GPU"))
    .unwrap();
  r.apply(w(1, 0), &stored(&[14], Some(13), 12, "CPU"))
    .unwrap();
  let lora = KvEvent::Stored(StoredEvent {
    block_hashes: vec![41, 42],
    token_ids: (0..8).collect(),
    block_size: BS,
    lora_name: Some("lo".into()),
    ..Default::default()
  });
  r.apply(w(3, 0), &lora).unwrap();
  let long: Vec<u64> = (100..140).collect();
  r.apply(w(4, 0), &stored(&long, None, 1000, "GPU")).unwrap();
  let dump = r.dump(None);
  let n = |s: &DumpSegment| s.block_hashes.len();
  assert!(dump
    .iter()
    .all(|s| s.content_hashes.len() == n(s) && s.keys.len() == n(s)));
  // Each block's content hash is its tokens' (Dynamo's `tokens_hash`).
  let first = dump.iter().find(|s| s.worker == w(1, 0)).unwrap();
  assert_eq!(
    first.content_hashes[0],
    crate::hash::content_hash(&[0, 1, 2, 3])
  );
  // A worker that loads its state itself is left out.
  let probe = Shared::new(RouterIndex::new(BS).unwrap());
  probe.restore(&dump, &[2, 4]);
  assert!(probe
    .read()
    .dump(None)
    .iter()
    .all(|s| ![2, 4].contains(&s.worker.worker_id)));
  assert!(!probe.read().dump(None).is_empty());

  // Restored by the content hashes alone (Dynamo's dump), into an index that keeps them; and by
  // the keys alone (kvplane's, content hashes not kept), into one that does not.
  let by_content: Vec<DumpSegment> = dump
    .iter()
    .map(|s| DumpSegment {
      keys: vec![],
      ..s.clone()
    })
    .collect();
  let by_key: Vec<DumpSegment> = dump
    .iter()
    .map(|s| DumpSegment {
      content_hashes: vec![],
      ..s.clone()
    })
    .collect();
  let mut queries: Vec<Vec<u32>> = vec![(0..16).collect(), (1000..1160).collect()];
  let mut conv: Vec<u32> = (0..8).collect();
  conv.extend(500..508);
  queries.push(conv);
  for (segments, keep) in [(&by_content, true), (&by_key, false)] {
    let restored = Shared::new(RouterIndex::with_content_hashes(BS, keep).unwrap());
    let got = restored.restore(segments, &[]);
    assert_eq!(got.segments as usize, dump.len());
    assert_eq!(got.blocks, dump.iter().map(|s| n(s) as u64).sum::<u64>());
    let restored = restored.read();
    let again = restored.dump(None);
    if keep {
      assert_eq!(again, dump);
    } else {
      assert_eq!(again, by_key);
    }
    for q in &queries {
      assert_eq!(
        scores(&restored.query(q, None, None)),
        scores(&r.query(q, None, None))
      );
      assert!(!scores(&r.query(q, None, None)).is_empty());
    }
    let l = |ix: &RouterIndex| scores(&ix.query(&(0..8).collect::<Vec<_>>(), Some("lo"), None));
    assert_eq!(l(&restored), l(&r));
    assert_eq!(l(&r), vec![(3, 0, 2, 2, 2)]);
  }
  // Kept, but restored by keys alone: those blocks have no content hashes to dump.
  let mixed = Shared::new(RouterIndex::with_content_hashes(BS, true).unwrap());
  mixed.restore(&by_key, &[]);
  assert!(mixed
    .read()
    .dump(None)
    .iter()
    .all(|s| s.content_hashes.is_empty() && s.keys.len() == n(s)));
}

#[test]
fn a_restored_segment_whose_parent_is_unknown_is_left_out_and_counted() {
  let ix = Shared::new(RouterIndex::new(BS).unwrap());
  let seg = DumpSegment {
    tier: Tier::Device,
    worker: w(1, 0),
    parent: Some(999),
    block_hashes: vec![1, 2],
    content_hashes: vec![5, 6],
    keys: vec![],
  };
  let bad = DumpSegment {
    content_hashes: vec![5],
    ..seg.clone()
  };
  assert_eq!(
    ix.restore(&[seg, bad], &[]),
    Restored {
      segments: 1,
      blocks: 0
    }
  );
  let r = ix.read();
  assert_eq!(r.tier(Tier::Device).dropped(DropReason::UnknownParent), 1);
  assert!(r.dump(None).is_empty());
}

#[test]
fn a_dump_listing_a_lower_tier_before_its_parents_tier_is_restored_whole() {
  let mut r = RouterIndex::new(BS).unwrap();
  r.apply(w(1, 0), &stored(&[11, 12], None, 0, "GPU"))
    .unwrap();
  r.apply(w(1, 0), &stored(&[13], Some(12), 8, "CPU"))
    .unwrap();
  r.apply(w(1, 0), &stored(&[14], Some(13), 12, "DISK"))
    .unwrap();
  let mut dump = r.dump(None);
  dump.reverse();
  assert_eq!(dump[0].tier, Tier::Disk);
  let restored = Shared::new(RouterIndex::new(BS).unwrap());
  assert_eq!(
    restored.restore(&dump, &[]),
    Restored {
      segments: 3,
      blocks: 4
    }
  );
  let tokens: Vec<u32> = (0..16).collect();
  assert_eq!(
    scores(&restored.read().query(&tokens, None, None)),
    scores(&r.query(&tokens, None, None))
  );
  assert_eq!(scores(&r.query(&tokens, None, None)), vec![(1, 0, 2, 3, 4)]);
}

#[test]
fn engine_events_are_counted_by_kind_and_outcome_as_dynamo_counts_them() {
  let events = [
    stored(&[1, 2], None, 0, "GPU"),
    stored(&[3], Some(2), 8, "GPU"),
    stored(&[5], Some(404), 12, "GPU"),
    stored(&[6], None, 40, "SOMEWHERE"),
    // A lower tier's: applied, not counted.
    stored(&[7], Some(3), 12, "CPU"),
    KvEvent::Removed(RemovedEvent {
      block_hashes: vec![3],
      ..Default::default()
    }),
    KvEvent::Removed(RemovedEvent {
      block_hashes: vec![2, 77],
      ..Default::default()
    }),
    KvEvent::Stored(StoredEvent {
      block_hashes: vec![8],
      token_ids: vec![1, 2, 3],
      block_size: BS,
      ..Default::default()
    }),
    KvEvent::Cleared,
  ];
  let payload = |ev: &KvEvent| encode_events(1, 0.0, &[EventRef::of(ev)], None, Format::Vllm);
  let shared = Shared::new(RouterIndex::new(BS).unwrap());
  let mut whole = RouterIndex::new(BS).unwrap();
  for ev in &events {
    shared
      .apply_payload(1, 0, &payload(ev), Dialect::Vllm)
      .unwrap();
    whole
      .apply_payload(1, 0, &payload(ev), Dialect::Vllm)
      .unwrap();
  }
  // Not an engine's event: the router's own clear is not counted.
  shared.clear_worker(1, None);
  let counts = |ix: &RouterIndex| {
    ix.outcomes()
      .into_iter()
      .filter(|&(_, _, n)| n > 0)
      .map(|(k, o, n)| (k.name(), o.name(), n))
      .collect::<Vec<_>>()
  };
  let want = vec![
    ("stored", "ok", 2),
    ("stored", "parent_block_not_found", 1),
    ("stored", "invalid_block", 1),
    ("removed", "ok", 1),
    ("removed", "block_not_found", 1),
    ("cleared", "ok", 1),
  ];
  assert_eq!(counts(&shared.read()), want);
  assert_eq!(counts(&whole), want);
}
