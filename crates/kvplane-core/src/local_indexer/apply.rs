//! Applying whole batches and encoded payloads.

use super::{ApplyReport, Drained, EncodedApplyReport, LocalIndexer};
use crate::codec::{self, Dialect};
use crate::error::{KvError, KvResult};
use crate::event::{Batch, EventRef, KvEvent, MAX_BATCH_EVENTS};
use crate::stream::batch::split_oversized;

impl LocalIndexer {
  /// Applies a batch and logs it. `batch.seq` 0 means "assign the next seq"; otherwise it must
  /// be exactly the next one (the stream is dense).
  pub fn apply_batch(&mut self, mut batch: Batch) -> KvResult<ApplyReport> {
    let next = self.stream.next_seq();
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
        // consumer keeps routing on it (docs/protocol.md#fail-closed-layouts).
        *ev = KvEvent::Cleared;
        errors.push(e);
      }
    }
    let encodings = self.stream.encode_batch(&batch);
    Ok(self.append(encodings, errors, batch.dp_rank))
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
}

impl LocalIndexer {
  /// Relays a payload of `dialect` from an engine: its batches (split at 1024 events) are
  /// published under the next seqs with the engine's timestamps, under DP rank `dp_rank` whatever
  /// rank the payload names (a single-rank vLLM leaves it nil), or with `None` under the
  /// payload's own ranks (TensorRT-LLM gathers its attention-DP ranks on one socket). Nothing is
  /// published if the bytes do not decode.
  pub fn relay_encoded(
    &mut self,
    bytes: &[u8],
    dialect: Dialect,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    self.relay_coalesced(&[bytes], dialect, dp_rank)
  }

  /// Relays consecutive payloads of one engine subscription as `relay_encoded` would, except
  /// that consecutive batches of the same rank are published as one (split at 1024 events),
  /// under the first one's timestamp: a relay that finds several engine batches waiting sends
  /// them on as one. Nothing is published if any payload does not decode (the error names it).
  pub fn relay_coalesced(
    &mut self,
    payloads: &[&[u8]],
    dialect: Dialect,
    dp_rank: Option<i32>,
  ) -> KvResult<Drained> {
    let decoded = codec::decode_all_chunks(payloads, dialect)?;
    // Viewed where they were decoded: runs of one rank go out 1024 events at a time.
    let mut out = Drained::default();
    let mut run: Vec<EventRef<'_>> = Vec::with_capacity(MAX_BATCH_EVENTS);
    let mut run_of: (f64, Option<i32>) = (0.0, None);
    for b in &decoded {
      let rank = dp_rank.or(b.dp_rank);
      if !run.is_empty() && rank != run_of.1 {
        out
          .batches
          .push(self.publish_events(&mut run, run_of.0, run_of.1)?);
        run.clear();
      }
      for ev in b.chunk.iter() {
        if run.is_empty() {
          run_of = (b.ts, rank);
        }
        run.push(ev);
        out.events += 1;
        if run.len() == MAX_BATCH_EVENTS {
          out
            .batches
            .push(self.publish_events(&mut run, run_of.0, run_of.1)?);
          run.clear();
        }
      }
    }
    if !run.is_empty() {
      out
        .batches
        .push(self.publish_events(&mut run, run_of.0, run_of.1)?);
    }
    Ok(out)
  }

  /// Publishes `AllBlocksCleared` for DP rank `dp_rank` as the next batch: the rank's state is
  /// unknown (a gap its engine cannot fill, a restart), so the index and every consumer drop it.
  pub fn clear_rank(&mut self, dp_rank: Option<i32>, ts: f64) -> KvResult<Drained> {
    let batches = self.publish(vec![KvEvent::Cleared], ts, dp_rank)?;
    Ok(Drained {
      batches,
      events: 1,
      gaps: 0,
    })
  }
}

/// How a relayed batch's first event id followed the last one of its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdBreak {
  /// Ids were skipped: the engine dropped events (TensorRT-LLM's bounded event buffer).
  Gap,
  /// Ids fell back: a new engine incarnation.
  Restart,
}

/// What `relay_with_event_ids` published, and where each rank's event ids stand now.
#[derive(Debug, Default)]
pub struct RelayedIds {
  pub drained: Drained,
  /// Per rank, the event id expected next.
  pub next_ids: Vec<(i32, u64)>,
  /// Ranks cleared before a batch, and why, in order.
  pub breaks: Vec<(i32, IdBreak)>,
}

impl LocalIndexer {
  /// `relay_encoded` for a payload whose events carry the engine's event ids (TensorRT-LLM's
  /// JSON drain), under the payload's own ranks. A batch whose first id does not follow its
  /// rank's `next_ids` entry (a gap, or ids falling back on a restart) is preceded by
  /// `AllBlocksCleared` for that rank: its state is unknown, and it rebuilds from this batch.
  pub fn relay_with_event_ids(
    &mut self,
    bytes: &[u8],
    dialect: Dialect,
    next_ids: &[(i32, u64)],
  ) -> KvResult<RelayedIds> {
    let decoded = codec::decode(bytes, dialect)?;
    let mut out = RelayedIds {
      next_ids: next_ids.to_vec(),
      ..Default::default()
    };
    for (b, ids) in decoded.batches.into_iter().zip(decoded.event_ids) {
      let rank = b.dp_rank.unwrap_or(0);
      let slot = out.next_ids.iter().position(|(r, _)| *r == rank);
      if let (Some(&first), Some(i)) = (ids.first(), slot) {
        let expected = out.next_ids[i].1;
        let brk = match first.cmp(&expected) {
          std::cmp::Ordering::Greater => Some(IdBreak::Gap),
          std::cmp::Ordering::Less => Some(IdBreak::Restart),
          std::cmp::Ordering::Equal => None,
        };
        if let Some(brk) = brk {
          out.breaks.push((rank, brk));
          let cleared = self.publish(vec![KvEvent::Cleared], b.ts, Some(rank))?;
          out.drained.events += 1;
          out.drained.batches.extend(cleared);
        }
      }
      if let Some(&last) = ids.last() {
        let next = last.wrapping_add(1);
        match slot {
          Some(i) => out.next_ids[i].1 = next,
          None => out.next_ids.push((rank, next)),
        }
      }
      let mut b = b;
      b.seq = 0;
      for b in split_oversized(b) {
        out.drained.events += b.events.len();
        out.drained.batches.push(self.apply_batch(b)?);
      }
    }
    Ok(out)
  }
}
