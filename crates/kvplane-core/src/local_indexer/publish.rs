//! Publishing: events, columns and the publish queue become the next batches of at most 1024
//! events, each applied to the index, encoded once per format and logged.

use super::{ApplyReport, Drained, LocalIndexer};
use crate::chunk::{Attrs, ChunkView, EventChunk};
use crate::columns::Columns;
use crate::error::KvResult;
use crate::event::{Batch, EventRef, KvEvent, StoredFields, MAX_BATCH_EVENTS};
use crate::index::StoredBlocks;
use crate::stream::batch::split_oversized;
use crate::stream::queue::{EventQueue, Taken};

impl LocalIndexer {
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
        self.stream.skip_seq();
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

  /// Applies queued events as the next batch (at most 1024 of them), encodes it once per format
  /// and logs it. An event that fails closed is published as a clear of the rank, as in
  /// `apply_batch`.
  pub(super) fn publish_events(
    &mut self,
    events: &mut [EventRef<'_>],
    ts: f64,
    dp_rank: Option<i32>,
  ) -> KvResult<ApplyReport> {
    let worker = self.worker_of(dp_rank)?;
    let mut errors = Vec::new();
    for ev in events.iter_mut() {
      let applied = match *ev {
        EventRef::Stored(s) => self.index.store_blocks(
          worker,
          StoredBlocks {
            block_hashes: s.block_hashes,
            parent_block_hash: s.parent_block_hash,
            token_ids: s.token_ids,
            block_size: s.block_size(),
            content_hashes: &[],
            keys: &[],
          },
        ),
        EventRef::Removed(r) => {
          self.index.remove_blocks(worker, r.block_hashes);
          Ok(())
        }
        EventRef::Cleared => self.index.apply(worker, &KvEvent::Cleared),
        // TRT-LLM only and rare: applied whole, as `apply_batch` would.
        other @ (EventRef::Updated(_) | EventRef::Created(_)) => {
          self.index.apply(worker, &other.to_event())
        }
      };
      if let Err(e) = applied {
        *ev = EventRef::Cleared;
        errors.push(e);
      }
    }
    let encodings = self
      .stream
      .encode(self.stream.next_seq(), ts, events, dp_rank);
    Ok(self.append(encodings, errors, dp_rank))
  }
}
