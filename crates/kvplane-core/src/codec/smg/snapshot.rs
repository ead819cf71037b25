//! In-stream state snapshots: SMG's `KvSnapshotChunk` (`KvEventBatch.snapshot`, field 7), the
//! index's state sent to a subscriber that has no usable cursor
//! (docs/protocol.md#snapshots).
//!
//! A snapshot is planned from a tree dump taken at `last_seq`: per worker (DP rank), chunks of at
//! most `max_blocks` blocks, the rank's first chunk beginning with `AllBlocksCleared` for it, then
//! its stored events parents first (the dump's order; an event longer than a chunk is split, each
//! piece's parent the block before it). The `count` chunks carry the consecutive seqs
//! `last_seq - count + 1 ..= last_seq`, so the live stream continues at `last_seq + 1` with no gap
//! and no duplicate. Synthesized events have `event_id` 0. Chunks are encoded one at a time.

use super::encode::{encode_event_with_id, put_batch_head, put_dp_rank};
use super::*;
use crate::codec::protobuf::{put_len_delimited, put_opt_varint};
use crate::event::{EventRef, StoredEvent, StoredView};
use crate::index::WorkerDump;
use crate::stream::Recovery;

/// Blocks per chunk by default: about 200 KB of protobuf with 16-token blocks, far below the
/// 4 MiB a gRPC client takes in one message by default.
pub const SNAPSHOT_CHUNK_BLOCKS: usize = 4096;

/// Where a chunk starts or ends in a worker's events: event `.0`, block `.1` of it.
type Pos = (usize, usize);

#[derive(Debug, Clone, Copy)]
struct Span {
  /// Index into `workers`; `None`: the whole-node clear of an empty snapshot.
  worker: Option<usize>,
  from: Pos,
  to: Pos,
  /// The rank's first chunk: it begins with `AllBlocksCleared`.
  first: bool,
}

/// A planned snapshot; `next_chunk` encodes its chunks in order.
#[derive(Debug)]
pub struct SnapshotChunks {
  workers: Vec<WorkerDump>,
  spans: Vec<Span>,
  last_seq: u64,
  ts: f64,
  blocks: u64,
  /// Per DP rank: engine batches before the relay's record of that rank that it never saw.
  unknown_before: Vec<(u32, u64)>,
  next: usize,
}

impl SnapshotChunks {
  /// Plans the snapshot of `workers` (a dump taken at `last_seq`), at most `max_blocks` blocks
  /// per chunk (raised when the chunks would need seqs below 1). `None` when `last_seq` is 0:
  /// nothing was published, there is nothing to number the chunks with.
  pub fn new(
    workers: Vec<WorkerDump>,
    last_seq: u64,
    ts: f64,
    max_blocks: usize,
  ) -> Option<SnapshotChunks> {
    if last_seq == 0 {
      return None;
    }
    let blocks: u64 = workers
      .iter()
      .flat_map(|w| &w.events)
      .map(|e| e.block_hashes.len() as u64)
      .sum();
    let mut max_blocks = max_blocks.max(1);
    let spans = loop {
      let spans = plan(&workers, max_blocks);
      if spans.len() as u64 <= last_seq || max_blocks as u64 >= blocks.max(1) {
        break spans;
      }
      max_blocks = max_blocks.saturating_mul(2);
    };
    if spans.len() as u64 > last_seq {
      return None;
    }
    Some(SnapshotChunks {
      workers,
      spans,
      last_seq,
      ts,
      blocks,
      unknown_before: Vec::new(),
      next: 0,
    })
  }

  /// The snapshot of a tree dump (`Recovery::TreeDump`, taken with the seq it reflects); `None`
  /// for any other answer, or as `new` says.
  pub fn of_dump(dump: Recovery, ts: f64, max_blocks: usize) -> Option<SnapshotChunks> {
    match dump {
      Recovery::TreeDump {
        workers, last_seq, ..
      } => SnapshotChunks::new(workers, last_seq, ts, max_blocks),
      _ => None,
    }
  }

  /// Sets `unknown_before` per DP rank `(rank, batches)`: a rank's chunks then say how many of
  /// its engine's batches came before what the relay recorded (0 when it saw them all).
  pub fn with_unknown_before(mut self, unknown_before: Vec<(u32, u64)>) -> SnapshotChunks {
    self.unknown_before = unknown_before;
    self
  }

  /// Chunks in the snapshot.
  pub fn count(&self) -> u32 {
    self.spans.len() as u32
  }

  /// Live blocks in the whole snapshot.
  pub fn blocks(&self) -> u64 {
    self.blocks
  }

  /// The seq the state was taken at: the last chunk's; live batches continue after it.
  pub fn last_seq(&self) -> u64 {
    self.last_seq
  }

  /// The next chunk's `KvEventBatch` bytes and seq; `None` after the last.
  pub fn next_chunk(&mut self) -> Option<(u64, Vec<u8>)> {
    let span = *self.spans.get(self.next)?;
    let index = self.next as u64;
    self.next += 1;
    let count = self.spans.len() as u64;
    let seq = self.last_seq - count + 1 + index;
    let mut out = Vec::new();
    put_batch_head(seq, self.ts, &mut out);
    if span.first {
      put_len_delimited(&mut out, BATCH_EVENTS, |out| {
        encode_event_with_id(&EventRef::Cleared, 0, out)
      });
    }
    let mut dp_rank = None;
    if let Some(w) = span.worker {
      let worker = &self.workers[w];
      dp_rank = Some(worker.worker.dp_rank);
      for_each_piece(&worker.events, span.from, span.to, |piece| {
        let view = EventRef::Stored(StoredView::of(piece));
        put_len_delimited(&mut out, BATCH_EVENTS, |out| {
          encode_event_with_id(&view, 0, out)
        });
      });
    }
    put_dp_rank(dp_rank.map(|r| r as i32), &mut out);
    put_len_delimited(&mut out, BATCH_SNAPSHOT, |out| {
      put_opt_varint(out, SNAPSHOT_INDEX, (index != 0).then_some(index));
      put_opt_varint(out, SNAPSHOT_COUNT, Some(count));
      put_opt_varint(
        out,
        SNAPSHOT_BLOCKS,
        (self.blocks != 0).then_some(self.blocks),
      );
      let unknown = dp_rank.and_then(|r| {
        self
          .unknown_before
          .iter()
          .find(|(rank, _)| *rank == r)
          .map(|(_, n)| *n)
      });
      put_opt_varint(out, SNAPSHOT_UNKNOWN_BEFORE, unknown.filter(|&n| n != 0));
    });
    Some((seq, out))
  }
}

/// The chunks of `workers`: per worker, runs of at most `max_blocks` blocks; one whole-node
/// clear when there is no worker.
fn plan(workers: &[WorkerDump], max_blocks: usize) -> Vec<Span> {
  if workers.is_empty() {
    return vec![Span {
      worker: None,
      from: (0, 0),
      to: (0, 0),
      first: true,
    }];
  }
  let mut spans = Vec::new();
  for (w, worker) in workers.iter().enumerate() {
    let mut from = (0, 0);
    let mut room = max_blocks;
    let mut first = true;
    for (e, ev) in worker.events.iter().enumerate() {
      if room == 0 {
        spans.push(Span {
          worker: Some(w),
          from,
          to: (e, 0),
          first,
        });
        first = false;
        from = (e, 0);
        room = max_blocks;
      }
      let mut at = 0;
      let len = ev.block_hashes.len();
      while len - at > room {
        at += room;
        let to = (e, at);
        spans.push(Span {
          worker: Some(w),
          from,
          to,
          first,
        });
        first = false;
        from = to;
        room = max_blocks;
      }
      room -= len - at;
    }
    spans.push(Span {
      worker: Some(w),
      from,
      to: (worker.events.len(), 0),
      first,
    });
  }
  spans
}

/// Calls `f` with each stored event (or piece of one) from `from` up to `to` (exclusive).
fn for_each_piece(events: &[StoredEvent], from: Pos, to: Pos, mut f: impl FnMut(&StoredEvent)) {
  for (e, ev) in events.iter().enumerate().skip(from.0) {
    if e > to.0 || (e == to.0 && to.1 == 0) {
      break;
    }
    let a = if e == from.0 { from.1 } else { 0 };
    let b = if e == to.0 {
      to.1
    } else {
      ev.block_hashes.len()
    };
    if a == 0 && b == ev.block_hashes.len() {
      f(ev);
    } else if a < b {
      f(&piece(ev, a, b));
    }
  }
}

/// Blocks `a..b` of `ev` as an event of their own: its parent is block `a - 1`.
fn piece(ev: &StoredEvent, a: usize, b: usize) -> StoredEvent {
  let bs = ev.block_size as usize;
  let tokens = if bs != 0 && ev.token_ids.len() == ev.block_hashes.len() * bs {
    ev.token_ids[a * bs..b * bs].to_vec()
  } else {
    Vec::new()
  };
  StoredEvent {
    block_hashes: ev.block_hashes[a..b].to_vec(),
    parent_block_hash: if a == 0 {
      ev.parent_block_hash
    } else {
      Some(ev.block_hashes[a - 1])
    },
    token_ids: tokens,
    block_size: ev.block_size,
    ..Default::default()
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::codec::protobuf::Reader;
  use crate::codec::smg::decode_batch;
  use crate::event::KvEvent;
  use crate::index::WorkerKey;

  fn chain(first: u64, n: u64, parent: Option<u64>) -> StoredEvent {
    StoredEvent {
      block_hashes: (first..first + n).collect(),
      parent_block_hash: parent,
      token_ids: (first..first + n).flat_map(|h| [h as u32; 4]).collect(),
      block_size: 4,
      ..Default::default()
    }
  }

  fn dump() -> Vec<WorkerDump> {
    vec![
      WorkerDump {
        worker: WorkerKey {
          worker_id: 0,
          dp_rank: 0,
        },
        events: vec![chain(1, 10, None), chain(100, 3, Some(5))],
        contents: Vec::new(),
        keys: Vec::new(),
      },
      WorkerDump {
        worker: WorkerKey {
          worker_id: 0,
          dp_rank: 1,
        },
        events: vec![chain(200, 2, None)],
        contents: Vec::new(),
        keys: Vec::new(),
      },
    ]
  }

  /// `KvSnapshotChunk` (index, count, blocks) of a chunk.
  fn chunk_field(bytes: &[u8]) -> (u64, u64, u64) {
    let mut p = Reader::new(bytes);
    while !p.done() {
      let (field, wire) = p.key().unwrap();
      if field == BATCH_SNAPSHOT {
        let mut q = Reader::new(p.bytes_field(wire).unwrap());
        let mut out = (0, 0, 0);
        while !q.done() {
          let (f, w) = q.key().unwrap();
          let v = q.varint_field(w).unwrap();
          match f {
            SNAPSHOT_INDEX => out.0 = v,
            SNAPSHOT_COUNT => out.1 = v,
            SNAPSHOT_BLOCKS => out.2 = v,
            _ => panic!("field {f}"),
          }
        }
        return out;
      }
      p.skip(field, wire).unwrap();
    }
    panic!("no snapshot field");
  }

  #[test]
  fn chunks_are_numbered_up_to_the_cut_and_rebuild_the_dump() {
    for max in [1, 3, 4, 13, 4096] {
      let mut s = SnapshotChunks::new(dump(), 1000, 1.5, max).unwrap();
      let count = s.count() as u64;
      let mut seqs = Vec::new();
      let mut by_rank: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
      let mut clears = Vec::new();
      while let Some((seq, bytes)) = s.next_chunk() {
        let (index, c, blocks) = chunk_field(&bytes);
        assert_eq!((index, c, blocks), (seqs.len() as u64, count, 15));
        let head = batch_head(&bytes).unwrap();
        assert_eq!(
          (head.seq, head.snapshot_rest),
          (seq, Some(count - index - 1))
        );
        let d = decode_batch(&bytes).unwrap();
        assert_eq!(d.batch.seq, seq);
        assert!(d.event_ids.iter().all(|&id| id == 0));
        let rank = d.batch.dp_rank.unwrap() as usize;
        for (i, e) in d.batch.events.iter().enumerate() {
          match e {
            KvEvent::Cleared => {
              assert_eq!(i, 0, "a clear opens the rank's first chunk");
              clears.push(rank);
            }
            KvEvent::Stored(st) => {
              // Each piece continues from the block before it: parents come first.
              let parent = st.parent_block_hash;
              assert!(parent.is_none() || by_rank[rank].contains(&parent.unwrap()));
              assert_eq!(st.token_ids.len(), st.block_hashes.len() * 4);
              by_rank[rank].extend(&st.block_hashes);
            }
            other => panic!("{other:?}"),
          }
        }
        seqs.push(seq);
      }
      assert_eq!(
        seqs,
        (1000 - count + 1..=1000).collect::<Vec<_>>(),
        "max {max}"
      );
      assert_eq!(clears, vec![0, 1]);
      let want: Vec<u64> = (1..=10).chain(100..103).collect();
      assert_eq!(by_rank[0], want);
      assert_eq!(by_rank[1], vec![200, 201]);
      if max == 4096 {
        assert_eq!(count, 2);
      }
      if max == 1 {
        assert_eq!(count, 15);
      }
    }
  }

  #[test]
  fn unknown_before_is_set_per_rank() {
    let mut s = SnapshotChunks::new(dump(), 100, 0.0, 4096)
      .unwrap()
      .with_unknown_before(vec![(1, 7)]);
    let field = |bytes: &[u8]| {
      let mut p = Reader::new(bytes);
      while !p.done() {
        let (f, w) = p.key().unwrap();
        if f == BATCH_SNAPSHOT {
          let mut q = Reader::new(p.bytes_field(w).unwrap());
          while !q.done() {
            let (g, w2) = q.key().unwrap();
            let v = q.varint_field(w2).unwrap();
            if g == SNAPSHOT_UNKNOWN_BEFORE {
              return v;
            }
          }
          return 0;
        }
        p.skip(f, w).unwrap();
      }
      0
    };
    let rank0 = s.next_chunk().unwrap().1;
    let rank1 = s.next_chunk().unwrap().1;
    assert_eq!((field(&rank0), field(&rank1)), (0, 7));
  }

  #[test]
  fn an_empty_index_is_one_whole_node_clear_and_chunks_fit_the_seqs() {
    let mut s = SnapshotChunks::new(Vec::new(), 7, 0.0, 16).unwrap();
    let (seq, bytes) = s.next_chunk().unwrap();
    assert_eq!(seq, 7);
    let d = decode_batch(&bytes).unwrap();
    assert_eq!(
      (d.batch.dp_rank, d.batch.events.clone()),
      (None, vec![KvEvent::Cleared])
    );
    assert!(s.next_chunk().is_none());
    assert!(SnapshotChunks::new(dump(), 0, 0.0, 16).is_none());
    // 15 blocks one per chunk would need 15 seqs; 4 are there: chunks grow to fit.
    let s = SnapshotChunks::new(dump(), 4, 0.0, 1).unwrap();
    assert!(s.count() <= 4);
  }
}
