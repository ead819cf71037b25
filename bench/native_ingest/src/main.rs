//! Receives the router bench's node streams (bench/router_nodes.mjs) in Rust and applies every
//! payload to a `RouterIndex` on the same thread, then prints its CPU seconds and events per
//! CPU-second, to compare with `bench/router.mjs`'s figures for `kvplane indexer` and Dynamo.
//! In-order streams only (the nodes send every seq from 0 with an unbounded HWM): a gap is
//! reported, not recovered.
//!
//!   cargo run --release --manifest-path bench/native_ingest/Cargo.toml -- [WORKERS] [SEED] [PRIVATE_CHAINS]

use kvplane_core::codec::Dialect;
use kvplane_core::router::RouterIndex;
use std::cell::RefCell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};
use zeromq::{Socket, SocketRecv};

/// This process's CPU seconds (user + system, all threads).
fn cpu_seconds() -> f64 {
  // SAFETY: getrusage writes into the zeroed struct it is given.
  let mut u: libc::rusage = unsafe { std::mem::zeroed() };
  unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
  let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
  t(u.ru_utime) + t(u.ru_stime)
}

/// A number field of the nodes' first JSON line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
  let at = line.find(&format!("\"{name}\":")).expect("field") + name.len() + 3;
  &line[at..]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
  let args: Vec<String> = std::env::args().skip(1).collect();
  let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
  let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
  let mut nodes = Command::new("node")
    .args(["bench/router_nodes.mjs", &arg(0, "64"), &arg(1, "1"), &arg(2, "32")])
    .current_dir(root)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("node bench/router_nodes.mjs");
  let mut out = BufReader::new(nodes.stdout.take().expect("stdout"));
  let mut line = String::new();
  out.read_line(&mut line).expect("the nodes' endpoints");
  let list = field(&line, "endpoints");
  let endpoints: Vec<String> = list[1..list.find(']').expect("list")]
    .split(',')
    .map(|s| s.trim_matches('"').to_string())
    .collect();
  let events: u64 = field(&line, "events").split(',').next().unwrap().parse().unwrap();

  let index = Rc::new(RefCell::new(RouterIndex::new(16).unwrap()));
  let applied = Rc::new(RefCell::new(0u64));
  let gaps = Rc::new(RefCell::new(0u64));
  let mut sockets = Vec::new();
  for ep in &endpoints {
    let mut s = zeromq::SubSocket::new();
    s.connect(ep).await.expect("connect");
    s.subscribe("").await.expect("subscribe");
    sockets.push(s);
  }
  tokio::time::sleep(Duration::from_millis(1000)).await;
  let (cpu0, t0) = (cpu_seconds(), Instant::now());
  nodes.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
  let local = tokio::task::LocalSet::new();
  for (w, mut s) in sockets.into_iter().enumerate() {
    let (index, applied, gaps) = (index.clone(), applied.clone(), gaps.clone());
    local.spawn_local(async move {
      let mut next = 0u64;
      while let Ok(m) = s.recv().await {
        let frames = m.into_vec();
        let seq = u64::from_be_bytes(frames[1][..8].try_into().unwrap());
        if seq != next {
          *gaps.borrow_mut() += 1;
        }
        next = seq + 1;
        let a = index
          .borrow_mut()
          .apply_payload(w as u64 + 1, 0, &frames[2], Dialect::Vllm)
          .expect("payload");
        *applied.borrow_mut() += a.events as u64;
      }
    });
  }
  local
    .run_until(async {
      while *applied.borrow() < events {
        tokio::time::sleep(Duration::from_millis(5)).await;
      }
    })
    .await;
  let cpu = cpu_seconds() - cpu0;
  let memberships = index.borrow().tier(kvplane_core::router::Tier::Device).stats().memberships;
  println!(
    "{{\"events\":{events},\"memberships\":{memberships},\"gaps\":{},\"cpu_s\":{cpu:.3},\"wall_s\":{:.3},\"events_per_cpu_s\":{:.0}}}",
    gaps.borrow(),
    t0.elapsed().as_secs_f64(),
    events as f64 / cpu
  );
  let _ = nodes.kill();
}
