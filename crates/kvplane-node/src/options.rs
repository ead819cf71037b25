//! `NativeIndexerOptions` and its conversion to the core's `LocalIndexerConfig`.

use crate::convert::bigint_u64;
use crate::hash::{core_options, HashBlocksOptions};
use kvplane_core::codec::Format;
use kvplane_core::hash;
use kvplane_core::index::{IndexConfig, KeyBy};
use kvplane_core::local_indexer::LocalIndexerConfig;
use kvplane_core::stream::log::{buffer_steps_from_f64, DEFAULT_BUFFER_STEPS};
use kvplane_core::stream::StreamConfig;
use kvplane_core::KvError;
use napi::bindgen_prelude::BigInt;
use napi_derive::napi;

#[napi(object, object_to_js = false)]
pub struct NativeIndexerOptions {
  /// Block size of token queries.
  pub block_size: f64,
  /// With keyBy "engine": the engine's hashing options (its block size is `blockSize`).
  pub engine_hash: Option<HashBlocksOptions>,
  pub worker_id: Option<BigInt>,
  /// "content" (default) or "engine".
  pub key_by: Option<String>,
  pub retain_tokens: Option<bool>,
  pub buffer_steps: Option<f64>,
  pub epoch: Option<BigInt>,
  /// The ZMQ format batches are logged and published in: "vllm" (default), "vllm_legacy",
  /// "sglang".
  pub log_format: Option<String>,
  /// The first batch's seq (default 1; a publisher takes `clockFirstSeq()`).
  pub first_seq: Option<BigInt>,
}

impl TryFrom<&NativeIndexerOptions> for LocalIndexerConfig {
  type Error = KvError;

  fn try_from(o: &NativeIndexerOptions) -> std::result::Result<Self, KvError> {
    let key_by = o
      .key_by
      .as_deref()
      .map(KeyBy::parse)
      .transpose()?
      .unwrap_or_default();
    let engine = o.engine_hash.as_ref().map(core_options).transpose()?;
    let block_size = hash::block_size_from_f64(o.block_size)?;
    let u64_of =
      |name: &str, v: &Option<BigInt>| v.as_ref().map(|v| bigint_u64(name, v)).transpose();
    Ok(LocalIndexerConfig {
      query_hash: LocalIndexerConfig::query_hash_for(key_by, engine, block_size)?,
      index: IndexConfig {
        key_by,
        retain_tokens: o.retain_tokens.unwrap_or(true),
        retain_contents: false,
        dump_keys: false,
      },
      worker_id: u64_of("workerId", &o.worker_id)?.unwrap_or(0),
      stream: StreamConfig {
        buffer_steps: o
          .buffer_steps
          .map(buffer_steps_from_f64)
          .transpose()?
          .unwrap_or(DEFAULT_BUFFER_STEPS),
        epoch: u64_of("epoch", &o.epoch)?.unwrap_or(0),
        log_format: o
          .log_format
          .as_deref()
          .map(Format::parse)
          .transpose()?
          .unwrap_or(Format::Vllm),
        first_seq: u64_of("firstSeq", &o.first_seq)?.unwrap_or(1),
      },
    })
  }
}

/// A first seq above every seq an earlier incarnation can have issued on this clock (the time in
/// microseconds): what a publisher starts its stream at, so old cursors expire after a restart.
#[napi]
pub fn clock_first_seq() -> BigInt {
  BigInt::from(kvplane_core::stream::clock_first_seq())
}
