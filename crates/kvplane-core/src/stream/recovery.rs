//! The answer to a recovery request (docs/protocol.md#http-kv_recover).

use super::log::{Logged, Payload};
use crate::codec::{self, Dialect, Format};
use crate::event::Batch;
use crate::index::WorkerDump;
use std::sync::Arc;

/// The answer to a recovery request for `start..=end`.
#[derive(Debug, Clone, PartialEq)]
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

/// A recovery answer as taken under the publisher's lock: finished, or `Events` whose batches are
/// still the log's bytes (shared, not copied), decoded by `finish` after the lock is released.
#[derive(Debug)]
pub enum RecoveryCut {
  Done(Recovery),
  Logged {
    logged: Vec<Logged>,
    dialect: Dialect,
    last_seq: u64,
    epoch: u64,
    next_start: Option<u64>,
  },
}

impl RecoveryCut {
  /// The answer, its logged batches decoded.
  pub fn finish(self) -> Recovery {
    match self {
      RecoveryCut::Done(r) => r,
      RecoveryCut::Logged {
        logged,
        dialect,
        last_seq,
        epoch,
        next_start,
      } => Recovery::Events {
        batches: logged.iter().map(|l| decode_logged(l, dialect)).collect(),
        last_seq,
        epoch,
        next_start,
      },
    }
  }
}

/// A logged batch in `format`: its logged payload (in `dialect`) decoded and encoded again, the
/// bytes the live stream carried in that format.
pub(super) fn reencode_logged(l: &Logged, dialect: Dialect, format: Format) -> Payload {
  Arc::new(codec::encode(&decode_logged(l, dialect), format))
}

/// A logged batch, decoded, with its seq.
pub(super) fn decode_logged(l: &Logged, dialect: Dialect) -> Batch {
  let mut b = codec::decode(&l.payload, dialect)
    .expect("the log holds batches this stream encoded")
    .batches
    .remove(0);
  b.seq = l.seq;
  b
}
