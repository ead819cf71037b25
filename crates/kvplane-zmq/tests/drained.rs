//! `Apply::drained`: a link says when it has relayed what was waiting at its socket, so work that
//! can wait for the end of a burst (telling JS) is done once per burst and never left undone.

use kvplane_zmq::{
  Apply, Deliver, Delivery, Endpoint, HandOff, Link, LinkOptions, PubOptions, Publisher, Reader,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
  Applied(u8),
  Drained,
}

struct Recorder(Arc<Mutex<Vec<Step>>>);

impl Apply for Recorder {
  fn apply(&mut self, payload: &[u8]) -> Result<u32, String> {
    self.0.lock().unwrap().push(Step::Applied(payload[0]));
    Ok(1)
  }

  fn drained(&mut self) {
    self.0.lock().unwrap().push(Step::Drained);
  }
}

/// Reads every hand-off at once (a follower with nothing to do), counting the batches.
struct Follower(Reader, Arc<AtomicU64>);

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

fn until(what: &str, mut f: impl FnMut() -> bool) {
  for _ in 0..500 {
    if f() {
      return;
    }
    std::thread::sleep(Duration::from_millis(10));
  }
  panic!("timed out waiting for {what}");
}

#[test]
fn a_link_says_it_drained_its_socket_after_every_burst() {
  let publisher = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
  let send = |seq: u64| {
    publisher.send(Arc::from(vec![
      Arc::new(Vec::new()),
      Arc::new(seq.to_be_bytes().to_vec()),
      Arc::new(vec![seq as u8; 100]),
    ]))
  };
  let log = Arc::new(Mutex::new(Vec::new()));
  let read = Reader::default();
  let handed = Arc::new(AtomicU64::new(0));
  let link = Link::spawn(
    LinkOptions::new(Endpoint::parse(publisher.endpoint()).unwrap()),
    Recorder(log.clone()),
    Follower(read.clone(), handed.clone()),
    read,
  );
  // Batches go to the follower while the gate is shut: once one has, the link is subscribed.
  let mut next = 0u64;
  until("the link to subscribe", || {
    send(next);
    next += 1;
    handed.load(Ordering::Relaxed) > 0
  });
  std::thread::sleep(Duration::from_millis(100));
  until("the gate to open", || link.reopen(next));
  let last = |log: &Vec<Step>| log.last().copied();
  for burst in 0..3u64 {
    log.lock().unwrap().clear();
    let seqs: Vec<u64> = (next + burst * 100..next + (burst + 1) * 100).collect();
    for &seq in &seqs {
      send(seq);
    }
    until("the burst to be applied", || {
      link.stats().batches == 100 * (burst + 1)
    });
    // Every batch applied in order, and the link said it drained after the last of them.
    until("the drain after the burst", || {
      last(&log.lock().unwrap()) == Some(Step::Drained)
    });
    let log = log.lock().unwrap();
    let applied: Vec<u8> = log
      .iter()
      .filter_map(|s| match s {
        Step::Applied(b) => Some(*b),
        Step::Drained => None,
      })
      .collect();
    let expected: Vec<u8> = seqs.iter().map(|&s| s as u8).collect();
    assert_eq!(applied, expected, "burst {burst}");
  }
}
