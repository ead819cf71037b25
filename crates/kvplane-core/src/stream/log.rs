//! The replay log: the last `buffer_steps` batches, addressed by their dense seq in O(1). Each
//! batch is kept as the bytes it was published as (encoded once, docs/protocol.md#seqs-and-epochs),
//! which is what replay sends and about a quarter of the memory of the decoded events.

use crate::error::{count_from_f64, KvResult};
use std::collections::VecDeque;
use std::sync::Arc;

/// An encoded batch, shared between the log and whoever sends it (kept as the encoder's buffer:
/// never copied).
pub type Payload = Arc<Vec<u8>>;

/// A batch as published: its seq and its encoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
  pub seq: u64,
  pub payload: Payload,
}

/// vLLM's `buffer_steps` default.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;
/// Largest accepted `buffer_steps`.
pub const MAX_BUFFER_STEPS: usize = 10_000_000;

/// Checks a JS number is a usable `bufferSteps`.
pub fn buffer_steps_from_f64(v: f64) -> KvResult<usize> {
  count_from_f64("bufferSteps", v, MAX_BUFFER_STEPS)
}

pub struct ReplayLog {
  capacity: usize,
  batches: VecDeque<Logged>,
  bytes: usize,
}

impl ReplayLog {
  pub fn new(capacity: usize) -> ReplayLog {
    ReplayLog {
      capacity: capacity.max(1),
      batches: VecDeque::new(),
      bytes: 0,
    }
  }

  /// Appends a batch whose seq is one past the newest (the caller guarantees density).
  pub fn push(&mut self, batch: Logged) {
    debug_assert!(self.newest_seq().is_none_or(|s| batch.seq == s + 1));
    if self.batches.len() == self.capacity {
      if let Some(old) = self.batches.pop_front() {
        self.bytes -= old.payload.len();
      }
    }
    self.bytes += batch.payload.len();
    self.batches.push_back(batch);
  }

  /// Forgets every batch (after a seq gap the log cannot bridge).
  pub fn clear(&mut self) {
    self.batches.clear();
    self.bytes = 0;
  }

  /// Payload bytes held.
  pub fn bytes(&self) -> usize {
    self.bytes
  }

  pub fn oldest_seq(&self) -> Option<u64> {
    self.batches.front().map(|b| b.seq)
  }

  pub fn newest_seq(&self) -> Option<u64> {
    self.batches.back().map(|b| b.seq)
  }

  pub fn len(&self) -> usize {
    self.batches.len()
  }

  pub fn is_empty(&self) -> bool {
    self.batches.is_empty()
  }

  /// Batches with `start <= seq <= end` that are still retained.
  pub fn range(&self, start: u64, end: u64) -> Vec<Logged> {
    let Some(oldest) = self.oldest_seq() else {
      return Vec::new();
    };
    let from = start.saturating_sub(oldest) as usize;
    let to = (end.saturating_sub(oldest) as usize).min(self.batches.len().saturating_sub(1));
    if start > end || from >= self.batches.len() || end < oldest {
      return Vec::new();
    }
    self.batches.range(from..=to).cloned().collect()
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn batch(seq: u64) -> Logged {
    Logged {
      seq,
      payload: Arc::new(vec![seq as u8; 3]),
    }
  }

  #[test]
  fn keeps_the_newest_batches_and_addresses_them_by_seq() {
    let mut log = ReplayLog::new(3);
    for s in 1..=5 {
      log.push(batch(s));
    }
    assert_eq!(
      (log.oldest_seq(), log.newest_seq(), log.len()),
      (Some(3), Some(5), 3)
    );
    assert_eq!(log.bytes(), 9);
    let seqs = |v: Vec<Logged>| v.iter().map(|b| b.seq).collect::<Vec<_>>();
    assert_eq!(seqs(log.range(4, 10)), vec![4, 5]);
    assert_eq!(seqs(log.range(1, 3)), vec![3]);
    assert_eq!(seqs(log.range(5, 5)), vec![5]);
    assert!(log.range(6, 9).is_empty());
    assert!(log.range(1, 2).is_empty());
  }
}
