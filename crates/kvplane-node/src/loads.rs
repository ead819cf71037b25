//! `NativeEngineLoads`: an engine's `GetLoads` answer as load records for `SubscribeKvEvents`
//! streams (the core's `codec::smg::EngineLoads`).

use crate::convert::bigint_u64;
use crate::error::{guard_js, Code};
use kvplane_core::codec::smg::{get_loads_request as request, EngineLoads, LoadLayout, RecordOpts};
use napi::bindgen_prelude::*;
use napi_derive::napi;

/// The `GetLoadsRequest` a relay polls the engine with (every section, every rank).
#[napi]
pub fn get_loads_request() -> Buffer {
  request().into()
}

#[napi]
pub struct NativeEngineLoads {
  inner: EngineLoads,
}

fn opts(sample: &BigInt, age_ms: u32, telemetry: bool) -> kvplane_core::KvResult<RecordOpts> {
  Ok(RecordOpts {
    sample: bigint_u64("sample", sample)?,
    age_ms,
    load_only: false,
    telemetry,
  })
}

#[napi]
impl NativeEngineLoads {
  /// Reads the `GetLoadsResponse` of engine service `service` (a full service name: each
  /// engine numbers its `SchedulerLoad` fields its own way).
  #[napi(constructor)]
  pub fn new(answer: Buffer, service: String) -> Result<Self, Code> {
    guard_js(|| {
      Ok(NativeEngineLoads {
        inner: EngineLoads::decode(&answer, LoadLayout::of_service(&service)?)?,
      })
    })
  }

  /// The DP ranks the answer covers.
  #[napi(getter)]
  pub fn ranks(&self) -> Vec<i32> {
    self.inner.ranks()
  }

  /// `KvEventBatch` bytes with the load record of the batch's rank appended.
  #[napi]
  pub fn attach(
    &self,
    batch: &[u8],
    sample: BigInt,
    age_ms: u32,
    telemetry: bool,
  ) -> Result<Buffer, Code> {
    guard_js(|| {
      let o = opts(&sample, age_ms, telemetry)?;
      Ok(self.inner.attach(batch, o)?.into())
    })
  }

  /// One `load_only` batch per rank, repeating seq `seq`.
  #[napi]
  pub fn load_only(
    &self,
    seq: BigInt,
    ts: f64,
    sample: BigInt,
    age_ms: u32,
    telemetry: bool,
  ) -> Result<Vec<Buffer>, Code> {
    guard_js(|| {
      let seq = bigint_u64("seq", &seq)?;
      let o = opts(&sample, age_ms, telemetry)?;
      Ok(
        self
          .inner
          .load_only(seq, ts, o)
          .into_iter()
          .map(Buffer::from)
          .collect(),
      )
    })
  }
}
