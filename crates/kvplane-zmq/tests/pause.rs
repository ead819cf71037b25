//! The link thread's pause hook (`set_on_pause`): run once on that thread after each stretch of
//! batches applied (or messages sent by a publisher on it), never while nothing is done. The
//! binding hands the allocator's free memory back there.

mod common;

use common::{until, Follower};
use kvplane_zmq::{
  set_on_pause, Apply, Endpoint, Link, LinkOptions, PubOptions, Publisher, Reader,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static PAUSES: AtomicU64 = AtomicU64::new(0);
static THREAD: Mutex<Option<String>> = Mutex::new(None);

fn on_pause() {
  PAUSES.fetch_add(1, Ordering::SeqCst);
  *THREAD.lock().unwrap() = std::thread::current().name().map(String::from);
}

struct Count;

impl Apply for Count {
  fn apply(&mut self, _payload: &[u8]) -> Result<u32, String> {
    Ok(1)
  }
}

#[test]
fn the_pause_hook_runs_once_on_the_link_thread_after_each_stretch_of_work() {
  set_on_pause(on_pause);
  let publisher = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
  let send = |seq: u64| {
    publisher.send(Arc::from(vec![
      Arc::new(Vec::new()),
      Arc::new(seq.to_be_bytes().to_vec()),
      Arc::new(vec![seq as u8; 100]),
    ]))
  };
  let read = Reader::default();
  let handed = Arc::new(AtomicU64::new(0));
  let link = Link::spawn(
    LinkOptions::new(Endpoint::parse(publisher.endpoint()).unwrap()),
    Count,
    Follower(read.clone(), handed.clone()),
    read,
  );
  let mut next = 0u64;
  until("the link to subscribe", || {
    send(next);
    next += 1;
    handed.load(Ordering::Relaxed) > 0
  });
  std::thread::sleep(Duration::from_millis(100));
  until("the gate to open", || link.reopen(next));
  // The pause after subscribing (the publisher's sends are work too) is over before counting.
  std::thread::sleep(Duration::from_millis(2500));
  let before = PAUSES.load(Ordering::SeqCst);
  for stretch in 1..=2u64 {
    for _ in 0..100 {
      send(next);
      next += 1;
    }
    until("the stretch to be applied", || {
      link.stats().batches == 100 * stretch
    });
    until("the pause hook", || {
      PAUSES.load(Ordering::SeqCst) == before + stretch
    });
    // Nothing applied since: the hook does not run again.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(PAUSES.load(Ordering::SeqCst), before + stretch);
  }
  assert_eq!(THREAD.lock().unwrap().as_deref(), Some("kvplane-zmq"));
}
