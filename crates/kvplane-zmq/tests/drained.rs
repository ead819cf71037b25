//! `Apply::drained`: a link says when it has relayed what was waiting at its socket, so work that
//! can wait for the end of a burst (telling JS) is done once per burst and never left undone.

mod common;

use common::{open_link, send, until, Follower};
use kvplane_zmq::{Apply, Endpoint, Link, LinkOptions, PubOptions, Publisher, Reader};
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

#[test]
fn a_link_says_it_drained_its_socket_after_every_burst() {
  let publisher = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
  let send = |seq: u64| send(&publisher, seq);
  let log = Arc::new(Mutex::new(Vec::new()));
  let (link, next) = open_link(&publisher, Recorder(log.clone()));
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

/// The bytes of a live message `[topic, seq, payload]`, its payload `seq as u8` x 100.
fn message(seq: u64) -> Vec<u8> {
  use kvplane_zmq::zmtp;
  let mut out = Vec::new();
  let frames: [Vec<u8>; 3] = [Vec::new(), seq.to_be_bytes().to_vec(), vec![seq as u8; 100]];
  for (i, f) in frames.iter().enumerate() {
    let flags = if i < 2 { zmtp::MORE } else { 0 };
    zmtp::frame_header(flags, f.len(), &mut out);
    out.extend_from_slice(f);
  }
  out
}

#[test]
fn a_link_says_it_drained_when_only_part_of_the_next_message_has_come() {
  use kvplane_zmq::zmtp;
  use std::io::{Read, Write};
  // A publisher written by hand, so that a message can be sent in two parts.
  let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
  let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
  let log = Arc::new(Mutex::new(Vec::new()));
  let read = Reader::default();
  let handed = Arc::new(AtomicU64::new(0));
  let link = Link::spawn(
    LinkOptions::new(Endpoint::parse(&endpoint).unwrap()),
    Recorder(log.clone()),
    Follower(read.clone(), handed.clone()),
    read,
  );
  let (mut s, _) = listener.accept().unwrap();
  let mut hello = zmtp::greeting().to_vec();
  zmtp::ready("PUB", &mut hello);
  s.write_all(&hello).unwrap();
  // The link's greeting, READY and subscription: read and let go.
  s.set_read_timeout(Some(Duration::from_millis(200)))
    .unwrap();
  let mut sink = [0u8; 256];
  while s.read(&mut sink).is_ok_and(|n| n > 0) {}
  let mut next = 0u64;
  until("the link to take batches", || {
    s.write_all(&message(next)).unwrap();
    next += 1;
    handed.load(Ordering::Relaxed) > 0
  });
  std::thread::sleep(Duration::from_millis(100));
  until("the gate to open", || link.reopen(next));
  log.lock().unwrap().clear();
  // A whole batch and the first half of the next, in one write.
  let (a, b) = (message(next), message(next + 1));
  let half = b.len() / 2;
  s.write_all(&[&a[..], &b[..half]].concat()).unwrap();
  until("the drain after the whole batch", || {
    log.lock().unwrap().last() == Some(&Step::Drained)
  });
  assert_eq!(
    *log.lock().unwrap(),
    vec![Step::Applied(next as u8), Step::Drained]
  );
  s.write_all(&b[half..]).unwrap();
  until("the rest of the batch", || {
    let log = log.lock().unwrap();
    log.len() == 4 && log.last() == Some(&Step::Drained)
  });
  assert_eq!(
    *log.lock().unwrap(),
    vec![
      Step::Applied(next as u8),
      Step::Drained,
      Step::Applied(next as u8 + 1),
      Step::Drained
    ]
  );
}
