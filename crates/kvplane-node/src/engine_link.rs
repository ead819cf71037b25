//! An engine node's native ZMQ paths, on `NativeLocalIndexer`: `followZmq` relays an engine's
//! live batches on the link thread (decoded, indexed, encoded and logged there, kept for JS's
//! consumers to take up: `takeDeferred`), and `bindZmqLive` sends every logged batch from a
//! native PUB as it is logged. Conversions only: the gate decides what is applied where, the core
//! orders what goes out.

use crate::error::{guard_js, Code};
use crate::local_indexer::NativeLocalIndexer;
use crate::outputs::{published_out_in, PublishedOut};
use crate::tasks::{with, Shared};
use crate::zmq_link::{link_endpoint, open_link, NativeZmqLink, ZmqDeliveryOut};
use kvplane_core::codec::Dialect;
use kvplane_core::local_indexer::LiveTap;
use kvplane_core::stream::log::Payload;
use kvplane_core::{ErrorCode, KvError};
use kvplane_zmq::{Apply, LinkOptions, PubOptions, Publisher};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[napi(object)]
pub struct EngineLinkOptions {
  /// The engine rank's publisher: `tcp://HOST:PORT` or `ipc://PATH`.
  pub endpoint: String,
  pub topic: Option<String>,
  /// The rank its batches are published under; none: the payloads' own ranks.
  pub dp_rank: Option<i32>,
  pub dialect: String,
  /// Reconnects wait from 100 ms, doubling up to this. Default 100.
  pub reconnect_max_ms: Option<u32>,
  /// Live batches handed to JS and not read yet, at most; more are dropped (counted). Default 10,000.
  pub max_unread: Option<u32>,
  /// Batches already read in, in order, relayed as one up to this many payload bytes. Default 0.
  pub coalesce_bytes: Option<u32>,
}

/// Tells JS, once until it looks, that batches were published on the link thread.
type PublishedFn = ThreadsafeFunction<(), (), (), Status, false, true>;

struct Notice {
  /// JS was told and has not taken the batches yet (shared by the indexer's links; cleared by
  /// `takeDeferred`).
  queued: Arc<AtomicBool>,
  tsfn: PublishedFn,
  /// Batches relayed since JS was last told, from when.
  untold_since: Option<Instant>,
}

/// How long relayed batches wait for the link to drain its socket before JS is told anyway.
const TELL_WITHIN: Duration = Duration::from_millis(1);

impl Notice {
  /// Tells JS that batches wait for it, unless it was told and has not looked yet.
  fn tell(&mut self) {
    self.untold_since = None;
    if !self.queued.swap(true, Ordering::AcqRel) {
      self.tsfn.call((), ThreadsafeFunctionCallMode::NonBlocking);
    }
  }
}

struct RelayApply {
  inner: Shared,
  dialect: Dialect,
  dp_rank: Option<i32>,
  notice: Notice,
}

impl Apply for RelayApply {
  fn apply(&mut self, payload: &[u8]) -> std::result::Result<u32, String> {
    self.apply_many(&[payload])
  }

  /// Relays the payloads (as one batch per run of a rank), kept for JS to take up.
  fn apply_many(&mut self, payloads: &[&[u8]]) -> std::result::Result<u32, String> {
    let events = with(&self.inner, |ix| {
      let d = ix.relay_coalesced(payloads, self.dialect, self.dp_rank)?;
      let events = d.events as u32;
      ix.defer(d);
      Ok(events)
    })
    .map_err(|e| e.message)?;
    // JS is told when the link has drained its socket (`drained`), not after each batch: woken
    // mid-burst, its gRPC writes took the CPU the link thread needed for the burst's other
    // batches. Under a load that never drains, it is told within TELL_WITHIN.
    let since = *self.notice.untold_since.get_or_insert_with(Instant::now);
    if since.elapsed() >= TELL_WITHIN {
      self.notice.tell();
    }
    Ok(events)
  }

  fn drained(&mut self) {
    if self.notice.untold_since.is_some() {
      self.notice.tell();
    }
  }
}

struct PubTap {
  publisher: Arc<Publisher>,
  topic: Arc<Vec<u8>>,
}

impl LiveTap for PubTap {
  fn logged(&mut self, seq: u64, payload: &Payload) {
    let seq = Arc::new(seq.to_be_bytes().to_vec());
    self
      .publisher
      .send(Arc::from([self.topic.clone(), seq, payload.clone()]));
  }
}

#[napi(object)]
pub struct ZmqPublisherStatsOut {
  pub peers: f64,
  pub sent: f64,
  pub dropped: f64,
  pub queued: f64,
  /// Peers cut off for holding too many subscriptions.
  pub refused_peers: f64,
  /// Connections the listener failed to accept (and went on from).
  pub accept_errors: f64,
}

/// The live stream's PUB socket, bound natively.
#[napi]
pub struct NativeZmqPublisher {
  publisher: Arc<Publisher>,
  inner: Shared,
}

#[napi]
impl NativeZmqPublisher {
  /// The endpoint as bound (with the port the OS chose).
  #[napi(getter)]
  pub fn endpoint(&self) -> String {
    self.publisher.endpoint().to_string()
  }

  #[napi]
  pub fn stats(&self) -> ZmqPublisherStatsOut {
    let s = self.publisher.stats();
    ZmqPublisherStatsOut {
      peers: s.peers as f64,
      sent: s.sent as f64,
      dropped: s.dropped as f64,
      queued: s.queued as f64,
      refused_peers: s.refused_peers as f64,
      accept_errors: s.accept_errors as f64,
    }
  }

  /// Stops sending: the tap is taken off the indexer and every connection closed.
  #[napi]
  pub fn close(&self) {
    let _ = with(&self.inner, |ix| {
      ix.set_live_tap(None);
      Ok(())
    });
    self.publisher.close();
  }
}

#[napi]
impl NativeLocalIndexer {
  /// Relays an engine rank's publisher on the link thread: `onDelivery` gets what the follower
  /// must handle; `onPublished` is called (once until `takeDeferred`) when batches were published
  /// there.
  #[napi(
    ts_args_type = "opts: EngineLinkOptions, onDelivery: (d: ZmqDeliveryOut) => void, onPublished: () => void"
  )]
  pub fn follow_zmq(
    &self,
    opts: EngineLinkOptions,
    on_delivery: Function<ZmqDeliveryOut, ()>,
    on_published: Function<(), ()>,
  ) -> Result<NativeZmqLink, Code> {
    let dialect = guard_js(|| Dialect::parse(&opts.dialect))?;
    let mut lo = LinkOptions::new(link_endpoint(&opts.endpoint)?);
    lo.topic = opts.topic.unwrap_or_default().into_bytes();
    lo.reconnect_max = Duration::from_millis(opts.reconnect_max_ms.unwrap_or(100) as u64);
    lo.max_unread = opts.max_unread.unwrap_or(10_000) as u64;
    lo.coalesce_bytes = opts.coalesce_bytes.unwrap_or(0) as usize;
    lo.time_batches = true;
    let queued = self.link_notice().clone();
    let tsfn: PublishedFn = on_published
      .build_threadsafe_function::<()>()
      .callee_handled::<false>()
      .weak::<true>()
      .build_callback(|_| Ok(()))
      .map_err(|e| napi::Error::new(Code(ErrorCode::Internal.as_str()), e.reason))?;
    let apply = RelayApply {
      inner: self.shared(),
      dialect,
      dp_rank: opts.dp_rank,
      notice: Notice {
        queued,
        tsfn,
        untold_since: None,
      },
    };
    open_link(lo, apply, on_delivery)
  }

  /// The batches published on link threads since last taken, in seq order, with the encodings
  /// in `formats` only (what JS consumes). Never waits for a batch being relayed.
  #[napi]
  pub fn take_deferred(&self, formats: Vec<String>) -> PublishedOut {
    // Cleared first: a batch deferred after the take tells JS again.
    self.link_notice().store(false, Ordering::Release);
    published_out_in(self.outbox().take(), Some(&formats))
  }

  /// Binds a native PUB for the live stream: every batch logged from now on is sent there as
  /// `[topic, seq, payload]`. `null` for an endpoint it does not bind (then zeromq.js does).
  #[napi]
  pub fn bind_zmq_live(
    &self,
    endpoint: String,
    topic: String,
    hwm: u32,
  ) -> Result<Option<NativeZmqPublisher>, Code> {
    if kvplane_zmq::publisher::parse_bind(&endpoint).is_none() {
      return Ok(None);
    }
    let opts = PubOptions {
      hwm: hwm as usize,
      ..PubOptions::default()
    };
    let publisher = guard_js(|| {
      Publisher::bind(&endpoint, opts).map_err(|e| {
        KvError::new(
          ErrorCode::InvalidArg,
          format!("cannot bind the ZMQ publisher to {endpoint}: {e}"),
        )
      })
    })?;
    let publisher = Arc::new(publisher);
    let tap = PubTap {
      publisher: publisher.clone(),
      topic: Arc::new(topic.into_bytes()),
    };
    guard_js(|| {
      with(&self.shared(), |ix| {
        ix.set_live_tap(Some(Box::new(tap)));
        Ok(())
      })
    })?;
    Ok(Some(NativeZmqPublisher {
      publisher,
      inner: self.shared(),
    }))
  }
}
