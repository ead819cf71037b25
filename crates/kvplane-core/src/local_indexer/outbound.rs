//! What leaves the indexer beside the reports its calls return. The live tap: each batch's
//! logged payload, handed over as it is logged, under the indexer's lock, so in seq order
//! whichever thread publishes (a native ZMQ publisher sends it from there). The deferred batches:
//! those published by a thread that has no consumer of its own (a native link relaying an
//! engine), kept until the owner's next call, which reports them first.

use super::{Drained, LocalIndexer};
use crate::stream::log::Payload;

/// Takes each batch's logged payload as it is logged.
pub trait LiveTap: Send {
  fn logged(&mut self, seq: u64, payload: &Payload);
}

impl Drained {
  /// `other`'s batches after these.
  pub fn extend(&mut self, other: Drained) {
    self.batches.extend(other.batches);
    self.events += other.events;
    self.gaps += other.gaps;
  }
}

impl LocalIndexer {
  /// Sets (or with `None` removes) the live tap.
  pub fn set_live_tap(&mut self, tap: Option<Box<dyn LiveTap>>) {
    self.live = tap;
  }

  pub(super) fn tap(&mut self, seq: u64, payload: &Payload) {
    if let Some(t) = &mut self.live {
      t.logged(seq, payload);
    }
  }

  /// Keeps batches published off the owner's thread until it takes them.
  pub fn defer(&mut self, d: Drained) {
    self.deferred.extend(d);
  }

  /// The deferred batches, in seq order; none are kept after.
  pub fn take_deferred(&mut self) -> Drained {
    std::mem::take(&mut self.deferred)
  }

  /// The deferred batches followed by `d`: what a call of the owner reports, so that it sees
  /// every batch in seq order.
  pub fn after_deferred(&mut self, d: Drained) -> Drained {
    let mut out = self.take_deferred();
    out.extend(d);
    out
  }
}
