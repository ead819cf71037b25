//! `KvEventBatch` and `SubscribeKvEventsRequest` writing.

use super::*;
use crate::codec::protobuf::{
  put_bytes, put_key, put_len_delimited, put_opt_varint, put_packed_u32s, put_packed_u64s, put_str,
  put_varint, I64, VARINT,
};
use crate::codec::value::Value;
use crate::event::{EventRef, EventRefs, RemovedView, StoredFields, StoredView};
use crate::{ErrorCode, KvError, KvResult};

/// Encodes batch `seq` of `events`. Stored events become one `KvBlock` per hash with its
/// `block_size` tokens (an event whose tokens do not split that way carries its blocks without
/// tokens); `updated`/`created` have no proto form and are left out. An event's `event_id` is
/// `(seq << 32) | index` (vLLM's convention), so a batch re-encodes to the same bytes.
pub fn encode_batch<'a>(
  seq: u64,
  ts: f64,
  dp_rank: Option<i32>,
  events: impl EventRefs<'a>,
  out: &mut Vec<u8>,
) {
  put_batch_head(seq, ts, out);
  let first_id = (seq & 0xffff_ffff) << 32;
  let published = events.filter(|e| e.is_published());
  for (event_id, e) in (first_id..).zip(published) {
    put_len_delimited(out, BATCH_EVENTS, |out| {
      encode_event_with_id(&e, event_id, out)
    });
  }
  put_dp_rank(dp_rank, out);
}

/// A `KvEventBatch`'s `sequence_number` and `timestamp` (each left out when 0).
pub(super) fn put_batch_head(seq: u64, ts: f64, out: &mut Vec<u8>) {
  if seq != 0 {
    put_key(out, BATCH_SEQUENCE_NUMBER, VARINT);
    put_varint(out, seq);
  }
  if ts.to_bits() != 0 {
    put_key(out, BATCH_TIMESTAMP, I64);
    out.extend_from_slice(&ts.to_le_bytes());
  }
}

/// A `KvEventBatch`'s `dp_rank`, when it has one.
pub(super) fn put_dp_rank(dp_rank: Option<i32>, out: &mut Vec<u8>) {
  if let Some(r) = dp_rank {
    put_key(out, BATCH_DP_RANK, VARINT);
    put_varint(out, r as i64 as u64);
  }
}

/// A `KvCacheEvent` (`event_id` 0 is left out, as proto3 does).
pub(super) fn encode_event_with_id(e: &EventRef<'_>, event_id: u64, out: &mut Vec<u8>) {
  if event_id != 0 {
    put_key(out, EVENT_ID, VARINT);
    put_varint(out, event_id);
  }
  match e {
    EventRef::Stored(s) => put_len_delimited(out, EVENT_STORED, |out| encode_stored(s, out)),
    EventRef::Removed(r) => put_len_delimited(out, EVENT_REMOVED, |out| encode_removed(r, out)),
    EventRef::Cleared => put_len_delimited(out, EVENT_CLEARED, |_| {}),
    EventRef::Updated(_) | EventRef::Created(_) => {}
  }
}

/// A `KvBlocksStored`.
fn encode_stored(s: &StoredView<'_>, out: &mut Vec<u8>) {
  let block_size = s.block_size();
  let bs = block_size as usize;
  let split = bs != 0 && s.token_ids.len() == s.block_hashes.len() * bs;
  let medium = s.medium();
  let level = cache_level_of_medium(medium);
  let lora_id = s.lora_id();
  let extra: &[Value] = match s.extra_keys() {
    Some(Value::Array(per_block)) if per_block.len() == s.block_hashes.len() => per_block,
    _ => &[],
  };
  for (i, &h) in s.block_hashes.iter().enumerate() {
    put_len_delimited(out, STORED_BLOCKS, |out| {
      if h != 0 {
        put_key(out, BLOCK_HASH, VARINT);
        put_varint(out, h);
      }
      if split {
        let toks = &s.token_ids[i * bs..(i + 1) * bs];
        put_len_delimited(out, BLOCK_TOKEN_IDS, |out| put_packed_u32s(out, toks));
      }
      if block_size != 0 {
        put_key(out, BLOCK_SIZE, VARINT);
        put_varint(out, block_size as i32 as i64 as u64);
      }
      put_opt_varint(out, BLOCK_LORA_ID, lora_id.map(|l| l as u64));
      put_opt_varint(out, BLOCK_CACHE_LEVEL, level.map(|l| l as i64 as u64));
      if let Some(Value::Array(entries)) = extra.get(i) {
        put_extra_keys(out, entries);
      }
    });
  }
  put_opt_varint(out, STORED_PARENT_BLOCK_HASH, s.parent_block_hash);
  put_opt_varint(out, STORED_TIER, tier_of_medium(medium).map(|t| t as u64));
  put_str(out, STORED_MEDIUM, medium);
  put_opt_varint(out, STORED_GROUP_IDX, s.group_idx().map(u64::from));
  put_str(out, STORED_KV_CACHE_SPEC_KIND, s.kv_cache_spec_kind());
  put_opt_varint(
    out,
    STORED_KV_CACHE_SPEC_SLIDING_WINDOW,
    s.kv_cache_spec_sliding_window()
      .and_then(|w| u32::try_from(w).ok())
      .map(u64::from),
  );
  put_opt_varint(
    out,
    STORED_LOCALITY,
    locality_enum(s.locality()).map(|l| l as u64),
  );
  put_str(out, STORED_OWNERSHIP, s.ownership());
  put_str(out, STORED_SESSION_ID, s.session_id());
  put_str(out, STORED_LORA_NAME, s.lora_name());
  put_str(out, STORED_CACHE_SALT, s.cache_salt());
}

/// One block's `extra_keys` entries as `KvBlockExtraKey` messages: text, blob, number, or a
/// multimodal `(identifier, offset)` pair.
fn put_extra_keys(out: &mut Vec<u8>, entries: &[Value]) {
  for e in entries {
    put_len_delimited(out, BLOCK_EXTRA_KEYS, |out| match e {
      Value::Str(t) => put_str(out, EXTRA_KEY_TEXT, Some(t)),
      Value::Bin(b) => put_bytes(out, EXTRA_KEY_BLOB, b),
      Value::Uint(n) => put_opt_varint(out, EXTRA_KEY_NUMBER, Some(*n)),
      Value::Int(n) => put_opt_varint(out, EXTRA_KEY_NUMBER, Some(*n as u64)),
      Value::Array(pair) => put_len_delimited(out, EXTRA_KEY_MULTIMODAL, |out| {
        if let Some(Value::Str(id)) = pair.first() {
          if !id.is_empty() {
            put_str(out, MULTIMODAL_IDENTIFIER, Some(id));
          }
        }
        match pair.get(1) {
          Some(Value::Uint(o)) if *o != 0 => put_opt_varint(out, MULTIMODAL_OFFSET, Some(*o)),
          Some(Value::Int(o)) => put_opt_varint(out, MULTIMODAL_OFFSET, Some(*o as u64)),
          _ => {}
        }
      }),
      _ => {}
    });
  }
}

/// A `KvBlocksRemoved`.
fn encode_removed(r: &RemovedView<'_>, out: &mut Vec<u8>) {
  put_packed_u64s(out, REMOVED_BLOCK_HASHES, r.block_hashes);
  let medium = r.medium();
  let level = cache_level_of_medium(medium);
  put_opt_varint(out, REMOVED_CACHE_LEVEL, level.map(|l| l as i64 as u64));
  put_opt_varint(out, REMOVED_TIER, level.map(|l| (l + 1) as u64));
  put_str(out, REMOVED_MEDIUM, medium);
  put_opt_varint(out, REMOVED_GROUP_IDX, r.group_idx().map(u64::from));
  put_opt_varint(
    out,
    REMOVED_LOCALITY,
    locality_enum(r.locality()).map(|l| l as u64),
  );
  put_str(out, REMOVED_OWNERSHIP, r.ownership());
}

/// Encodes a `SubscribeKvEventsRequest` (`start_sequence_number`; 0 = live from now).
pub fn encode_subscribe_request(start: u64) -> Vec<u8> {
  let mut out = Vec::with_capacity(11);
  put_opt_varint(
    &mut out,
    SUBSCRIBE_START_SEQUENCE_NUMBER,
    (start != 0).then_some(start),
  );
  out
}

/// The two shapes of the engine services' `HealthCheckResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthForm {
  /// vLLM, SGLang, TokenSpeed: `bool healthy = 1; string message = 2;`
  HealthyMessage,
  /// TensorRT-LLM: `string status = 1;`, `"OK"` or what is wrong.
  Status,
  /// gRPC's standard health service (`grpc.health.v1.Health`): `ServingStatus status = 1;`,
  /// `SERVING` (1) or `NOT_SERVING` (2); no message.
  Serving,
}

impl HealthForm {
  /// The form of `service`'s `HealthCheckResponse` (a full service name such as
  /// `vllm.grpc.engine.VllmEngine`).
  pub fn of_service(service: &str) -> KvResult<HealthForm> {
    match service {
      "vllm.grpc.engine.VllmEngine"
      | "sglang.grpc.scheduler.SglangScheduler"
      | "tokenspeed.grpc.scheduler.TokenSpeedScheduler" => Ok(HealthForm::HealthyMessage),
      "trtllm.TrtllmService" => Ok(HealthForm::Status),
      "grpc.health.v1.Health" => Ok(HealthForm::Serving),
      _ => Err(KvError::new(
        ErrorCode::InvalidArg,
        format!("no HealthCheck form known for service {service:?}"),
      )),
    }
  }
}

/// A `HealthCheckResponse` in `form`: healthy, or not with `message` saying why.
pub fn encode_health_response(form: HealthForm, healthy: bool, message: &str) -> Vec<u8> {
  let mut out = Vec::with_capacity(message.len() + 8);
  match form {
    HealthForm::HealthyMessage => {
      if healthy {
        put_key(&mut out, 1, VARINT);
        put_varint(&mut out, 1);
      }
      put_str(&mut out, 2, (!message.is_empty()).then_some(message));
    }
    HealthForm::Status => put_str(&mut out, 1, Some(if healthy { "OK" } else { message })),
    HealthForm::Serving => {
      put_key(&mut out, 1, VARINT);
      put_varint(&mut out, if healthy { 1 } else { 2 });
    }
  }
  out
}
