//! What the link tests share: a follower with nothing to do, a link opened to a publisher, and a
//! wait with a deadline.

use kvplane_zmq::{
  Apply, Deliver, Delivery, Endpoint, HandOff, Link, LinkOptions, Publisher, Reader,
};
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

/// Sends live message `[topic, seq, payload]`, its payload `seq as u8` x 100.
pub fn send(publisher: &Publisher, seq: u64) {
  publisher.send(Arc::from(vec![
    Arc::new(Vec::new()),
    Arc::new(seq.to_be_bytes().to_vec()),
    Arc::new(vec![seq as u8; 100]),
  ]));
}

/// A link to `publisher` applying through `apply`, subscribed and with its gate open: the seq its
/// next batch applied will have. Batches go to the follower while the gate is shut: once one has,
/// the link is subscribed.
pub fn open_link<A: Apply + Send + 'static>(publisher: &Publisher, apply: A) -> (Link, u64) {
  let read = Reader::default();
  let handed = Arc::new(AtomicU64::new(0));
  let link = Link::spawn(
    LinkOptions::new(Endpoint::parse(publisher.endpoint()).unwrap()),
    apply,
    Follower(read.clone(), handed.clone()),
    read,
  );
  let mut next = 0u64;
  until("the link to subscribe", || {
    send(publisher, next);
    next += 1;
    handed.load(Ordering::Relaxed) > 0
  });
  std::thread::sleep(Duration::from_millis(100));
  until("the gate to open", || link.reopen(next));
  (link, next)
}
