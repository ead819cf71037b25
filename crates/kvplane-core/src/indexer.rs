//! `LocalIndexer`: the index, the replay log and the stream's seq and epoch, behind one lock on
//! an engine node (SPEC §5, §6). Recovery answers follow SPEC §3.4.

use crate::batch::split_oversized;
use crate::chunk::{Attrs, ChunkView, EventChunk, EventRef};
use crate::codec::{self, Dialect, Format};
use crate::columns::Columns;
use crate::error::{KvError, KvResult};
use crate::event::{Batch, KvEvent, MAX_BATCH_EVENTS};
use crate::hash::{hash_blocks, Algo, HashOptions};
use crate::index::{
  Index, IndexConfig, MatchOptions, Matches, StoredBlocks, WorkerDump, WorkerKey,
};
use crate::log::{Logged, Payload, ReplayLog, DEFAULT_BUFFER_STEPS};
use crate::queue::{EventQueue, Taken};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct LocalIndexerConfig {
  pub index: IndexConfig,
  /// How token queries become index keys: the `xxh3` chain (content keys, the default) or the
  /// engine's algorithm (`KeyBy::Engine`). Its block size is the index's block size.
  pub query_hash: HashOptions,
  /// Batches retained for replay.
  pub buffer_steps: usize,
  /// This node's worker id; workers are `(worker_id, dp_rank)`.
  pub worker_id: u64,
  /// This publisher incarnation's epoch.
  pub epoch: u64,
  /// The ZMQ format batches are logged (and published) in: `Vllm`, `VllmLegacy` or `Sglang`.
  pub log_format: Format,
}

impl Default for LocalIndexerConfig {
  fn default() -> Self {
    LocalIndexerConfig {
      index: IndexConfig::default(),
      query_hash: HashOptions::new(Algo::Xxh3, 16),
      buffer_steps: DEFAULT_BUFFER_STEPS,
      worker_id: 0,
      epoch: 0,
      log_format: Format::Vllm,
    }
  }
}

/// The answer to a recovery request for `start..=end`.
#[derive(Debug, Clone)]
pub enum Recovery {
  /// The range is in the log: batches `start..=min(end, last_seq)`.
  Events {
    batches: Vec<Batch>,
    last_seq: u64,
    epoch: u64,
  },
  /// `start` is older than the log (or absent): the whole index, as of `last_seq`.
  TreeDump {
    workers: Vec<WorkerDump>,
    last_seq: u64,
    epoch: u64,
  },
  /// `start` is past the newest batch.
  TooNew { last_seq: u64, epoch: u64 },
  /// `end < start`.
  InvalidRange {
    reason: String,
    last_seq: u64,
    epoch: u64,
  },
}

/// Where a gRPC subscription from a start seq begins (SPEC §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
  /// Start 0: live from the next batch.
  Live,
  /// Replay the log from this seq, then live (it may be `last_seq + 1`: nothing to replay).
  Replay(u64),
  /// Older than the log, or beyond the newest batch (a consumer of another epoch): the consumer
  /// must clear its state and subscribe from 0.
  Expired { requested: u64, oldest: u64 },
}

impl Cursor {
  /// The status message SMG recognizes for an expired cursor.
  pub fn expired_message(requested: u64, oldest: u64) -> String {
    format!(
      "expired KV event replay cursor: requested sequence {requested}, oldest available sequence {oldest}"
    )
  }
}

/// What applying a batch did.
#[derive(Debug, Clone, Default)]
pub struct ApplyReport {
  /// The seq the batch was logged under.
  pub seq: u64,
  /// Events that failed closed (unsupported layout); their worker was cleared.
  pub errors: Vec<KvError>,
  /// The batch as logged and published (in the log format).
  pub payload: Payload,
  /// The same batch as SMG's protobuf `KvEventBatch`, when the proto stream is on.
  pub proto: Option<Vec<u8>>,
}

/// What applying an encoded payload did.
#[derive(Debug, Clone, Default)]
pub struct EncodedApplyReport {
  /// One report per applied batch.
  pub batches: Vec<ApplyReport>,
  /// Events applied.
  pub events: u32,
  /// Events of unknown kinds, skipped by the decoder.
  pub unknown_events: u32,
}

/// What one drain of a publish queue published.
#[derive(Debug, Clone, Default)]
pub struct Drained {
  /// One report per published batch, in seq order.
  pub batches: Vec<ApplyReport>,
  /// Events published.
  pub events: usize,
  /// Seqs skipped for events the queue dropped.
  pub gaps: usize,
}

pub struct LocalIndexer {
  cfg: LocalIndexerConfig,
  index: Index,
  log: ReplayLog,
  last_seq: u64,
  /// Also encode each batch as SMG's protobuf (for gRPC subscribers).
  proto_stream: bool,
}

impl LocalIndexer {
  /// `Err` if the log format is not a ZMQ msgpack format.
  pub fn new(cfg: LocalIndexerConfig) -> KvResult<LocalIndexer> {
    if cfg.log_format == Format::SmgProto {
      return Err(KvError::invalid_arg(
        "the replay log holds ZMQ payloads: format vllm, vllm_legacy or sglang",
      ));
    }
    Ok(LocalIndexer {
      index: Index::new(cfg.index),
      log: ReplayLog::new(cfg.buffer_steps),
      cfg,
      last_seq: 0,
      proto_stream: false,
    })
  }

  pub fn index(&self) -> &Index {
    &self.index
  }

  /// Scores workers for a request given as tokens, hashed as the index's keys are.
  pub fn find_matches_tokens(&self, tokens: &[u32], opts: &MatchOptions) -> KvResult<Matches> {
    let keys = hash_blocks(tokens, &self.cfg.query_hash, false)?.hashes;
    Ok(self.index.find_matches(&keys, opts))
  }

  pub fn last_seq(&self) -> u64 {
    self.last_seq
  }

  pub fn oldest_seq(&self) -> Option<u64> {
    self.log.oldest_seq()
  }

  pub fn retained_batches(&self) -> usize {
    self.log.len()
  }

  /// Payload bytes held by the replay log.
  pub fn log_bytes(&self) -> usize {
    self.log.bytes()
  }

  pub fn log_format(&self) -> Format {
    self.cfg.log_format
  }

  /// Whether each batch applied from now on is also encoded as SMG's protobuf `KvEventBatch`
  /// (`ApplyReport::proto`), once, for every gRPC subscriber to share.
  pub fn set_proto_stream(&mut self, on: bool) {
    self.proto_stream = on;
  }

  pub fn epoch(&self) -> u64 {
    self.cfg.epoch
  }

  pub fn worker_id(&self) -> u64 {
    self.cfg.worker_id
  }

  /// Applies a batch and logs it. `batch.seq` 0 means "assign the next seq"; otherwise it must
  /// be exactly the next one (the stream is dense).
  pub fn apply_batch(&mut self, mut batch: Batch) -> KvResult<ApplyReport> {
    let next = self.last_seq + 1;
    if batch.seq == 0 {
      batch.seq = next;
    } else if batch.seq != next {
      return Err(KvError::invalid_arg(format!(
        "batch seq {} is not the next seq {next}",
        batch.seq
      )));
    }
    if batch.events.len() > MAX_BATCH_EVENTS {
      return Err(KvError::invalid_arg(format!(
        "a batch holds at most {MAX_BATCH_EVENTS} events, got {}",
        batch.events.len()
      )));
    }
    let worker = self.worker_of(batch.dp_rank)?;
    let mut errors = Vec::new();
    for ev in &mut batch.events {
      if let Err(e) = self.index.apply(worker, ev) {
        // Failed closed: the rank's state was dropped here, so the stream says so too and no
        // consumer keeps routing on it (SPEC §7).
        *ev = KvEvent::Cleared;
        errors.push(e);
      }
    }
    let payload = codec::encode(&batch, self.cfg.log_format);
    let proto = self
      .proto_stream
      .then(|| codec::encode(&batch, Format::SmgProto));
    Ok(self.log_batch(batch.seq, payload, proto, errors))
  }

  /// The worker of this node's rank `dp_rank` (none: rank 0).
  fn worker_of(&self, dp_rank: Option<i32>) -> KvResult<WorkerKey> {
    let dp_rank = match dp_rank {
      None => 0,
      Some(r) if r >= 0 => r as u32,
      Some(r) => return Err(KvError::invalid_arg(format!("dpRank {r} is negative"))),
    };
    Ok(WorkerKey {
      worker_id: self.cfg.worker_id,
      dp_rank,
    })
  }

  /// Logs an applied batch under `seq` (the next one) and reports it.
  fn log_batch(
    &mut self,
    seq: u64,
    mut payload: Vec<u8>,
    proto: Option<Vec<u8>>,
    errors: Vec<KvError>,
  ) -> ApplyReport {
    payload.shrink_to_fit();
    let payload = Arc::new(payload);
    self.last_seq = seq;
    self.log.push(Logged {
      seq,
      payload: payload.clone(),
    });
    ApplyReport {
      seq,
      errors,
      payload,
      proto,
    }
  }

  /// Applies queued events as the next batch (at most 1024 of them), encodes it once in the log
  /// format (and as protobuf when the proto stream is on) and logs it. An event that fails
  /// closed is published as a clear of the rank, as in `apply_batch`.
  fn publish_events(
    &mut self,
    events: &mut [EventRef<'_>],
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<ApplyReport> {
    let worker = self.worker_of(dp_rank)?;
    let seq = self.last_seq + 1;
    let mut errors = Vec::new();
    for ev in events.iter_mut() {
      let applied = match *ev {
        EventRef::Stored {
          hashes,
          parent,
          tokens,
          attrs,
        } => self.index.store_blocks(
          worker,
          StoredBlocks {
            block_hashes: hashes,
            parent_block_hash: parent,
            token_ids: tokens,
            block_size: attrs.block_size,
          },
        ),
        EventRef::Removed { hashes, .. } => {
          self.index.remove_blocks(worker, hashes);
          Ok(())
        }
        EventRef::Cleared => self.index.apply(worker, &KvEvent::Cleared),
        EventRef::Event(e) => self.index.apply(worker, e),
      };
      if let Err(e) = applied {
        *ev = EventRef::Cleared;
        errors.push(e);
      }
    }
    let payload = codec::encode_zmq_events(ts, events, dp_rank, self.cfg.log_format);
    let proto = self
      .proto_stream
      .then(|| codec::encode_proto_events(seq, ts, events, dp_rank));
    Ok(self.log_batch(seq, payload, proto, errors))
  }

  /// Publishes events: packs them in order into batches of at most 1024, each applied, encoded
  /// once in the log format and logged under the next seq.
  pub fn publish(
    &mut self,
    events: Vec<KvEvent>,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Vec<ApplyReport>> {
    let batch = Batch {
      seq: 0,
      ts,
      dp_rank,
      events,
    };
    split_oversized(batch)
      .into_iter()
      .map(|b| self.apply_batch(b))
      .collect()
  }

  /// Publishes a chunk of events (columns, or whole events) as the next batches of at most 1024
  /// events, as `publish` would for the same events.
  pub fn publish_chunk(
    &mut self,
    events: EventChunk,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    self.publish_views(&[(events.view(), false)], ts, dp_rank)
  }

  /// Publishes events given as columns, read where they lie (no copy), as `publish_chunk` would
  /// publish a chunk of them.
  pub fn publish_columns(
    &mut self,
    columns: &Columns<'_>,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    let attrs = Attrs::of(columns);
    let view = ChunkView::of_columns(columns, &attrs)?;
    self.publish_views(&[(view, false)], ts, dp_rank)
  }

  /// Publishes up to `max_events` queued events (as batches of at most 1024), skipping a seq at
  /// each place where the queue lost events.
  pub fn drain(
    &mut self,
    queue: &mut EventQueue,
    max_events: usize,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    self.publish_segments(queue.take_segments(max_events), ts, dp_rank)
  }

  /// Publishes segments taken from a publish queue, in order, skipping a seq after each segment
  /// that ended at a loss.
  pub fn publish_segments(
    &mut self,
    segments: Vec<Taken>,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    let views: Vec<(ChunkView<'_>, bool)> = segments
      .iter()
      .map(|s| (s.events.view(), s.gap_after))
      .collect();
    self.publish_views(&views, ts, dp_rank)
  }

  /// Publishes chunks of events in order, skipping a seq after each one flagged as ending at a
  /// loss.
  fn publish_views(
    &mut self,
    segments: &[(ChunkView<'_>, bool)],
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    let mut out = Drained::default();
    let total: usize = segments.iter().map(|(v, _)| v.len()).sum();
    let mut batch: Vec<EventRef<'_>> = Vec::with_capacity(total.min(MAX_BATCH_EVENTS));
    for &(view, gap_after) in segments {
      for ev in view.iter() {
        batch.push(ev);
        if batch.len() == MAX_BATCH_EVENTS {
          out
            .batches
            .push(self.publish_events(&mut batch, ts, dp_rank)?);
          batch.clear();
        }
      }
      out.events += view.len();
      if gap_after {
        if !batch.is_empty() {
          out
            .batches
            .push(self.publish_events(&mut batch, ts, dp_rank)?);
          batch.clear();
        }
        self.skip_seq();
        out.gaps += 1;
      }
    }
    if !batch.is_empty() {
      out
        .batches
        .push(self.publish_events(&mut batch, ts, dp_rank)?);
    }
    Ok(out)
  }

  /// Skips one seq: events were lost before they were numbered (a full publish queue), so
  /// consumers must see a gap. The log cannot bridge it and is emptied: a consumer from before
  /// the gap recovers with a tree dump.
  pub fn skip_seq(&mut self) {
    self.last_seq += 1;
    self.log.clear();
  }

  /// Logged batches with seq >= `start` (from the oldest retained if `start` is older, as vLLM's
  /// replay does), at most `max` of them.
  pub fn replay(&self, start: u64, max: usize) -> Vec<Logged> {
    let Some(oldest) = self.log.oldest_seq() else {
      return Vec::new();
    };
    let from = start.max(oldest);
    let to = from
      .saturating_add(max as u64)
      .saturating_sub(1)
      .min(self.last_seq);
    if max == 0 || from > to {
      return Vec::new();
    }
    self.log.range(from, to)
  }

  /// Where a subscription from `start` begins: live (0), a replay of the log (`start` within
  /// `oldest..=last_seq + 1`), or an expired cursor (older than the log, or past `last_seq + 1`).
  pub fn cursor(&self, start: u64) -> Cursor {
    if start == 0 {
      return Cursor::Live;
    }
    let next = self.last_seq + 1;
    let oldest = self.log.oldest_seq().unwrap_or(next);
    if start >= oldest && start <= next {
      Cursor::Replay(start)
    } else {
      Cursor::Expired {
        requested: start,
        oldest,
      }
    }
  }

  /// Like [`Self::replay`], re-encoded in `format` (`SmgProto` for gRPC subscribers): the same
  /// bytes the live stream carried for those seqs in that format.
  pub fn replay_as(&self, start: u64, max: usize, format: Format) -> Vec<Logged> {
    if format == self.cfg.log_format {
      return self.replay(start, max);
    }
    self
      .replay(start, max)
      .into_iter()
      .map(|l| Logged {
        seq: l.seq,
        payload: codec::encode(&self.decode_logged(&l), format).into(),
      })
      .collect()
  }

  /// A logged batch, decoded, with its seq.
  fn decode_logged(&self, l: &Logged) -> Batch {
    let dialect = match self.cfg.log_format {
      Format::Sglang => Dialect::Sglang,
      _ => Dialect::Vllm,
    };
    let mut b = codec::decode(&l.payload, dialect)
      .expect("the log holds batches this indexer encoded")
      .batches
      .remove(0);
    b.seq = l.seq;
    b
  }

  /// Decodes a payload of `dialect` and applies its batches (one, except for a TensorRT-LLM
  /// JSON list spanning ranks or a batch of more than 1024 events), each under the next seq.
  /// Nothing is applied if the bytes do not decode.
  pub fn apply_encoded(&mut self, bytes: &[u8], dialect: Dialect) -> KvResult<EncodedApplyReport> {
    let decoded = codec::decode(bytes, dialect)?;
    let mut report = EncodedApplyReport {
      unknown_events: decoded.unknown_events,
      ..Default::default()
    };
    for b in decoded.batches.into_iter().flat_map(split_oversized) {
      report.events += b.events.len() as u32;
      report.batches.push(self.apply_batch(b)?);
    }
    Ok(report)
  }

  /// SPEC §3.4: `Events`, `TreeDump`, `TooNew` or `InvalidRange` for `start..=end`.
  pub fn get_events(&self, start: Option<u64>, end: Option<u64>) -> Recovery {
    let (last_seq, epoch) = (self.last_seq, self.cfg.epoch);
    if let (Some(s), Some(e)) = (start, end) {
      if e < s {
        return Recovery::InvalidRange {
          reason: format!("end {e} < start {s}"),
          last_seq,
          epoch,
        };
      }
    }
    let Some(start) = start else {
      return self.tree_dump();
    };
    if start > last_seq {
      return Recovery::TooNew { last_seq, epoch };
    }
    match self.log.oldest_seq() {
      Some(oldest) if start >= oldest => {
        let end = end.unwrap_or(last_seq).min(last_seq);
        let batches = self
          .log
          .range(start, end)
          .iter()
          .map(|l| self.decode_logged(l))
          .collect();
        Recovery::Events {
          batches,
          last_seq,
          epoch,
        }
      }
      _ => self.tree_dump(),
    }
  }

  /// `get_events` for the raw `start` / `end` parameters of a `/kv_recover` query (decimal u64s,
  /// either absent); malformed ones are `InvalidRange`.
  pub fn recover_query(&self, start: Option<&str>, end: Option<&str>) -> Recovery {
    let parse = |name: &str, v: Option<&str>| match v {
      None => Ok(None),
      Some(t) => match t.parse::<u64>() {
        Ok(n) if !t.starts_with('+') => Ok(Some(n)),
        _ => Err(format!(
          "{name} {t:?} is not a seq (an integer in 0..=2^64-1)"
        )),
      },
    };
    match (parse("start", start), parse("end", end)) {
      (Ok(s), Ok(e)) => self.get_events(s, e),
      (Err(reason), _) | (_, Err(reason)) => Recovery::InvalidRange {
        reason,
        last_seq: self.last_seq,
        epoch: self.cfg.epoch,
      },
    }
  }

  /// The whole index as stored events, with the seq it reflects.
  pub fn tree_dump(&self) -> Recovery {
    Recovery::TreeDump {
      workers: self.index.dump(),
      last_seq: self.last_seq,
      epoch: self.cfg.epoch,
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::columns::Columns;
  use crate::event::{KvEvent, StoredEvent};

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
      buffer_steps,
      epoch: 42,
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
    assert_eq!((ix.last_seq(), ix.oldest_seq()), (5, Some(3)));
    match ix.get_events(Some(4), None) {
      Recovery::Events {
        batches,
        last_seq,
        epoch,
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
    let logged = ix.replay(2, 1);
    let b = codec::vllm::decode_batch(&logged[0].payload).unwrap().batch;
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
    let decoded = codec::decode(&reports[2].payload, Dialect::Vllm).unwrap();
    assert_eq!(decoded.batches[0].events.len(), 2);
    assert_eq!(decoded.batches[0].dp_rank, Some(1));
    let replayed = ix.replay(2, 10);
    assert_eq!(
      replayed.iter().map(|l| l.seq).collect::<Vec<_>>(),
      vec![2, 3]
    );
    assert_eq!(replayed[1].payload, reports[2].payload);
    assert_eq!(ix.replay(1, 1).len(), 1);
    assert!(ix.replay(4, 10).is_empty());
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
    assert!(first[0].proto.is_none(), "off by default");
    ix.set_proto_stream(true);
    let mut events = vec![stored(&[2, 3], Some(1)), KvEvent::Cleared];
    events.push(KvEvent::Removed(crate::event::RemovedEvent {
      block_hashes: vec![3],
      ..Default::default()
    }));
    let live = ix.publish(events, 3.5, Some(0)).unwrap();
    let proto = live[0].proto.clone().unwrap();
    let decoded = codec::decode(&proto, Dialect::SmgProto).unwrap();
    let b = &decoded.batches[0];
    assert_eq!(
      (b.seq, b.ts, b.dp_rank, b.events.len()),
      (2, 3.5, Some(0), 3)
    );
    let replayed = ix.replay_as(1, 10, Format::SmgProto);
    assert_eq!(
      replayed.iter().map(|l| l.seq).collect::<Vec<_>>(),
      vec![1, 2]
    );
    assert_eq!(&replayed[1].payload[..], &proto[..]);
    let seq1 = codec::decode(&replayed[0].payload, Dialect::SmgProto).unwrap();
    assert_eq!(seq1.batches[0].seq, 1);
    assert_eq!(ix.replay_as(2, 1, Format::Vllm)[0].payload, live[0].payload);
  }

  #[test]
  fn subscription_cursors_replay_within_the_log_and_expire_outside_it() {
    let mut ix = indexer(3);
    assert_eq!(ix.cursor(0), Cursor::Live);
    assert_eq!(
      ix.cursor(1),
      Cursor::Replay(1),
      "nothing published yet: 1 is next"
    );
    let expired = |requested, oldest| Cursor::Expired { requested, oldest };
    assert_eq!(ix.cursor(2), expired(2, 1));
    for h in 1..=5u64 {
      ix.apply_batch(batch(vec![stored(&[h], None)])).unwrap();
    }
    // Log holds 3..=5.
    assert_eq!(ix.cursor(2), expired(2, 3));
    assert_eq!(ix.cursor(3), Cursor::Replay(3));
    assert_eq!(ix.cursor(6), Cursor::Replay(6));
    assert_eq!(ix.cursor(7), expired(7, 3), "a cursor of another epoch");
    ix.skip_seq();
    assert_eq!(ix.cursor(5), expired(5, 7), "the log restarts after a gap");
    assert_eq!(ix.cursor(7), Cursor::Replay(7));
    assert_eq!(
      Cursor::expired_message(5, 7),
      "expired KV event replay cursor: requested sequence 5, oldest available sequence 7"
    );
  }

  #[test]
  fn a_skipped_seq_is_a_gap_the_log_does_not_bridge() {
    let mut ix = indexer(100);
    ix.publish(vec![stored(&[1], None)], 1.0, None).unwrap();
    ix.skip_seq();
    let r = ix.publish(vec![stored(&[2], Some(1))], 1.0, None).unwrap();
    assert_eq!(r[0].seq, 3);
    assert_eq!(ix.oldest_seq(), Some(3));
    assert!(matches!(
      ix.get_events(Some(1), None),
      Recovery::TreeDump { last_seq: 3, .. }
    ));
    // vLLM's rule: a replay from before the log starts at its oldest batch.
    assert_eq!(ix.replay(1, 10)[0].seq, 3);
  }

  #[test]
  fn logs_in_the_configured_zmq_format_only() {
    let cfg = |log_format| LocalIndexerConfig {
      log_format,
      ..Default::default()
    };
    assert!(LocalIndexer::new(cfg(Format::SmgProto)).is_err());
    let mut ix = LocalIndexer::new(cfg(Format::Sglang)).unwrap();
    let r = ix
      .publish(vec![stored(&[u64::MAX], None)], 1.0, None)
      .unwrap();
    let b = codec::vllm::decode_batch(&r[0].payload).unwrap().batch;
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
      by_events.set_proto_stream(proto);
      let want = by_events.publish(events.clone(), 2.5, Some(1)).unwrap();
      let mut by_queue = indexer(100);
      by_queue.set_proto_stream(proto);
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
        assert_eq!(g.payload, w.payload);
        assert_eq!(g.proto, w.proto);
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
        .all(|(g, w)| (g.seq, &g.payload) == (w.seq, &w.payload)));
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
}
