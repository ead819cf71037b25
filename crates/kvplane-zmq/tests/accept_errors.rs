//! The native PUB's listener when the process runs out of file descriptors: its accepts fail for
//! a while, and it goes on accepting once descriptors are free again (it used to stop for good,
//! leaving the live endpoint unbound while the rest of the node served on). A file of its own: the
//! descriptor limit it lowers is the whole process's.

use kvplane_zmq::{zmtp, Message, PubOptions, Publisher};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn until(what: &str, f: impl Fn() -> bool) {
  let start = Instant::now();
  while !f() {
    assert!(
      start.elapsed() < Duration::from_secs(10),
      "timed out: {what}"
    );
    std::thread::sleep(Duration::from_millis(10));
  }
}

/// One ZMTP frame: flags and body.
fn frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
  let mut h = [0u8; 2];
  s.read_exact(&mut h).unwrap();
  assert_eq!(h[0] & zmtp::LONG, 0, "a short frame");
  let mut body = vec![0u8; h[1] as usize];
  s.read_exact(&mut body).unwrap();
  (h[0], body)
}

/// A SUB speaking the bytes by hand, subscribed to everything.
fn subscriber(addr: &str) -> TcpStream {
  let mut s = TcpStream::connect(addr).unwrap();
  s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
  let mut hello = zmtp::greeting().to_vec();
  zmtp::ready("SUB", &mut hello);
  zmtp::subscribe(b"", &mut hello);
  s.write_all(&hello).unwrap();
  let mut g = [0u8; zmtp::GREETING_LEN];
  s.read_exact(&mut g).unwrap();
  zmtp::check_greeting(&g).unwrap();
  let (flags, _) = frame(&mut s);
  assert_ne!(flags & zmtp::COMMAND, 0, "READY");
  s
}

fn descriptor_limit(cur: u64) -> libc::rlimit {
  let mut lim = libc::rlimit {
    rlim_cur: 0,
    rlim_max: 0,
  };
  // SAFETY: reads and sets this process's own limit through valid pointers.
  unsafe {
    assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
    let low = libc::rlimit {
      rlim_cur: cur.min(lim.rlim_max),
      rlim_max: lim.rlim_max,
    };
    assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
  }
  lim
}

#[test]
fn the_listener_accepts_again_once_descriptors_are_free() {
  let p = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
  let addr = p.endpoint().strip_prefix("tcp://").unwrap().to_string();
  let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
  let before = descriptor_limit(open + 24);
  // Connections until the process has no descriptor left: the listener's accepts fail meanwhile.
  let mut held = Vec::new();
  while let Ok(s) = TcpStream::connect(&addr) {
    held.push(s);
    assert!(held.len() < 1000, "the descriptor limit did not hold");
  }
  until("failed accepts", || p.stats().accept_errors > 0);
  drop(held);
  // SAFETY: restores the limit read above.
  unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &before), 0) };
  let mut s = subscriber(&addr);
  until("the subscriber accepted", || p.stats().peers >= 1);
  let msg: Message = Arc::from(vec![
    Arc::new(b"t".to_vec()),
    Arc::new(7u64.to_be_bytes().to_vec()),
  ]);
  // Peers of the held connections may still be going: sent until the subscriber has it.
  p.send(msg);
  let (_, topic) = frame(&mut s);
  assert_eq!(topic, b"t");
  assert!(p.stats().accept_errors > 0);
}
