//! What the link tests share: a follower with nothing to do, and a wait with a deadline.

use kvplane_zmq::{Deliver, Delivery, HandOff, Reader};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads every hand-off at once (a follower with nothing to do), counting the batches.
pub struct Follower(pub Reader, pub Arc<AtomicU64>);

impl Deliver for Follower {
  fn deliver(&self, d: Delivery) {
    if let Delivery::HandOff(_, h) = d {
      if let HandOff::Batch { .. } = h {
        self.1.fetch_add(1, Ordering::Relaxed);
      }
      self.0.read_one();
    }
  }
}

/// Waits up to 5 s for `f` to hold.
pub fn until(what: &str, mut f: impl FnMut() -> bool) {
  for _ in 0..500 {
    if f() {
      return;
    }
    std::thread::sleep(Duration::from_millis(10));
  }
  panic!("timed out waiting for {what}");
}
