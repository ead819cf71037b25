//! Batch bounds (docs/protocol.md#seqs-and-epochs): a published batch holds at most 1024 events.

use crate::event::{Batch, MAX_BATCH_EVENTS};

/// Splits a batch of more than `MAX_BATCH_EVENTS` events (engines' steps and publish calls are
/// unbounded) into bounded ones with the same `ts` and `dp_rank`, in order; seqs are left for
/// the caller.
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
  use crate::event::KvEvent;

  #[test]
  fn splits_into_bounded_batches_in_order() {
    let b = Batch {
      seq: 0,
      ts: 1.0,
      dp_rank: Some(2),
      events: vec![KvEvent::Cleared; 2049],
    };
    let parts = split_oversized(b);
    assert_eq!(
      parts.iter().map(|x| x.events.len()).collect::<Vec<_>>(),
      vec![1024, 1024, 1]
    );
    assert!(parts.iter().all(|x| x.dp_rank == Some(2) && x.ts == 1.0));
    let small = Batch {
      seq: 0,
      ts: 1.0,
      dp_rank: None,
      events: vec![],
    };
    assert_eq!(split_oversized(small).len(), 1);
  }
}
