//! Batch packing (SPEC §6): events become batches of at most `max_events` events (1024 by
//! default), numbered densely from the next seq.

use crate::error::{KvError, KvResult};
use crate::event::{Batch, KvEvent, MAX_BATCH_EVENTS};

#[derive(Debug, Clone)]
pub struct Batcher {
  next_seq: u64,
  max_events: usize,
}

impl Batcher {
  /// `next_seq` is the seq the first batch gets (1 for a new stream).
  pub fn new(next_seq: u64, max_events: usize) -> KvResult<Batcher> {
    if next_seq == 0 {
      return Err(KvError::invalid_arg(
        "seq 0 is reserved (\"from now\"); streams start at 1",
      ));
    }
    if !(1..=MAX_BATCH_EVENTS).contains(&max_events) {
      return Err(KvError::invalid_arg(format!(
        "maxBatchEvents is {max_events}: 1..={MAX_BATCH_EVENTS}"
      )));
    }
    Ok(Batcher {
      next_seq,
      max_events,
    })
  }

  pub fn next_seq(&self) -> u64 {
    self.next_seq
  }

  /// Packs events (in order) into numbered batches stamped `ts` and `dp_rank`.
  pub fn pack(&mut self, events: Vec<KvEvent>, ts: f64, dp_rank: Option<i32>) -> Vec<Batch> {
    let mut out = Vec::with_capacity(events.len().div_ceil(self.max_events));
    let mut it = events.into_iter().peekable();
    while it.peek().is_some() {
      let chunk: Vec<KvEvent> = it.by_ref().take(self.max_events).collect();
      out.push(Batch {
        seq: self.next_seq,
        ts,
        dp_rank,
        events: chunk,
      });
      self.next_seq += 1;
    }
    out
  }
}

/// Splits a batch with more than `MAX_BATCH_EVENTS` events (engines' steps are unbounded) into
/// bounded ones with the same `ts` and `dp_rank`, in order; seqs are left for the caller.
pub fn split_oversized(b: Batch) -> Vec<Batch> {
  if b.events.len() <= MAX_BATCH_EVENTS {
    return vec![b];
  }
  let Batch {
    seq,
    ts,
    dp_rank,
    events,
  } = b;
  let mut out = Vec::with_capacity(events.len().div_ceil(MAX_BATCH_EVENTS));
  let mut it = events.into_iter().peekable();
  while it.peek().is_some() {
    out.push(Batch {
      seq,
      ts,
      dp_rank,
      events: it.by_ref().take(MAX_BATCH_EVENTS).collect(),
    });
  }
  out
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn packs_bounded_batches_with_dense_seqs() {
    let mut b = Batcher::new(1, 1024).unwrap();
    let batches = b.pack(vec![KvEvent::Cleared; 2049], 1.0, Some(2));
    assert_eq!(
      batches
        .iter()
        .map(|x| (x.seq, x.events.len()))
        .collect::<Vec<_>>(),
      vec![(1, 1024), (2, 1024), (3, 1)]
    );
    assert!(b.pack(Vec::new(), 1.0, None).is_empty());
    assert_eq!(b.pack(vec![KvEvent::Cleared], 2.0, None)[0].seq, 4);
    assert!(Batcher::new(0, 10).is_err());
    assert!(Batcher::new(1, 1025).is_err());
    assert!(Batcher::new(1, 0).is_err());
  }
}
