//! The answer to a recovery request (docs/protocol.md#http-kv_recover).

use crate::event::Batch;
use crate::index::WorkerDump;

/// The answer to a recovery request for `start..=end`.
#[derive(Debug, Clone)]
pub enum Recovery {
  /// The range is in the log: batches `start..=min(end, last_seq)`, or the first of them when
  /// the answer is bounded, with `next_start` the seq to ask for next.
  Events {
    batches: Vec<Batch>,
    last_seq: u64,
    epoch: u64,
    next_start: Option<u64>,
  },
  /// `start` is older than the log (or absent): the whole index, as of `last_seq`.
  TreeDump {
    workers: Vec<WorkerDump>,
    last_seq: u64,
    epoch: u64,
  },
  /// `start` is past the newest batch.
  TooNew { last_seq: u64, epoch: u64 },
  /// `end < start`, or malformed parameters.
  InvalidRange {
    reason: String,
    last_seq: u64,
    epoch: u64,
  },
}

impl Recovery {
  /// The answer's name on the wire: `Events`, `TreeDump`, `TooNew` or `InvalidRange`.
  pub fn kind(&self) -> &'static str {
    match self {
      Recovery::Events { .. } => "Events",
      Recovery::TreeDump { .. } => "TreeDump",
      Recovery::TooNew { .. } => "TooNew",
      Recovery::InvalidRange { .. } => "InvalidRange",
    }
  }
}
