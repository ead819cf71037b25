//! `NativeRouterIndex.followZmq`: a ZMQ link (kvplane-zmq) whose in-order live batches are
//! applied to the router index on the link thread; its hand-offs reach JS through a threadsafe
//! function. Conversions only: what is applied where is the link's gate's decision.

use crate::convert::bigint_u64;
use crate::error::{guard_js, Code};
use crate::router_index::NativeRouterIndex;
use kvplane_core::codec::Dialect;
use kvplane_core::router::RouterIndex;
use kvplane_core::shared::Shared;
use kvplane_core::{ErrorCode, KvError};
use kvplane_zmq::{Apply, Deliver, Delivery, Endpoint, HandOff, Link, LinkOptions, Reader};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use std::sync::Arc;
use std::time::Duration;

#[napi(object)]
pub struct ZmqLinkOptions {
  /// `tcp://HOST:PORT` or `ipc://PATH`.
  pub endpoint: String,
  pub topic: Option<String>,
  pub worker_id: BigInt,
  /// The rank batches naming none are indexed under.
  pub dp_rank: u32,
  pub dialect: String,
  /// Reconnects wait from 100 ms, doubling up to this. Default 100.
  pub reconnect_max_ms: Option<u32>,
  /// Live batches handed to JS and not read yet, at most; more are dropped (counted). Default 10,000.
  pub max_unread: Option<u32>,
}

/// What a link hands to JS: `kind` is `batch`, `connected`, `disconnected`, `malformed` or
/// `progress`. Every kind but `progress` carries the stint applied on the link thread before it.
#[napi(object)]
pub struct ZmqDeliveryOut {
  pub kind: String,
  pub stint_last_seq: Option<BigInt>,
  pub stint_batches: f64,
  pub seq: Option<BigInt>,
  pub payload: Option<Buffer>,
  pub frames: Option<u32>,
  pub reason: Option<String>,
}

#[napi(object)]
pub struct ZmqLinkStatsOut {
  pub connected: bool,
  pub connects: f64,
  pub batches: f64,
  pub events: f64,
  /// When a batch was last applied on the link thread (ms since the epoch; 250 ms granularity), or 0.
  pub last_applied_ms: f64,
  pub dropped: f64,
  pub gate_open: bool,
  /// The last seq applied on the link thread that JS has not been told of yet.
  pub stint_last_seq: Option<BigInt>,
  /// Batches applied on the link thread that JS has not been told of yet.
  pub stint_batches: f64,
  /// Held batches skipped as already applied from a replay.
  pub duplicates: f64,
  pub last_error: Option<String>,
}

#[napi(object)]
pub struct ZmqStintOut {
  pub last_seq: Option<BigInt>,
  pub batches: f64,
}

struct IndexApply {
  index: Arc<Shared<RouterIndex>>,
  worker_id: u64,
  rank: u32,
  dialect: Dialect,
}

impl Apply for IndexApply {
  fn apply(&mut self, payload: &[u8]) -> std::result::Result<u32, String> {
    self
      .index
      .apply_payload(self.worker_id, self.rank, payload, self.dialect)
      .map(|a| a.events)
      .map_err(|e| e.message)
  }
}

type DeliveryFn = ThreadsafeFunction<Delivery, (), ZmqDeliveryOut, Status, false>;

struct JsDeliver(DeliveryFn);

impl Deliver for JsDeliver {
  fn deliver(&self, d: Delivery) {
    // Unbounded queue: never blocks the link thread (the link bounds what it hands off).
    self.0.call(d, ThreadsafeFunctionCallMode::NonBlocking);
  }
}

fn delivery_out(d: Delivery) -> ZmqDeliveryOut {
  let mut out = ZmqDeliveryOut {
    kind: "progress".into(),
    stint_last_seq: None,
    stint_batches: 0.0,
    seq: None,
    payload: None,
    frames: None,
    reason: None,
  };
  if let Delivery::HandOff(stint, h) = d {
    out.stint_last_seq = stint.last_seq.map(BigInt::from);
    out.stint_batches = stint.batches as f64;
    match h {
      HandOff::Batch { seq, payload } => {
        out.kind = "batch".into();
        out.seq = Some(BigInt::from(seq));
        out.payload = Some(Buffer::from(payload));
      }
      HandOff::Connected => out.kind = "connected".into(),
      HandOff::Disconnected { reason } => {
        out.kind = "disconnected".into();
        out.reason = Some(reason);
      }
      HandOff::Malformed { frames } => {
        out.kind = "malformed".into();
        out.frames = Some(frames);
      }
    }
  }
  out
}

#[napi]
pub struct NativeZmqLink {
  link: Link,
}

#[napi]
impl NativeRouterIndex {
  /// Follows a ZMQ publisher on the link thread for worker `workerId`: `onDelivery` gets what the
  /// follower must handle; batches are applied there while the follower keeps the gate open.
  #[napi(ts_args_type = "opts: ZmqLinkOptions, onDelivery: (d: ZmqDeliveryOut) => void")]
  pub fn follow_zmq(
    &self,
    opts: ZmqLinkOptions,
    on_delivery: Function<ZmqDeliveryOut, ()>,
  ) -> Result<NativeZmqLink, Code> {
    let worker_id = guard_js(|| bigint_u64("workerId", &opts.worker_id))?;
    let dialect = guard_js(|| Dialect::parse(&opts.dialect))?;
    let mut lo = LinkOptions::new(link_endpoint(&opts.endpoint)?);
    lo.topic = opts.topic.unwrap_or_default().into_bytes();
    lo.reconnect_max = Duration::from_millis(opts.reconnect_max_ms.unwrap_or(100) as u64);
    lo.max_unread = opts.max_unread.unwrap_or(10_000) as u64;
    let apply = IndexApply {
      index: self.shared(),
      worker_id,
      rank: opts.dp_rank,
      dialect,
    };
    open_link(lo, apply, on_delivery)
  }
}

/// A link's endpoint (`ERR_INVALID_ARG` for one it does not speak).
pub(crate) fn link_endpoint(endpoint: &str) -> Result<Endpoint, Code> {
  guard_js(|| {
    Endpoint::parse(endpoint).ok_or_else(|| {
      KvError::new(
        ErrorCode::InvalidArg,
        format!("{endpoint}: a native link connects to tcp://HOST:PORT or ipc://PATH"),
      )
    })
  })
}

/// Starts a link applying with `apply`, its hand-offs delivered to `on_delivery`.
pub(crate) fn open_link(
  lo: LinkOptions,
  apply: impl Apply,
  on_delivery: Function<ZmqDeliveryOut, ()>,
) -> Result<NativeZmqLink, Code> {
  let reader = Reader::default();
  let r = reader.clone();
  let tsfn: DeliveryFn = on_delivery
    .build_threadsafe_function::<Delivery>()
    .callee_handled::<false>()
    .build_callback(move |ctx| {
      if matches!(ctx.value, Delivery::HandOff(..)) {
        r.read_one();
      }
      Ok(delivery_out(ctx.value))
    })
    .map_err(|e| napi::Error::new(Code(ErrorCode::Internal.as_str()), e.reason))?;
  Ok(NativeZmqLink {
    link: Link::spawn(lo, apply, JsDeliver(tsfn), reader),
  })
}

#[napi]
impl NativeZmqLink {
  /// The follower applied everything before `next`, holds nothing and has read every delivery:
  /// the link applies from `next` on. False if a delivery is still unread.
  #[napi]
  pub fn reopen(&self, next: BigInt) -> Result<bool, Code> {
    guard_js(|| Ok(self.link.reopen(bigint_u64("next", &next)?)))
  }

  /// JS takes over without a hand-off: nothing more is applied on the link thread until
  /// `reopen`. What was applied there since the last delivery.
  #[napi]
  pub fn shut(&self) -> ZmqStintOut {
    let s = self.link.shut();
    ZmqStintOut {
      last_seq: s.last_seq.map(BigInt::from),
      batches: s.batches as f64,
    }
  }

  #[napi]
  pub fn stats(&self) -> ZmqLinkStatsOut {
    let s = self.link.stats();
    ZmqLinkStatsOut {
      connected: s.connected,
      connects: s.connects as f64,
      batches: s.batches as f64,
      events: s.events as f64,
      last_applied_ms: s.last_applied_ms as f64,
      dropped: s.dropped as f64,
      gate_open: s.gate_open,
      stint_last_seq: s.stint_last_seq.map(BigInt::from),
      stint_batches: s.stint_batches as f64,
      duplicates: s.duplicates as f64,
      last_error: s.last_error,
    }
  }

  /// Each live batch applied on the link thread since last taken: its time there, read off the
  /// socket to applied (ms).
  #[napi]
  pub fn take_latencies(&self) -> Float64Array {
    Float64Array::new(self.link.take_latencies())
  }

  /// Stops following; deliveries already queued may still arrive.
  #[napi]
  pub fn close(&self) {
    self.link.close();
  }
}
