//! A link: one SUB connection to a ZMQ publisher, kept up by itself, its live batches applied
//! here while the follower's gate is open and handed to the follower otherwise.

use crate::endpoint::Endpoint;
use crate::gate::{Gate, Held, Reopened, Route, Stint};
use crate::runtime;
use crate::zmtp;
use std::collections::VecDeque;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

/// Applies a live batch's payload where it was read.
pub trait Apply: Send + 'static {
  /// The events applied, or why the payload could not be applied (then nothing was).
  fn apply(&mut self, payload: &[u8]) -> Result<u32, String>;

  /// Applies consecutive batches' payloads as one, all or none: the events applied, or why not
  /// (then each is applied alone). By default none are.
  fn apply_many(&mut self, _payloads: &[&[u8]]) -> Result<u32, String> {
    Err("not supported".into())
  }

  /// Called when the read buffer holds no whole frame: the link is about to wait for the
  /// socket. Work that can wait for the end of a burst goes here.
  fn drained(&mut self) {}
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
  /// Live batches already read in, in order after one being applied, are applied with it as one
  /// (`Apply::apply_many`) up to this many payload bytes; 0 applies each alone.
  pub coalesce_bytes: usize,
  /// Keep each applied live batch's time here for `Link::take_latencies` (the last 8,192).
  pub time_batches: bool,
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
      coalesce_bytes: 0,
      time_batches: false,
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
  /// Batches applied here since the follower was last handed something.
  pub stint_batches: u64,
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
  /// When each held batch was read, by seq (cleared when the held are handed over).
  held_at: VecDeque<(u64, Instant)>,
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
  /// Each applied live batch's time here, read to applied (ms), the last `LATENCY_WINDOW`;
  /// `None` unless the options ask for it.
  latencies: Option<Mutex<VecDeque<f64>>>,
}

/// Live batches' times kept for the follower to take (`Link::take_latencies`), at most.
const LATENCY_WINDOW: usize = 8192;

impl Shared {
  fn inner(&self) -> MutexGuard<'_, Inner> {
    self.inner.lock().unwrap_or_else(|p| p.into_inner())
  }

  /// `batches` live batches were applied here `t` after they were read.
  fn timed(&self, t: Duration, batches: usize) {
    let Some(l) = &self.latencies else { return };
    let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..batches {
      if l.len() == LATENCY_WINDOW {
        l.pop_front();
      }
      l.push_back(t.as_secs_f64() * 1e3);
    }
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

  /// Applies consecutive payloads as one; `None` if they were not (none was).
  fn apply_many(inner: &mut Inner, payloads: &[&[u8]]) -> Option<u32> {
    match catch_unwind(AssertUnwindSafe(|| inner.apply.apply_many(payloads))) {
      Ok(Ok(events)) => Some(events),
      _ => None,
    }
  }

  fn count_applied(&self, batches: usize, events: u32) {
    self.batches.fetch_add(batches as u64, Relaxed);
    self.events.fetch_add(events as u64, Relaxed);
  }

  /// Hands `h` to the follower, after the held batches.
  fn forward(&self, inner: &mut Inner, h: HandOff) {
    inner.held_at.clear();
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
        self.count_applied(1, events);
        while let Some((held, at)) = inner.held_at.pop_front() {
          if held == seq {
            self.timed(at.elapsed(), 1);
            break;
          }
        }
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
        held_at: VecDeque::new(),
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
      latencies: opts.time_batches.then(|| Mutex::new(VecDeque::new())),
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
        inner.held_at.clear();
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
    inner.held_at.clear();
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
      stint_batches: stint.batches,
      duplicates,
      last_error: s
        .last_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone(),
    }
  }

  /// The time each live batch applied here took, from read to applied (ms), since last taken
  /// (the last 8,192 at most; none unless `time_batches`).
  pub fn take_latencies(&self) -> Vec<f64> {
    let Some(l) = &self.shared.latencies else {
      return Vec::new();
    };
    let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
    l.drain(..).collect()
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

/// Idle time before a connection's first keepalive probe, the time between probes, and how many
/// go unanswered before the connection is dropped: a publisher whose host died or that a
/// partition cut off (no reset ever comes) is noticed within about 25 s, however quiet (a SUB
/// sends nothing after its subscriptions), and connected again.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;

fn keepalive(s: &tokio::net::TcpStream) {
  let params = socket2::TcpKeepalive::new()
    .with_time(KEEPALIVE_IDLE)
    .with_interval(KEEPALIVE_INTERVAL)
    .with_retries(KEEPALIVE_PROBES);
  let _ = socket2::SockRef::from(s).set_tcp_keepalive(&params);
}

async fn run(opts: LinkOptions, shared: Arc<Shared>) {
  let mut wait = opts.reconnect_min;
  loop {
    let outcome = match &opts.endpoint {
      Endpoint::Tcp { host, port } => {
        match tokio::net::TcpStream::connect((host.as_str(), *port)).await {
          Ok(s) => {
            let _ = s.set_nodelay(true);
            keepalive(&s);
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
    if zmtp::buffered_frame(r.buffer(), opts.max_frame).is_none() {
      // The next frame is not (all) here: its read waits for the socket.
      let mut inner = shared.inner();
      let _ = catch_unwind(AssertUnwindSafe(|| inner.apply.drained()));
    }
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
    let read_at = Instant::now();
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
    let applied = {
      let mut inner = shared.inner();
      let mut group = vec![(seq, payload)];
      if opts.coalesce_bytes > 0 && inner.gate.route(seq) == Route::Apply {
        take_buffered(&mut r, &mut group, opts.coalesce_bytes, opts.max_frame);
      }
      if group.len() > 1 && apply_group(shared, &mut inner, &group, &mut last_progress) {
        group.len()
      } else {
        let mut applied = 0;
        for batch in group {
          applied += route(shared, &mut inner, batch, read_at, &mut last_progress) as usize;
        }
        applied
      }
    };
    if applied > 0 {
      runtime::worked(applied);
      shared.timed(read_at.elapsed(), applied);
      // What the batch queued for a native publisher's subscribers goes out now, not once the
      // rest of the read buffer (hundreds of batches) has been applied: the publisher's writers
      // run on this thread too.
      tokio::task::yield_now().await;
    }
  }
}

/// Moves the live batches that follow `group`'s last in seq order, already whole in the read
/// buffer, into `group`, while its payloads stay under `cap` bytes. Nothing waits for more.
fn take_buffered<R: AsyncRead + Unpin>(
  r: &mut BufReader<R>,
  group: &mut Vec<(u64, Vec<u8>)>,
  cap: usize,
  max_frame: usize,
) {
  let mut bytes: usize = group.iter().map(|(_, p)| p.len()).sum();
  while let Some((used, seq, payload)) = zmtp::buffered_message(r.buffer(), max_frame) {
    let last = group.last().map(|(s, _)| *s).unwrap_or(0);
    if seq != last.wrapping_add(1) || bytes + payload.len() > cap {
      return;
    }
    bytes += payload.len();
    group.push((seq, payload.to_vec()));
    Pin::new(&mut *r).consume(used);
  }
}

/// Tells the follower that batches were applied here, at most every 250 ms.
fn progress(shared: &Shared, inner: &Inner, last_progress: &mut Instant) {
  if last_progress.elapsed() >= Duration::from_millis(250) {
    *last_progress = Instant::now();
    shared.last_applied_ms.store(now_ms(), Relaxed);
    if let Some(d) = &inner.deliver {
      d.deliver(Delivery::Progress);
    }
  }
}

/// Applies an in-order group of live batches as one; false if it did not (none was applied).
fn apply_group(
  shared: &Shared,
  inner: &mut Inner,
  group: &[(u64, Vec<u8>)],
  last_progress: &mut Instant,
) -> bool {
  let payloads: Vec<&[u8]> = group.iter().map(|(_, p)| p.as_slice()).collect();
  let Some(events) = Shared::apply_many(inner, &payloads) else {
    return false;
  };
  for (seq, _) in group {
    inner.gate.applied(*seq);
  }
  shared.count_applied(group.len(), events);
  progress(shared, inner, last_progress);
  true
}

/// Applies a live batch here, holds it or hands it to the follower, as the gate says; whether it
/// was applied here.
fn route(
  shared: &Shared,
  inner: &mut Inner,
  (seq, payload): (u64, Vec<u8>),
  read_at: Instant,
  last_progress: &mut Instant,
) -> bool {
  match inner.gate.route(seq) {
    Route::Apply => match Shared::apply(inner, &payload) {
      Some(events) => {
        inner.gate.applied(seq);
        shared.count_applied(1, events);
        progress(shared, inner, last_progress);
        return true;
      }
      None => shared.forward(inner, HandOff::Batch { seq, payload }),
    },
    Route::Hold => {
      inner.gate.hold(seq, payload);
      inner.held_at.push_back((seq, read_at));
    }
    Route::Forward => shared.forward(inner, HandOff::Batch { seq, payload }),
  }
  false
}

fn now_ms() -> u64 {
  SystemTime::now()
    .duration_since(UNIX_EPOCH)
    .map(|d| d.as_millis() as u64)
    .unwrap_or(0)
}

pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
  r: &mut R,
  max: usize,
) -> io::Result<(u8, Vec<u8>)> {
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
