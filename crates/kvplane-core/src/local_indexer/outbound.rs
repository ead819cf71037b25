//! What leaves the indexer beside the reports its calls return. The live tap: each batch's
//! logged payload, handed over as it is logged, under the indexer's lock, so in seq order
//! whichever thread publishes (a native ZMQ publisher sends it from there). The deferred batches:
//! those published by a thread that has no consumer of its own (a native link relaying an
//! engine), kept in the outbox until the owner takes them, or its next call reports them first.
//! Batches enter the outbox under the indexer's lock, so in seq order; the owner may take them
//! without that lock (never waiting for a batch being applied).

use super::{Drained, LocalIndexer};
use crate::codec::Format;
use crate::stream::log::Payload;
use std::sync::{Arc, Mutex, MutexGuard};

/// The deferred batches, shared with whoever takes them.
#[derive(Clone, Default)]
pub struct Outbox(Arc<Mutex<Drained>>);

impl Outbox {
  fn lock(&self) -> MutexGuard<'_, Drained> {
    self.0.lock().unwrap_or_else(|p| p.into_inner())
  }

  /// The deferred batches, in seq order; none are kept after.
  pub fn take(&self) -> Drained {
    std::mem::take(&mut *self.lock())
  }
}

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

  /// The batches' payloads per format, one per batch in seq order: in each of `formats`, or, with
  /// `None`, in every format a batch carries (in the order they first appear). A batch encoded
  /// before its stream took up a format (a consumer that joined while it waited in the outbox)
  /// is re-encoded from its logged payload, so no consumer misses a batch or gets another's
  /// bytes. Nothing when there are no batches.
  pub fn into_payloads(self, formats: Option<&[Format]>) -> Vec<(Format, Vec<Payload>)> {
    let listed: Vec<Format> = match formats {
      Some(fs) => fs.to_vec(),
      None => self
        .batches
        .iter()
        .flat_map(|b| b.encodings.iter().map(|(f, _)| *f))
        .collect(),
    };
    let mut wanted: Vec<Format> = Vec::new();
    for f in listed {
      if !wanted.contains(&f) {
        wanted.push(f);
      }
    }
    if self.batches.is_empty() {
      return Vec::new();
    }
    let n = self.batches.len();
    let mut out: Vec<(Format, Vec<Payload>)> =
      wanted.iter().map(|&f| (f, Vec::with_capacity(n))).collect();
    for b in self.batches {
      for ((_, payloads), p) in out.iter_mut().zip(b.encodings.into_formats(b.seq, &wanted)) {
        payloads.push(p);
      }
    }
    out
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
    self.deferred.lock().extend(d);
  }

  /// The deferred batches, in seq order; none are kept after.
  pub fn take_deferred(&mut self) -> Drained {
    self.deferred.take()
  }

  /// The outbox, to take the deferred batches from without the indexer's lock.
  pub fn outbox(&self) -> Outbox {
    self.deferred.clone()
  }

  /// The deferred batches followed by `d`: what a call of the owner reports, so that it sees
  /// every batch in seq order.
  pub fn after_deferred(&mut self, d: Drained) -> Drained {
    let mut out = self.take_deferred();
    out.extend(d);
    out
  }
}
