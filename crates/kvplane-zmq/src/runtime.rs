//! The one thread every link runs on: a single-threaded tokio runtime, started on first use. One
//! thread for all links keeps a router's ingest on one core and its index's lock uncontended.
//!
//! Once the thread's work pauses (batches were applied or messages sent, then none for the time
//! the binding gives), it runs the binding's pause hook once (`set_on_pause`): the binding hands
//! the allocator's free memory back there, on the thread that freed it and outside any lock. A
//! collection from another thread does not reach the memory this thread's allocator heap keeps,
//! and purging only after a delay (which the binding sets long, so that a steady stream never
//! waits for it) would leave a router's ingest burst resident until the thread allocates again.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::runtime::{Builder, Handle};

/// What runs on the thread once its work pauses, and how long without work makes a pause.
static ON_PAUSE: OnceLock<(Duration, fn())> = OnceLock::new();

/// Batches applied and messages sent on the thread, ever.
static WORK: AtomicU64 = AtomicU64::new(0);

/// How often the thread looks for a pause.
const TICK: Duration = Duration::from_millis(250);

/// Sets the pause hook: `f`, run once `after` the last work of a stretch (the first call wins).
pub fn set_on_pause(after: Duration, f: fn()) {
  let _ = ON_PAUSE.set((after, f));
}

/// Counts work done on the thread (`n` batches applied, or messages sent).
pub(crate) fn worked(n: usize) {
  WORK.fetch_add(n as u64, Relaxed);
}

pub fn handle() -> &'static Handle {
  static HANDLE: OnceLock<Handle> = OnceLock::new();
  HANDLE.get_or_init(|| {
    let rt = Builder::new_current_thread()
      .enable_io()
      .enable_time()
      .build()
      .expect("a tokio runtime for kvplane's ZMQ links");
    let handle = rt.handle().clone();
    handle.spawn(watch_pauses());
    std::thread::Builder::new()
      .name("kvplane-zmq".into())
      .spawn(move || rt.block_on(std::future::pending::<()>()))
      .expect("the kvplane-zmq thread");
    handle
  })
}

/// Runs the pause hook once after each stretch of work.
async fn watch_pauses() {
  let mut tick = tokio::time::interval(TICK);
  tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
  let (mut seen, mut busy, mut last) = (0, false, Instant::now());
  loop {
    tick.tick().await;
    let now = WORK.load(Relaxed);
    if now != seen {
      (seen, busy, last) = (now, true, Instant::now());
    } else if busy {
      if let Some(&(after, f)) = ON_PAUSE.get() {
        if last.elapsed() >= after {
          busy = false;
          f();
        }
      }
    }
  }
}
