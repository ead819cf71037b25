//! Codec exports: decode any dialect, encode a batch once, `/kv_recover` answers.

use crate::convert::bigint_u64;
use crate::error::{guard_js, Code};
use crate::events::{batch_in, batch_out, BatchIn, BatchOut};
use kvplane_core::codec::{self, Dialect, Format};
use napi::bindgen_prelude::*;
use napi_derive::napi;

#[napi(object)]
pub struct DecodedOut {
  pub batches: Vec<BatchOut>,
  /// The source's event ids per batch (TensorRT-LLM JSON, SMG proto); empty otherwise.
  pub event_ids: Vec<BigUint64Array>,
  /// Events of unknown kinds, skipped.
  pub unknown_events: u32,
}

/// Decodes a payload; a stored event that cannot be indexed losslessly is
/// `ERR_UNSUPPORTED_LAYOUT` (docs/protocol.md#fail-closed-layouts).
#[napi]
pub fn decode_batches(bytes: Buffer, dialect: String) -> Result<DecodedOut, Code> {
  guard_js(|| {
    let d = codec::decode(&bytes, Dialect::parse(&dialect)?)?;
    codec::check_layout(&d.batches)?;
    Ok(DecodedOut {
      batches: d.batches.iter().map(batch_out).collect(),
      event_ids: d.event_ids.into_iter().map(BigUint64Array::new).collect(),
      unknown_events: d.unknown_events,
    })
  })
}

/// Encodes a batch in `format` (`vllm`, `vllm_legacy`, `sglang`, `smg_proto`).
#[napi]
pub fn encode_batch(batch: BatchIn, format: String) -> Result<Buffer, Code> {
  guard_js(|| {
    let format = Format::parse(&format)?;
    Ok(codec::encode(&batch_in(&batch)?, format).into())
  })
}

/// Encodes SMG's `SubscribeKvEventsRequest` (`start` 0 = live from now).
#[napi]
pub fn encode_subscribe_request(start: BigInt) -> Result<Buffer, Code> {
  guard_js(|| {
    let start = bigint_u64("start", &start)?;
    Ok(codec::smg::encode_subscribe_request(start).into())
  })
}

/// SMG's `SubscribeKvEventsRequest`.
#[napi(object)]
pub struct SubscribeRequestOut {
  /// `start_sequence_number` (0: the current state).
  pub start: BigInt,
  /// `load_records_before_first_batch`.
  pub load_records_early: bool,
}

/// Reads SMG's `SubscribeKvEventsRequest`.
#[napi]
pub fn decode_subscribe_request(bytes: Buffer) -> Result<SubscribeRequestOut, Code> {
  guard_js(|| {
    let r = codec::smg::decode_subscribe_request(&bytes)?;
    Ok(SubscribeRequestOut {
      start: BigInt::from(r.start),
      load_records_early: r.load_records_early,
    })
  })
}

/// The `HealthCheckResponse` of engine service `service` (its shape differs between engines).
#[napi]
pub fn encode_health_response(
  service: String,
  healthy: bool,
  message: String,
) -> Result<Buffer, Code> {
  guard_js(|| {
    let form = codec::smg::HealthForm::of_service(&service)?;
    Ok(codec::smg::encode_health_response(form, healthy, &message).into())
  })
}

/// Reads a msgpack `/kv_recover` answer (what a router recovering from a node gets).
#[napi(ts_return_type = "RecoveryOut")]
pub fn decode_recover_answer(bytes: Buffer) -> Result<crate::outputs::RecoveryOut, Code> {
  guard_js(|| {
    Ok(crate::outputs::recovery_out(codec::recover::from_msgpack(
      &bytes,
    )?))
  })
}

#[napi(object)]
pub struct TokenQueryOut {
  pub token_ids: Uint32Array,
  pub model_name: String,
  pub routing_group: Option<String>,
  pub lora_name: Option<String>,
  pub cache_salt: Option<String>,
}

/// Reads the body of Dynamo's indexer `/query` (`ERR_DECODE`: not JSON; `ERR_INVALID_ARG`: a
/// missing or mistyped field).
#[napi]
pub fn parse_token_query(body: Buffer) -> Result<TokenQueryOut, Code> {
  guard_js(|| {
    let q = codec::dynamo_query::parse_token_query(&body)?;
    Ok(TokenQueryOut {
      token_ids: Uint32Array::new(q.token_ids),
      model_name: q.model_name,
      routing_group: q.routing_group,
      lora_name: q.lora_name,
      cache_salt: q.cache_salt,
    })
  })
}

#[napi(object)]
pub struct HashQueryOut {
  /// Each block's hash as its u64 bit pattern.
  pub block_hashes: BigUint64Array,
  pub model_name: String,
  pub routing_group: Option<String>,
  pub cache_salt: bool,
}

/// Reads the body of Dynamo's indexer `/query_by_hash` (as `parseTokenQuery`).
#[napi]
pub fn parse_hash_query(body: Buffer) -> Result<HashQueryOut, Code> {
  guard_js(|| {
    let q = codec::dynamo_query::parse_hash_query(&body)?;
    Ok(HashQueryOut {
      block_hashes: BigUint64Array::new(q.block_hashes),
      model_name: q.model_name,
      routing_group: q.routing_group,
      cache_salt: q.cache_salt,
    })
  })
}
