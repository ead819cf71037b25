//! A link: one SUB connection to a ZMQ publisher, kept up by itself, its live batches applied
//! here while the follower's gate is open and handed to the follower otherwise.

use crate::endpoint::Endpoint;
use crate::gate::{Gate, Held, Reopened, Route, Stint};
use crate::runtime;
use crate::zmtp;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

/// Applies a live batch's payload where it was read.
pub trait Apply: Send + 'static {
  /// The events applied, or why the payload could not be applied (then nothing was).
  fn apply(&mut self, payload: &[u8]) -> Result<u32, String>;
}

/// What the follower is handed.
#[derive(Debug)]
pub enum HandOff {
  /// A live batch: `[topic, seq, payload]`.
  Batch { seq: u64, payload: Vec<u8> },
  /// The connection is up (the peer answered the handshake).
  Connected,
  /// The connection was lost.
  Disconnected { reason: String },
  /// A message that was not `[topic, 8-byte seq, payload]`: its frame count.
  Malformed { frames: u32 },
}

#[derive(Debug)]
pub enum Delivery {
  /// A hand-off, with what was applied here since the last one (the follower takes that up
  /// first). The receiver calls [`Reader::read_one`] for each, on its own thread, before acting.
  HandOff(Stint, HandOff),
  /// Batches were applied here since the last delivery (at most one every 250 ms).
  Progress,
}

/// Queues deliveries for the follower; never blocks.
pub trait Deliver: Send + Sync + 'static {
  fn deliver(&self, d: Delivery);
}

#[derive(Debug, Clone)]
pub struct LinkOptions {
  pub endpoint: Endpoint,
  pub topic: Vec<u8>,
  /// The first reconnect's wait; doubled per failure up to `reconnect_max`.
  pub reconnect_min: Duration,
  pub reconnect_max: Duration,
  /// How long the peer has to answer the handshake.
  pub handshake_timeout: Duration,
  /// A frame larger than this ends the connection (it is re-established).
  pub max_frame: usize,
  /// Live batches handed to the follower and not read yet, at most; more are dropped (counted),
  /// as a ZMQ receive HWM drops them, and the follower sees the gap.
  pub max_unread: u64,
}

impl LinkOptions {
  pub fn new(endpoint: Endpoint) -> Self {
    LinkOptions {
      endpoint,
      topic: Vec::new(),
      reconnect_min: Duration::from_millis(100),
      reconnect_max: Duration::from_millis(100),
      handshake_timeout: Duration::from_secs(5),
      max_frame: 256 << 20,
      max_unread: 10_000,
    }
  }
}

#[derive(Debug, Clone, Default)]
pub struct LinkStats {
  pub connected: bool,
  /// Handshakes completed.
  pub connects: u64,
  /// Batches and their events applied here.
  pub batches: u64,
  pub events: u64,
  /// When a batch was last applied here (ms since the Unix epoch), or 0.
  pub last_applied_ms: u64,
  /// Live batches dropped because the follower had `max_unread` unread.
  pub dropped: u64,
  /// Whether batches are being applied here now.
  pub gate_open: bool,
  /// The last seq applied here since the follower was last handed something, or `None`.
  pub stint_last_seq: Option<u64>,
  /// Held batches skipped because the follower had applied them from a replay.
  pub duplicates: u64,
  /// Why the last connection attempt or connection failed.
  pub last_error: Option<String>,
}

/// The gate and what applies batches, under one lock: whichever thread applies (the link's, or
/// the follower's when it reopens the gate), batches are applied in the gate's order.
struct Inner {
  gate: Gate,
  apply: Box<dyn Apply>,
  /// `None` once closed: what JS holds of the link must not keep the follower's callback (and
  /// so Node's event loop) alive.
  deliver: Option<Box<dyn Deliver>>,
}

struct Shared {
  inner: Mutex<Inner>,
  max_unread: u64,
  /// Hand-offs the follower has read.
  read: Reader,
  connected: AtomicBool,
  connects: AtomicU64,
  batches: AtomicU64,
  events: AtomicU64,
  last_applied_ms: AtomicU64,
  dropped: AtomicU64,
  last_error: Mutex<Option<String>>,
}

impl Shared {
  fn inner(&self) -> MutexGuard<'_, Inner> {
    self.inner.lock().unwrap_or_else(|p| p.into_inner())
  }

  fn set_error(&self, e: String) {
    *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
  }

  /// Applies a payload: its events, or `None` (a panic counts as not applied; the batch goes to
  /// the follower, which counts it).
  fn apply(inner: &mut Inner, payload: &[u8]) -> Option<u32> {
    match catch_unwind(AssertUnwindSafe(|| inner.apply.apply(payload))) {
      Ok(Ok(events)) => Some(events),
      _ => None,
    }
  }

  fn count_applied(&self, events: u32) {
    self.batches.fetch_add(1, Relaxed);
    self.events.fetch_add(events as u64, Relaxed);
  }

  /// Hands `h` to the follower, after the held batches.
  fn forward(&self, inner: &mut Inner, h: HandOff) {
    for (seq, payload) in inner.gate.take_held() {
      self.hand_off(inner, HandOff::Batch { seq, payload });
    }
    self.hand_off(inner, h);
  }

  /// Queues one hand-off. A live batch beyond `max_unread` unread is dropped instead (counted):
  /// the follower sees the gap it leaves.
  fn hand_off(&self, inner: &mut Inner, h: HandOff) {
    let gate = &mut inner.gate;
    let full = gate.unread(self.read.0.load(Relaxed)) >= self.max_unread;
    let seq = match &h {
      HandOff::Batch { seq, .. } => Some(*seq),
      _ => None,
    };
    let stint = gate.hand_off(seq);
    if full && seq.is_some() {
      gate.hand_off_dropped(stint);
      self.dropped.fetch_add(1, Relaxed);
      return;
    }
    if let Some(d) = &inner.deliver {
      d.deliver(Delivery::HandOff(stint, h));
    }
  }

  /// Applies held batches in order; the first that does not apply goes to the follower, and
  /// the rest after it.
  fn apply_held(&self, inner: &mut Inner, held: Vec<Held>) {
    let mut rest = held.into_iter();
    while let Some((seq, payload)) = rest.next() {
      if let Some(events) = Shared::apply(inner, &payload) {
        inner.gate.applied(seq);
        self.count_applied(events);
        continue;
      }
      self.hand_off(inner, HandOff::Batch { seq, payload });
      for (seq, payload) in rest.by_ref() {
        self.hand_off(inner, HandOff::Batch { seq, payload });
      }
    }
  }
}

/// One SUB connection, on the shared link thread; closed when dropped.
pub struct Link {
  shared: Arc<Shared>,
  task: JoinHandle<()>,
}

impl Link {
  /// Starts following `opts.endpoint`: the gate is shut until the follower opens it. `read` is
  /// what the receiving side of `deliver` counts its hand-offs with.
  pub fn spawn(opts: LinkOptions, apply: impl Apply, deliver: impl Deliver, read: Reader) -> Link {
    let shared = Arc::new(Shared {
      inner: Mutex::new(Inner {
        gate: Gate::new(opts.max_unread as usize),
        apply: Box::new(apply),
        deliver: Some(Box::new(deliver)),
      }),
      max_unread: opts.max_unread,
      read,
      connected: AtomicBool::new(false),
      connects: AtomicU64::new(0),
      batches: AtomicU64::new(0),
      events: AtomicU64::new(0),
      last_applied_ms: AtomicU64::new(0),
      dropped: AtomicU64::new(0),
      last_error: Mutex::new(None),
    });
    let task = runtime::handle().spawn(run(opts, shared.clone()));
    Link { shared, task }
  }

  /// The follower has applied everything up to `next - 1`, holds nothing and expects `next`:
  /// batches from `next` on are applied here, once those already handed to it (if only in-order
  /// batches are) are read; what arrives meanwhile is held. False if something else is unread
  /// (it tries again after reading it).
  pub fn reopen(&self, next: u64) -> bool {
    let mut inner = self.shared.inner();
    // Under the gate's lock: no hand-off is queued meanwhile.
    match inner.gate.reopen(next, self.shared.read.0.load(Relaxed)) {
      Reopened::Shut => false,
      Reopened::Gap => {
        for (seq, payload) in inner.gate.take_held() {
          self
            .shared
            .hand_off(&mut inner, HandOff::Batch { seq, payload });
        }
        false
      }
      Reopened::Pending => true,
      Reopened::Open(held) => {
        self.shared.apply_held(&mut inner, held);
        true
      }
    }
  }

  /// The follower takes over without a hand-off: nothing more is applied here until it reopens
  /// the gate, and the held batches are handed to it. What was applied here since the last
  /// hand-off.
  pub fn shut(&self) -> Stint {
    let mut inner = self.shared.inner();
    let (stint, held) = inner.gate.shut();
    for (seq, payload) in held {
      self
        .shared
        .hand_off(&mut inner, HandOff::Batch { seq, payload });
    }
    stint
  }

  pub fn stats(&self) -> LinkStats {
    let s = &self.shared;
    let (gate_open, stint, duplicates) = {
      let i = s.inner();
      (i.gate.is_open(), i.gate.stint(), i.gate.duplicates())
    };
    LinkStats {
      connected: s.connected.load(Relaxed),
      connects: s.connects.load(Relaxed),
      batches: s.batches.load(Relaxed),
      events: s.events.load(Relaxed),
      last_applied_ms: s.last_applied_ms.load(Relaxed),
      dropped: s.dropped.load(Relaxed),
      gate_open,
      stint_last_seq: stint.last_seq,
      duplicates,
      last_error: s
        .last_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone(),
    }
  }

  /// Stops following: the connection is closed and nothing more is applied or delivered.
  pub fn close(&self) {
    self.task.abort();
    self.shared.inner().deliver = None;
  }
}

impl Drop for Link {
  fn drop(&mut self) {
    self.task.abort();
  }
}

/// The hand-offs the follower has read: the receiving side calls `read_one` for each as it
/// receives it, before acting on it.
#[derive(Clone, Default)]
pub struct Reader(Arc<AtomicU64>);

impl Reader {
  pub fn read_one(&self) {
    self.0.fetch_add(1, Relaxed);
  }
}

async fn run(opts: LinkOptions, shared: Arc<Shared>) {
  let mut wait = opts.reconnect_min;
  loop {
    let outcome = match &opts.endpoint {
      Endpoint::Tcp { host, port } => {
        match tokio::net::TcpStream::connect((host.as_str(), *port)).await {
          Ok(s) => {
            let _ = s.set_nodelay(true);
            session(s, &opts, &shared).await
          }
          Err(e) => Err((false, format!("connect: {e}"))),
        }
      }
      Endpoint::Ipc { path } => match tokio::net::UnixStream::connect(path).await {
        Ok(s) => session(s, &opts, &shared).await,
        Err(e) => Err((false, format!("connect: {e}"))),
      },
    };
    let (was_up, reason) = match outcome {
      Ok(()) => (true, "closed".to_string()),
      Err(e) => e,
    };
    shared.set_error(format!("{}: {reason}", opts.endpoint));
    if was_up {
      shared.connected.store(false, Relaxed);
      shared.forward(&mut shared.inner(), HandOff::Disconnected { reason });
      wait = opts.reconnect_min;
    }
    tokio::time::sleep(wait).await;
    if !was_up {
      wait = (wait * 2).min(opts.reconnect_max.max(opts.reconnect_min));
    }
  }
}

/// One connection: handshake, then messages until it is lost. `Err((was_up, why))`.
async fn session<S: AsyncRead + AsyncWrite + Unpin>(
  stream: S,
  opts: &LinkOptions,
  shared: &Shared,
) -> Result<(), (bool, String)> {
  let (r, mut w) = tokio::io::split(stream);
  let mut r = BufReader::with_capacity(256 << 10, r);
  let down = |e: io::Error| (false, e.to_string());
  tokio::time::timeout(opts.handshake_timeout, async {
    let mut hello = zmtp::greeting().to_vec();
    zmtp::ready("SUB", &mut hello);
    w.write_all(&hello).await.map_err(down)?;
    let mut g = [0u8; zmtp::GREETING_LEN];
    r.read_exact(&mut g).await.map_err(down)?;
    zmtp::check_greeting(&g).map_err(|e| (false, e.0))?;
    let (flags, body) = read_frame(&mut r, opts.max_frame).await.map_err(down)?;
    if flags & zmtp::COMMAND == 0 {
      return Err((false, "the peer sent a message before READY".to_string()));
    }
    let kind = zmtp::peer_socket_type(&body).map_err(|e| (false, e.0))?;
    if kind != "PUB" && kind != "XPUB" {
      return Err((
        false,
        format!("the peer is a {kind} socket, not a publisher"),
      ));
    }
    let mut sub = Vec::new();
    zmtp::subscribe(&opts.topic, &mut sub);
    w.write_all(&sub).await.map_err(down)
  })
  .await
  .map_err(|_| (false, "no handshake in time".to_string()))??;
  shared.connects.fetch_add(1, Relaxed);
  shared.connected.store(true, Relaxed);
  shared.forward(&mut shared.inner(), HandOff::Connected);

  let up = |e: io::Error| (true, e.to_string());
  let mut frames: Vec<Vec<u8>> = Vec::with_capacity(3);
  let mut last_progress = Instant::now();
  loop {
    let (flags, body) = read_frame(&mut r, opts.max_frame).await.map_err(up)?;
    if flags & zmtp::COMMAND != 0 {
      continue;
    }
    if frames.len() < 16 {
      frames.push(body);
    }
    if flags & zmtp::MORE != 0 {
      continue;
    }
    let msg = std::mem::replace(&mut frames, Vec::with_capacity(3));
    let seq = match msg.get(1) {
      Some(s) if msg.len() == 3 && s.len() == 8 => u64::from_be_bytes(s[..].try_into().unwrap()),
      _ => {
        let frames = msg.len() as u32;
        shared.forward(&mut shared.inner(), HandOff::Malformed { frames });
        continue;
      }
    };
    let payload = msg.into_iter().nth(2).unwrap_or_default();
    let mut inner = shared.inner();
    match inner.gate.route(seq) {
      Route::Apply => match Shared::apply(&mut inner, &payload) {
        Some(events) => {
          inner.gate.applied(seq);
          shared.count_applied(events);
          if last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            shared.last_applied_ms.store(now_ms(), Relaxed);
            if let Some(d) = &inner.deliver {
              d.deliver(Delivery::Progress);
            }
          }
        }
        None => shared.forward(&mut inner, HandOff::Batch { seq, payload }),
      },
      Route::Hold => inner.gate.hold(seq, payload),
      Route::Forward => shared.forward(&mut inner, HandOff::Batch { seq, payload }),
    }
  }
}

fn now_ms() -> u64 {
  SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_millis() as u64)
    .unwrap_or(0)
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> io::Result<(u8, Vec<u8>)> {
  let flags = r.read_u8().await?;
  let len = if flags & zmtp::LONG != 0 {
    r.read_u64().await?
  } else {
    r.read_u8().await? as u64
  };
  if len > max as u64 {
    return Err(io::Error::new(
      io::ErrorKind::InvalidData,
      format!("a frame of {len} bytes, over the {max}-byte bound"),
    ));
  }
  let mut body = vec![0u8; len as usize];
  r.read_exact(&mut body).await?;
  Ok((flags, body))
}
