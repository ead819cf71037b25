//! `NativeEventQueue`: the core's publish queue, filled from event objects or from columns (the
//! bulk path: a few typed arrays for many events).

use crate::convert::bigint_i64;
use crate::error::{guard_js, Code};
use crate::events::{event_in, EventIn};
use kvplane_core::chunk::EventChunk;
use kvplane_core::columns::Columns;
use kvplane_core::stream::queue::{queue_size_from_f64, EventQueue, DEFAULT_MAX_QUEUE_SIZE};
use kvplane_core::KvResult;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::{Arc, Mutex, MutexGuard};

/// The optional attributes of a column chunk's events (one object per call, only when set).
#[napi(object, object_to_js = false)]
pub struct ColumnAttrsIn {
  pub medium: Option<String>,
  pub lora_id: Option<BigInt>,
  pub lora_name: Option<String>,
}

/// Event columns as positional typed-array arguments, borrowed for the call (no object property
/// lookups, no references): per event `kinds` (0 stored, 1 removed, 2 cleared), `hash_counts`,
/// `parents` + `has_parent`; every event's `hashes` and every stored event's `tokens`
/// concatenated.
pub(crate) struct ColumnArgs<'a> {
  pub kinds: Uint8ArraySlice<'a>,
  pub hash_counts: Uint32ArraySlice<'a>,
  pub hashes: BigUint64ArraySlice<'a>,
  pub parents: BigUint64ArraySlice<'a>,
  pub has_parent: Uint8ArraySlice<'a>,
  pub tokens: Uint32ArraySlice<'a>,
  pub block_size: u32,
  pub attrs: Option<ColumnAttrsIn>,
}

impl ColumnArgs<'_> {
  /// The columns, borrowed.
  /// (`ERR_INVALID_ARG` for a `loraId` outside i64.)
  pub(crate) fn columns(&self) -> KvResult<Columns<'_>> {
    let attrs = self.attrs.as_ref();
    let lora_id = attrs.and_then(|a| a.lora_id.as_ref());
    Ok(Columns {
      kinds: &self.kinds,
      hash_counts: &self.hash_counts,
      hashes: &self.hashes,
      parents: &self.parents,
      has_parent: &self.has_parent,
      tokens: &self.tokens,
      block_size: self.block_size,
      medium: attrs.and_then(|a| a.medium.as_deref()),
      lora_id: lora_id.map(|v| bigint_i64("loraId", v)).transpose()?,
      lora_name: attrs.and_then(|a| a.lora_name.as_deref()),
    })
  }
}

#[napi]
pub struct NativeEventQueue {
  pub(crate) inner: Arc<Mutex<EventQueue>>,
}

impl NativeEventQueue {
  pub(crate) fn lock(&self) -> MutexGuard<'_, EventQueue> {
    self.inner.lock().unwrap_or_else(|p| p.into_inner())
  }
}

#[napi]
impl NativeEventQueue {
  #[napi(constructor)]
  pub fn new(max_queue_size: Option<f64>) -> Result<Self, Code> {
    let capacity = guard_js(|| {
      max_queue_size
        .map(queue_size_from_f64)
        .transpose()
        .map(|c| c.unwrap_or(DEFAULT_MAX_QUEUE_SIZE))
    })?;
    Ok(NativeEventQueue {
      inner: Arc::new(Mutex::new(EventQueue::new(capacity))),
    })
  }

  /// Enqueues events (all are checked first); returns how many were accepted, the rest dropped.
  #[napi(ts_args_type = "events: readonly KvEvent[]")]
  pub fn push_events(&self, events: Vec<EventIn>) -> Result<u32, Code> {
    guard_js(|| {
      let evs = events.iter().map(event_in).collect::<KvResult<Vec<_>>>()?;
      Ok(self.lock().push(EventChunk::from_events(evs)) as u32)
    })
  }

  /// Enqueues events given as columns (see `ColumnArgs`); returns how many were accepted, the
  /// rest dropped.
  #[napi]
  #[allow(clippy::too_many_arguments)]
  pub fn push_columns(
    &self,
    kinds: Uint8ArraySlice,
    hash_counts: Uint32ArraySlice,
    hashes: BigUint64ArraySlice,
    parents: BigUint64ArraySlice,
    has_parent: Uint8ArraySlice,
    tokens: Uint32ArraySlice,
    block_size: u32,
    attrs: Option<ColumnAttrsIn>,
  ) -> Result<u32, Code> {
    let cols = ColumnArgs {
      kinds,
      hash_counts,
      hashes,
      parents,
      has_parent,
      tokens,
      block_size,
      attrs,
    };
    guard_js(|| {
      let chunk = EventChunk::from_columns(&cols.columns()?)?;
      Ok(self.lock().push(chunk) as u32)
    })
  }

  #[napi(getter)]
  pub fn length(&self) -> u32 {
    self.lock().len() as u32
  }

  #[napi(getter)]
  pub fn capacity(&self) -> u32 {
    self.lock().capacity() as u32
  }

  /// Events dropped because the queue was full.
  #[napi(getter)]
  pub fn dropped(&self) -> f64 {
    self.lock().dropped() as f64
  }
}
