//! The link thread's pause hook (`set_on_pause`): run once on that thread after each stretch of
//! batches applied (or messages sent by a publisher on it), the time it is given after the last,
//! never while nothing is done. The binding hands the allocator's free memory back there.

mod common;

use common::{open_link, send, until};
use kvplane_zmq::{set_on_pause, Apply, PubOptions, Publisher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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
  set_on_pause(Duration::from_secs(1), on_pause);
  let publisher = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
  let (link, mut next) = open_link(&publisher, Count);
  // The pause after subscribing (the publisher's sends are work too) is over before counting.
  std::thread::sleep(Duration::from_millis(2500));
  let before = PAUSES.load(Ordering::SeqCst);
  for stretch in 1..=2u64 {
    for _ in 0..100 {
      send(&publisher, next);
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
