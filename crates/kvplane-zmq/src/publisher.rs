//! A PUB socket in Rust: binds a TCP or IPC endpoint, speaks ZMTP 3.0 (NULL mechanism) to each
//! SUB that connects, keeps its subscriptions and sends it the messages they match. Each peer
//! has a queue of at most `hwm` messages; a message that finds it full is dropped for that peer
//! (counted), as libzmq's PUB drops at its high-water mark, and the peer sees the seq gap. Sends
//! never block: whoever sends (a link applying a batch, or JS) only queues.

use crate::link::read_frame;
use crate::runtime;
use crate::zmtp;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::os::unix::net::UnixListener as StdUnixListener;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A message: its frames, shared by every peer it is queued for.
pub type Message = Arc<[Arc<Vec<u8>>]>;

#[derive(Debug, Clone)]
pub struct PubOptions {
  /// Messages queued per peer, at most.
  pub hwm: usize,
  pub handshake_timeout: Duration,
  /// A peer frame (a subscription) larger than this ends its connection.
  pub max_frame: usize,
  /// Distinct subscriptions a peer may hold, and their bytes in all; past either its connection
  /// ends (counted). Every message is matched against each of a peer's subscriptions, so without
  /// a bound one peer could slow every send and hold any amount of memory.
  pub max_subscriptions: usize,
  pub max_subscription_bytes: usize,
}

impl Default for PubOptions {
  fn default() -> Self {
    PubOptions {
      hwm: 10_000,
      handshake_timeout: Duration::from_secs(5),
      max_frame: 64 << 10,
      max_subscriptions: 256,
      max_subscription_bytes: 64 << 10,
    }
  }
}

#[derive(Debug, Clone, Default)]
pub struct PubStats {
  /// Peers past the handshake.
  pub peers: u64,
  /// Messages sent (queued for the peers subscribed to them).
  pub sent: u64,
  /// Messages dropped for a peer whose queue was full, per peer.
  pub dropped: u64,
  /// Messages queued and not yet written, over all peers.
  pub queued: u64,
  /// Peers whose connection was ended for subscribing past `max_subscriptions` or
  /// `max_subscription_bytes`.
  pub refused_peers: u64,
  /// Connections the listener failed to accept (out of file descriptors, memory); it goes on.
  pub accept_errors: u64,
}

#[derive(Default)]
struct Queue {
  msgs: VecDeque<Message>,
  /// Each prefix subscribed, once however often it came (as libzmq's PUB keeps them: a SUB counts
  /// its own subscriptions and sends the cancel when the last goes, and one cancel removes it).
  subs: Vec<Vec<u8>>,
  /// The prefixes' bytes in all.
  sub_bytes: usize,
  /// Messages taken by the writer and not yet written.
  writing: usize,
}

struct Peer {
  queue: Mutex<Queue>,
  wake: Notify,
}

impl Peer {
  fn queue(&self) -> MutexGuard<'_, Queue> {
    self.queue.lock().unwrap_or_else(|p| p.into_inner())
  }
}

struct Shared {
  opts: PubOptions,
  peers: Mutex<Vec<Arc<Peer>>>,
  tasks: Mutex<Vec<JoinHandle<()>>>,
  sent: AtomicU64,
  dropped: AtomicU64,
  refused_peers: AtomicU64,
  accept_errors: AtomicU64,
}

impl Shared {
  fn peers(&self) -> MutexGuard<'_, Vec<Arc<Peer>>> {
    self.peers.lock().unwrap_or_else(|p| p.into_inner())
  }
}

/// A bound PUB socket; closed when dropped.
pub struct Publisher {
  shared: Arc<Shared>,
  accept: JoinHandle<()>,
  endpoint: String,
  ipc_path: Option<String>,
}

enum Listener {
  Tcp(StdTcpListener),
  Ipc(StdUnixListener),
}

/// Where a publisher binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindAddr {
  Tcp(SocketAddr),
  Ipc(String),
}

/// Parses a bind endpoint as ZMQ writes it: `tcp://HOST:PORT` (`*` for every interface, port
/// `*` or 0 for one the OS chooses) or `ipc://PATH`. `None` for anything else.
pub fn parse_bind(endpoint: &str) -> Option<BindAddr> {
  if let Some(path) = endpoint.strip_prefix("ipc://") {
    return (!path.is_empty() && path != "*").then(|| BindAddr::Ipc(path.to_string()));
  }
  let rest = endpoint.strip_prefix("tcp://")?;
  let (host, port) = rest.rsplit_once(':')?;
  let host = host.trim_start_matches('[').trim_end_matches(']');
  let port: u16 = if port == "*" { 0 } else { port.parse().ok()? };
  let ip = match host {
    "*" => "0.0.0.0".parse().ok()?,
    "localhost" => "127.0.0.1".parse().ok()?,
    h => h.parse().ok()?,
  };
  Some(BindAddr::Tcp(SocketAddr::new(ip, port)))
}

impl Publisher {
  /// Binds `endpoint` (see `parse_bind`); the error says why it cannot be bound.
  pub fn bind(endpoint: &str, opts: PubOptions) -> io::Result<Publisher> {
    let invalid = || {
      io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{endpoint}: a native publisher binds tcp://HOST:PORT or ipc://PATH"),
      )
    };
    let (listener, bound, ipc_path) = match parse_bind(endpoint).ok_or_else(invalid)? {
      BindAddr::Tcp(addr) => {
        let l = StdTcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let a = l.local_addr()?;
        let bound = match a {
          SocketAddr::V6(v6) => format!("tcp://[{}]:{}", v6.ip(), v6.port()),
          SocketAddr::V4(v4) => format!("tcp://{}:{}", v4.ip(), v4.port()),
        };
        (Listener::Tcp(l), bound, None)
      }
      BindAddr::Ipc(path) => {
        // As libzmq does: a socket file left by an earlier process is replaced.
        let _ = std::fs::remove_file(&path);
        let l = StdUnixListener::bind(&path)?;
        l.set_nonblocking(true)?;
        (Listener::Ipc(l), format!("ipc://{path}"), Some(path))
      }
    };
    let shared = Arc::new(Shared {
      opts,
      peers: Mutex::new(Vec::new()),
      tasks: Mutex::new(Vec::new()),
      sent: AtomicU64::new(0),
      dropped: AtomicU64::new(0),
      refused_peers: AtomicU64::new(0),
      accept_errors: AtomicU64::new(0),
    });
    let accept = runtime::handle().spawn(accept(listener, shared.clone()));
    Ok(Publisher {
      shared,
      accept,
      endpoint: bound,
      ipc_path,
    })
  }

  /// The endpoint as bound (with the port the OS chose).
  pub fn endpoint(&self) -> &str {
    &self.endpoint
  }

  /// Queues `msg` for every peer subscribed to its first frame; never blocks.
  pub fn send(&self, msg: Message) {
    self.shared.sent.fetch_add(1, Relaxed);
    let first: &[u8] = msg.first().map(|f| f.as_slice()).unwrap_or_default();
    for peer in self.shared.peers().iter() {
      let mut q = peer.queue();
      if !q.subs.iter().any(|s| first.starts_with(s)) {
        continue;
      }
      if q.msgs.len() >= self.shared.opts.hwm {
        self.shared.dropped.fetch_add(1, Relaxed);
        continue;
      }
      q.msgs.push_back(msg.clone());
      drop(q);
      peer.wake.notify_one();
    }
  }

  pub fn stats(&self) -> PubStats {
    let peers = self.shared.peers();
    let queued = peers
      .iter()
      .map(|p| {
        let q = p.queue();
        (q.msgs.len() + q.writing) as u64
      })
      .sum();
    PubStats {
      peers: peers.len() as u64,
      sent: self.shared.sent.load(Relaxed),
      dropped: self.shared.dropped.load(Relaxed),
      queued,
      refused_peers: self.shared.refused_peers.load(Relaxed),
      accept_errors: self.shared.accept_errors.load(Relaxed),
    }
  }

  /// Stops accepting and closes every connection (what is still queued is lost: wait for
  /// `stats().queued` to reach 0 first to linger).
  pub fn close(&self) {
    self.accept.abort();
    for t in self
      .shared
      .tasks
      .lock()
      .unwrap_or_else(|p| p.into_inner())
      .drain(..)
    {
      t.abort();
    }
    self.shared.peers().clear();
    if let Some(path) = &self.ipc_path {
      let _ = std::fs::remove_file(path);
    }
  }
}

impl Drop for Publisher {
  fn drop(&mut self) {
    self.close();
  }
}

/// How long the listener waits after failing to accept a connection before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accepts peers until the publisher closes. A failed accept is counted and retried (ending here
/// would leave the endpoint unbound for good while every other part of the node serves on): at
/// once when only that connection failed (reset or aborted before it was taken), after
/// `ACCEPT_RETRY` when the process is out of something (file descriptors, memory) that a retry
/// at once would only fail on again.
async fn accept(listener: Listener, shared: Arc<Shared>) {
  let failed = |shared: &Shared, e: io::Error| {
    shared.accept_errors.fetch_add(1, Relaxed);
    let theirs = matches!(
      e.kind(),
      io::ErrorKind::ConnectionAborted
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::Interrupted
    );
    tokio::time::sleep(if theirs { Duration::ZERO } else { ACCEPT_RETRY })
  };
  match listener {
    Listener::Tcp(l) => {
      let Ok(l) = tokio::net::TcpListener::from_std(l) else {
        return;
      };
      loop {
        match l.accept().await {
          Ok((s, _)) => {
            let _ = s.set_nodelay(true);
            spawn_peer(s, &shared);
          }
          Err(e) => failed(&shared, e).await,
        }
      }
    }
    Listener::Ipc(l) => {
      let Ok(l) = tokio::net::UnixListener::from_std(l) else {
        return;
      };
      loop {
        match l.accept().await {
          Ok((s, _)) => spawn_peer(s, &shared),
          Err(e) => failed(&shared, e).await,
        }
      }
    }
  }
}

fn spawn_peer<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(s: S, shared: &Arc<Shared>) {
  let t = tokio::spawn(peer(s, shared.clone()));
  let mut tasks = shared.tasks.lock().unwrap_or_else(|p| p.into_inner());
  tasks.retain(|t| !t.is_finished());
  tasks.push(t);
}

/// One subscriber: the handshake, then its subscriptions read on one task while its queue is
/// written on this one, until either side ends.
async fn peer<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(s: S, shared: Arc<Shared>) {
  let (r, mut w) = tokio::io::split(s);
  let mut r = BufReader::new(r);
  let max = shared.opts.max_frame;
  let hello = tokio::time::timeout(shared.opts.handshake_timeout, async {
    let mut hello = zmtp::greeting().to_vec();
    zmtp::ready("PUB", &mut hello);
    w.write_all(&hello).await?;
    let mut g = [0u8; zmtp::GREETING_LEN];
    r.read_exact(&mut g).await?;
    let bad = |e: zmtp::ZmtpError| io::Error::new(io::ErrorKind::InvalidData, e.0);
    zmtp::check_greeting(&g).map_err(bad)?;
    let (flags, body) = read_frame(&mut r, max).await?;
    if flags & zmtp::COMMAND == 0 {
      return Err(io::Error::new(io::ErrorKind::InvalidData, "no READY"));
    }
    let kind = zmtp::peer_socket_type(&body).map_err(bad)?;
    if kind != "SUB" && kind != "XSUB" {
      return Err(io::Error::new(io::ErrorKind::InvalidData, "not a SUB"));
    }
    Ok(())
  })
  .await;
  if !matches!(hello, Ok(Ok(()))) {
    return;
  }
  let peer = Arc::new(Peer {
    queue: Mutex::new(Queue::default()),
    wake: Notify::new(),
  });
  shared.peers().push(peer.clone());
  // The connection lasts while its reader does: once the peer leaves or is cut off, the writer
  // is dropped where it stands, a write blocked on a peer that stopped reading with it.
  let _ = unless(
    write_queued(&mut w, &peer),
    subscriptions(r, peer.clone(), shared.clone()),
  )
  .await;
  shared.peers().retain(|p| !Arc::ptr_eq(p, &peer));
}

/// Writes what is queued for `peer` as it comes, until a write fails.
async fn write_queued<W: AsyncWrite + Unpin>(w: &mut W, peer: &Peer) -> io::Result<()> {
  let mut buf = Vec::with_capacity(64 << 10);
  loop {
    let batch: Vec<Message> = {
      let mut q = peer.queue();
      let batch: Vec<Message> = q.msgs.drain(..).collect();
      q.writing = batch.len();
      batch
    };
    if batch.is_empty() {
      peer.wake.notified().await;
      continue;
    }
    write_messages(w, &batch, &mut buf).await?;
    crate::runtime::worked(batch.len());
    peer.queue().writing = 0;
  }
}

/// `fut`'s output, or `None` if `stop` completes first (`fut` is then dropped).
async fn unless<F: Future>(fut: F, stop: impl Future<Output = ()>) -> Option<F::Output> {
  let mut fut = std::pin::pin!(fut);
  let mut stop = std::pin::pin!(stop);
  std::future::poll_fn(|cx| {
    if let Poll::Ready(v) = fut.as_mut().poll(cx) {
      return Poll::Ready(Some(v));
    }
    if stop.as_mut().poll(cx).is_ready() {
      return Poll::Ready(None);
    }
    Poll::Pending
  })
  .await
}

/// Writes messages as ZMTP frames: small frames gathered in `buf`, large ones written as they are.
async fn write_messages<W: AsyncWrite + Unpin>(
  w: &mut W,
  batch: &[Message],
  buf: &mut Vec<u8>,
) -> io::Result<()> {
  buf.clear();
  for msg in batch {
    for (i, f) in msg.iter().enumerate() {
      let flags = if i + 1 < msg.len() { zmtp::MORE } else { 0 };
      zmtp::frame_header(flags, f.len(), buf);
      if f.len() <= 16 << 10 {
        buf.extend_from_slice(f);
      } else {
        w.write_all(buf).await?;
        buf.clear();
        w.write_all(f).await?;
      }
    }
    if buf.len() >= 64 << 10 {
      w.write_all(buf).await?;
      buf.clear();
    }
  }
  if !buf.is_empty() {
    w.write_all(buf).await?;
  }
  w.flush().await
}

/// Reads a peer's subscriptions (ZMTP 3.0's form: `0x01` + prefix subscribes, `0x00` + prefix
/// cancels one) until it goes, or until its subscriptions pass `max_subscriptions` or
/// `max_subscription_bytes`.
async fn subscriptions<R: AsyncRead + Unpin>(mut r: R, peer: Arc<Peer>, shared: Arc<Shared>) {
  while let Ok((flags, body)) = read_frame(&mut r, shared.opts.max_frame).await {
    if flags & zmtp::COMMAND != 0 {
      continue;
    }
    let mut q = peer.queue();
    match body.split_first() {
      Some((1, prefix)) => {
        if q.subs.iter().any(|s| s == prefix) {
          continue;
        } else if q.subs.len() >= shared.opts.max_subscriptions
          || q.sub_bytes + prefix.len() > shared.opts.max_subscription_bytes
        {
          shared.refused_peers.fetch_add(1, Relaxed);
          break;
        } else {
          q.sub_bytes += prefix.len();
          q.subs.push(prefix.to_vec());
        }
      }
      Some((0, prefix)) => {
        if let Some(i) = q.subs.iter().position(|s| s == prefix) {
          q.sub_bytes -= q.subs.remove(i).len();
        }
      }
      _ => {}
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use std::io::{Read, Write};
  use std::net::TcpStream;

  fn frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    let len = if h[0] & zmtp::LONG != 0 {
      let mut rest = [0u8; 7];
      s.read_exact(&mut rest).unwrap();
      let mut b = [h[1], 0, 0, 0, 0, 0, 0, 0];
      b[1..].copy_from_slice(&rest);
      u64::from_be_bytes(b) as usize
    } else {
      h[1] as usize
    };
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (h[0], body)
  }

  /// A SUB peer speaking the bytes by hand, subscribed to `topic`.
  fn subscriber(p: &Publisher, topic: &[u8]) -> TcpStream {
    let addr = p.endpoint().strip_prefix("tcp://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = zmtp::greeting().to_vec();
    zmtp::ready("SUB", &mut hello);
    s.write_all(&hello).unwrap();
    let mut g = [0u8; zmtp::GREETING_LEN];
    s.read_exact(&mut g).unwrap();
    zmtp::check_greeting(&g).unwrap();
    let (flags, body) = frame(&mut s);
    assert_ne!(flags & zmtp::COMMAND, 0);
    assert_eq!(zmtp::peer_socket_type(&body).unwrap(), "PUB");
    let mut sub = Vec::new();
    zmtp::subscribe(topic, &mut sub);
    s.write_all(&sub).unwrap();
    s
  }

  fn msg(topic: &[u8], seq: u64, payload: Vec<u8>) -> Message {
    Arc::from(vec![
      Arc::new(topic.to_vec()),
      Arc::new(seq.to_be_bytes().to_vec()),
      Arc::new(payload),
    ])
  }

  fn until(f: impl Fn() -> bool) {
    for _ in 0..500 {
      if f() {
        return;
      }
      std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out");
  }

  #[test]
  fn parses_bind_endpoints() {
    assert_eq!(
      parse_bind("tcp://*:5557"),
      Some(BindAddr::Tcp("0.0.0.0:5557".parse().unwrap()))
    );
    assert_eq!(
      parse_bind("tcp://127.0.0.1:*"),
      Some(BindAddr::Tcp("127.0.0.1:0".parse().unwrap()))
    );
    assert_eq!(
      parse_bind("tcp://[::1]:9"),
      Some(BindAddr::Tcp("[::1]:9".parse().unwrap()))
    );
    assert_eq!(
      parse_bind("ipc:///tmp/x"),
      Some(BindAddr::Ipc("/tmp/x".into()))
    );
    assert_eq!(parse_bind("inproc://x"), None);
    assert_eq!(parse_bind("tcp://host.example:1"), None);
  }

  #[test]
  fn a_peer_past_its_subscription_caps_is_cut_off_and_counted_while_repeats_count_once() {
    let opts = PubOptions {
      max_subscriptions: 4,
      ..PubOptions::default()
    };
    let p = Publisher::bind("tcp://127.0.0.1:0", opts).unwrap();
    let mut fine = subscriber(&p, b"a");
    // The same prefix a hundred times is one subscription; four distinct ones are allowed.
    let mut subs = Vec::new();
    for _ in 0..100 {
      zmtp::subscribe(b"a", &mut subs);
    }
    for t in [b"b", b"c", b"d"] {
      zmtp::subscribe(t, &mut subs);
    }
    fine.write_all(&subs).unwrap();
    let mut greedy = subscriber(&p, b"x0");
    let mut more = Vec::new();
    for i in 1..5 {
      zmtp::subscribe(format!("x{i}").as_bytes(), &mut more);
    }
    greedy.write_all(&more).unwrap();
    until(|| p.stats().refused_peers == 1 && p.stats().peers == 1);
    until(|| {
      p.shared
        .peers()
        .iter()
        .all(|peer| peer.queue().subs.len() == 4 && peer.queue().sub_bytes == 4)
    });
    p.send(msg(b"a", 1, vec![1]));
    assert_eq!(frame(&mut fine).1, b"a");
    assert_eq!(frame(&mut fine).1, 1u64.to_be_bytes());
    assert_eq!(frame(&mut fine).1, [1]);
    let mut b = [0u8; 1];
    assert!(
      matches!(greedy.read(&mut b), Ok(0) | Err(_)),
      "the greedy peer's connection ended"
    );
    // One cancel removes a prefix however often it was subscribed (a SUB sends it once the last
    // of its own goes): "a" is sent no more, "b" still is. Its bytes are free again: 60,000 more
    // fit under the 64 KiB.
    let mut cancel = Vec::new();
    zmtp::frame_header(0, 2, &mut cancel);
    cancel.extend_from_slice(&[0, b'a']);
    zmtp::subscribe(&[b'z'; 60_000], &mut cancel);
    fine.write_all(&cancel).unwrap();
    until(|| {
      p.shared
        .peers()
        .iter()
        .any(|peer| peer.queue().sub_bytes == 60_003)
    });
    p.send(msg(b"a", 2, vec![2]));
    p.send(msg(b"b", 3, vec![3]));
    assert_eq!(frame(&mut fine).1, b"b");
    assert_eq!(p.stats().refused_peers, 1);
    // Two distinct subscriptions, but past the bytes a peer's subscriptions may hold in all.
    let mut wide = subscriber(&p, &[b'w'; 40_000]);
    let mut more = Vec::new();
    zmtp::subscribe(&[b'v'; 30_000], &mut more);
    wide.write_all(&more).unwrap();
    until(|| p.stats().refused_peers == 2 && p.stats().peers == 1);
    assert!(
      matches!(wide.read(&mut b), Ok(0) | Err(_)),
      "the wide peer's connection ended"
    );
  }

  #[test]
  fn a_peer_cut_off_while_its_write_is_blocked_is_let_go_at_once() {
    let opts = PubOptions {
      max_subscriptions: 1,
      ..PubOptions::default()
    };
    let p = Publisher::bind("tcp://127.0.0.1:0", opts).unwrap();
    let mut stalled = subscriber(&p, b"");
    until(|| {
      p.shared
        .peers()
        .iter()
        .any(|peer| !peer.queue().subs.is_empty())
    });
    // It reads nothing: 32 MiB is far more than the kernel buffers on both sides hold, so the
    // peer's writer waits in a write.
    for seq in 0..32 {
      p.send(msg(b"", seq, vec![7; 1 << 20]));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.stats().peers, 1);
    // Then it goes past its subscriptions and is cut off: its connection ends though the write
    // it waits in never would.
    let mut more = Vec::new();
    zmtp::subscribe(b"more", &mut more);
    stalled.write_all(&more).unwrap();
    until(|| p.stats().refused_peers == 1 && p.stats().peers == 0);
    let mut sink = vec![0u8; 1 << 20];
    loop {
      match stalled.read(&mut sink) {
        Ok(0) => break,
        Ok(_) => continue,
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
        Err(e) => panic!("the connection did not end: {e}"),
      }
    }
  }

  #[test]
  fn sends_what_each_subscription_matches_in_order() {
    let p = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
    let mut all = subscriber(&p, b"");
    let mut other = subscriber(&p, b"other");
    until(|| {
      let peers = p.shared.peers();
      peers.len() == 2 && peers.iter().all(|peer| !peer.queue().subs.is_empty())
    });
    for seq in 1..=50u64 {
      p.send(msg(b"kv", seq, vec![seq as u8; 300 * seq as usize]));
    }
    for seq in 1..=50u64 {
      let (f1, t) = frame(&mut all);
      assert_eq!((f1 & zmtp::MORE, t.as_slice()), (zmtp::MORE, &b"kv"[..]));
      let (_, s) = frame(&mut all);
      assert_eq!(u64::from_be_bytes(s[..].try_into().unwrap()), seq);
      let (f3, body) = frame(&mut all);
      assert_eq!(f3 & zmtp::MORE, 0);
      assert_eq!(body, vec![seq as u8; 300 * seq as usize]);
    }
    until(|| p.stats().queued == 0);
    // `other` matched nothing.
    other
      .set_read_timeout(Some(Duration::from_millis(100)))
      .unwrap();
    let mut b = [0u8; 1];
    assert!(other.read(&mut b).is_err());
    p.close();
  }

  #[test]
  fn a_full_queue_drops_and_counts() {
    let opts = PubOptions {
      hwm: 0,
      ..PubOptions::default()
    };
    let p = Publisher::bind("tcp://127.0.0.1:0", opts).unwrap();
    let _s = subscriber(&p, b"");
    until(|| {
      p.shared
        .peers()
        .iter()
        .any(|peer| !peer.queue().subs.is_empty())
    });
    for seq in 0..10 {
      p.send(msg(b"", seq, vec![1]));
    }
    let st = p.stats();
    assert_eq!((st.sent, st.dropped, st.queued), (10, 10, 0));
  }

  #[test]
  fn close_ends_every_connection_and_frees_the_port() {
    let p = Publisher::bind("tcp://127.0.0.1:0", PubOptions::default()).unwrap();
    let endpoint = p.endpoint().to_string();
    let mut s = subscriber(&p, b"");
    until(|| p.stats().peers == 1);
    p.close();
    let mut b = [0u8; 1];
    // Ended: an EOF, or a reset where the socket still held unread bytes.
    let ended = s.read(&mut b);
    assert!(
      matches!(&ended, Ok(0))
        || matches!(&ended, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
      "{ended:?}"
    );
    until(|| Publisher::bind(&endpoint, PubOptions::default()).is_ok());
  }
}
