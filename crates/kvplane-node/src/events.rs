//! Events and batches between JS and the core's normalized model (docs/protocol.md#events).

use crate::convert::{bigint_i64, bigint_u64};
use crate::value::JsOpaque;
use kvplane_core::event::{
  Batch, CreatedEvent, Diff, HashBytes, KvEvent, RemovedEvent, StoredEvent, UpdatedEvent,
};
use kvplane_core::hash::{self, tokens_from_f64};
use kvplane_core::KvResult;
use napi::bindgen_prelude::*;
use napi_derive::napi;

/// Byte-string block hashes as the engine sent them.
#[napi(object, object_to_js = false)]
pub struct HashBytesIn {
  pub blocks: Option<Vec<Uint8Array>>,
  pub parent: Option<Uint8Array>,
}

/// A change of one value (TensorRT-LLM `event_diff`).
#[napi(object)]
pub struct DiffIo {
  pub old: i64,
  pub new: i64,
}

/// A KV cache event as JS passes it in: the normalized event model (docs/protocol.md#events),
/// the one declaration TypeScript's `KvEvent` types come from. u64 values are `bigint`; hashes
/// and tokens may be typed arrays.
// Events arrive one per array element and are converted at once: the size of the stored variant
// costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[napi(
  discriminant = "type",
  discriminant_case = "lowercase",
  object_to_js = false,
  js_name = "KvEvent"
)]
pub enum EventIn {
  /// Blocks stored, chained from `parentBlockHash` (absent or null: a root).
  Stored {
    /// The engine's block hashes (opaque ids), one per block.
    #[napi(ts_type = "BigUint64Array | readonly bigint[]")]
    block_hashes: Either<BigUint64Array, Vec<BigInt>>,
    /// The engine hash of the block the chain continues from.
    parent_block_hash: Option<Either<BigInt, Null>>,
    /// `blockHashes.length * blockSize` token ids (absent: a hash-only event).
    #[napi(ts_type = "Uint32Array | readonly number[]")]
    token_ids: Option<Either<Uint32Array, Vec<f64>>>,
    block_size: Option<f64>,
    lora_id: Option<BigInt>,
    lora_name: Option<String>,
    /// Storage tier (`GPU`, `CPU`, `DISK`, ...); unknown values are kept.
    medium: Option<String>,
    group_idx: Option<u32>,
    cache_salt: Option<String>,
    /// vLLM's per-block extra keys, opaque (kept for re-encoding).
    #[napi(ts_type = "unknown")]
    extra_keys: Option<JsOpaque>,
    kv_cache_spec_kind: Option<String>,
    kv_cache_spec_sliding_window: Option<i64>,
    /// `LOCAL` or `REMOTE` relative to the publisher.
    locality: Option<String>,
    ownership: Option<String>,
    session_id: Option<String>,
    /// Tokens beyond each block used in its hash, opaque.
    #[napi(ts_type = "unknown")]
    lookahead_token_ids: Option<JsOpaque>,
    /// The engine's byte-string hashes, when it sent bytes (`blockHashes` holds their u64 ids).
    hash_bytes: Option<HashBytesIn>,
  },
  /// Blocks removed.
  Removed {
    #[napi(ts_type = "BigUint64Array | readonly bigint[]")]
    block_hashes: Either<BigUint64Array, Vec<BigInt>>,
    medium: Option<String>,
    group_idx: Option<u32>,
    locality: Option<String>,
    ownership: Option<String>,
    hash_bytes: Option<HashBytesIn>,
  },
  /// Every block of that worker (DP rank) is gone.
  Cleared {},
  /// TensorRT-LLM only: a block changed cache level or priority. No effect on the index.
  Updated {
    block_hash: BigInt,
    cache_level: Option<DiffIo>,
    priority: Option<DiffIo>,
  },
  /// TensorRT-LLM only: the cache's capacity per level. No effect on the index.
  Created {
    #[napi(ts_type = "readonly number[]")]
    num_blocks_per_cache_level: Vec<u32>,
  },
}

#[napi(object, object_to_js = false)]
pub struct BatchIn {
  /// The batch's seq; omit to take the next one.
  pub seq: Option<BigInt>,
  /// Unix seconds.
  pub ts: Option<f64>,
  pub dp_rank: Option<Either<i32, Null>>,
  /// At most 1024 events.
  #[napi(ts_type = "readonly KvEvent[]")]
  pub events: Vec<EventIn>,
}

#[napi(object)]
pub struct HashBytesOut {
  pub blocks: Option<Vec<Buffer>>,
  pub parent: Option<Buffer>,
}

/// An event as kvplane returns it (replay batches, tree dumps): `type` says which fields are set.
#[napi(object)]
pub struct EventOut {
  #[napi(js_name = "type")]
  pub kind: String,
  pub block_hashes: Option<BigUint64Array>,
  pub parent_block_hash: Option<BigInt>,
  pub token_ids: Option<Uint32Array>,
  pub block_size: Option<u32>,
  pub lora_id: Option<BigInt>,
  pub lora_name: Option<String>,
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
  pub cache_salt: Option<String>,
  #[napi(ts_type = "unknown")]
  pub extra_keys: Option<JsOpaque>,
  pub kv_cache_spec_kind: Option<String>,
  pub kv_cache_spec_sliding_window: Option<i64>,
  pub locality: Option<String>,
  pub ownership: Option<String>,
  pub session_id: Option<String>,
  #[napi(ts_type = "unknown")]
  pub lookahead_token_ids: Option<JsOpaque>,
  pub hash_bytes: Option<HashBytesOut>,
  pub block_hash: Option<BigInt>,
  pub cache_level: Option<DiffIo>,
  pub priority: Option<DiffIo>,
  pub num_blocks_per_cache_level: Option<Vec<u32>>,
}

#[napi(object)]
pub struct BatchOut {
  pub seq: BigInt,
  pub ts: f64,
  pub dp_rank: Option<i32>,
  pub events: Vec<EventOut>,
}

fn hashes_in(v: &Either<BigUint64Array, Vec<BigInt>>) -> KvResult<Vec<u64>> {
  match v {
    Either::A(a) => Ok(a.to_vec()),
    Either::B(v) => v.iter().map(|b| bigint_u64("blockHashes[i]", b)).collect(),
  }
}

fn diff_in(d: &Option<DiffIo>) -> Option<Diff> {
  d.as_ref().map(|d| Diff {
    old: d.old,
    new: d.new,
  })
}

fn diff_out(d: Option<Diff>) -> Option<DiffIo> {
  d.map(|d| DiffIo {
    old: d.old,
    new: d.new,
  })
}

fn opaque(v: &Option<JsOpaque>) -> Option<kvplane_core::codec::value::Value> {
  v.as_ref().map(|v| v.0.clone())
}

pub fn event_in(e: &EventIn) -> KvResult<KvEvent> {
  Ok(match e {
    EventIn::Cleared {} => KvEvent::Cleared,
    EventIn::Removed {
      block_hashes,
      medium,
      group_idx,
      locality,
      ownership,
      hash_bytes,
    } => KvEvent::Removed(RemovedEvent {
      block_hashes: hashes_in(block_hashes)?,
      medium: medium.clone(),
      group_idx: *group_idx,
      locality: locality.clone(),
      ownership: ownership.clone(),
      hash_bytes: hash_bytes
        .as_ref()
        .and_then(|h| h.blocks.as_ref())
        .map(|b| b.iter().map(|x| x.to_vec()).collect()),
    }),
    EventIn::Stored {
      block_hashes,
      parent_block_hash,
      token_ids,
      block_size,
      lora_id,
      lora_name,
      medium,
      group_idx,
      cache_salt,
      extra_keys,
      kv_cache_spec_kind,
      kv_cache_spec_sliding_window,
      locality,
      ownership,
      session_id,
      lookahead_token_ids,
      hash_bytes,
    } => KvEvent::Stored(StoredEvent {
      block_hashes: hashes_in(block_hashes)?,
      parent_block_hash: match parent_block_hash {
        Some(Either::A(p)) => Some(bigint_u64("parentBlockHash", p)?),
        _ => None,
      },
      token_ids: match token_ids {
        None => Vec::new(),
        Some(Either::A(t)) => t.to_vec(),
        Some(Either::B(v)) => tokens_from_f64(v)?,
      },
      block_size: match block_size {
        None => 0,
        Some(b) => hash::block_size_from_f64(*b)? as u32,
      },
      lora_id: lora_id
        .as_ref()
        .map(|v| bigint_i64("loraId", v))
        .transpose()?,
      lora_name: lora_name.clone(),
      medium: medium.clone(),
      group_idx: *group_idx,
      cache_salt: cache_salt.clone(),
      extra_keys: opaque(extra_keys),
      kv_cache_spec_kind: kv_cache_spec_kind.clone(),
      kv_cache_spec_sliding_window: *kv_cache_spec_sliding_window,
      locality: locality.clone(),
      ownership: ownership.clone(),
      session_id: session_id.clone(),
      lookahead_token_ids: opaque(lookahead_token_ids),
      hash_bytes: hash_bytes.as_ref().map(|h| {
        Box::new(HashBytes {
          blocks: h
            .blocks
            .as_ref()
            .map(|b| b.iter().map(|x| x.to_vec()).collect())
            .unwrap_or_default(),
          parent: h.parent.as_ref().map(|p| p.to_vec()),
        })
      }),
    }),
    EventIn::Updated {
      block_hash,
      cache_level,
      priority,
    } => KvEvent::Updated(UpdatedEvent {
      block_hash: bigint_u64("blockHash", block_hash)?,
      cache_level: diff_in(cache_level),
      priority: diff_in(priority),
    }),
    EventIn::Created {
      num_blocks_per_cache_level,
    } => KvEvent::Created(CreatedEvent {
      num_blocks_per_cache_level: num_blocks_per_cache_level.clone(),
    }),
  })
}

pub fn batch_in(b: &BatchIn) -> KvResult<Batch> {
  Ok(Batch {
    seq: b
      .seq
      .as_ref()
      .map(|s| bigint_u64("seq", s))
      .transpose()?
      .unwrap_or(0),
    ts: b.ts.unwrap_or(0.0),
    dp_rank: match b.dp_rank {
      Some(Either::A(r)) => Some(r),
      _ => None,
    },
    events: b.events.iter().map(event_in).collect::<KvResult<_>>()?,
  })
}

fn bufs(v: &[Vec<u8>]) -> Vec<Buffer> {
  v.iter().map(|b| Buffer::from(b.clone())).collect()
}

pub fn event_out(e: &KvEvent) -> EventOut {
  let mut out = EventOut {
    kind: e.kind().name().to_string(),
    block_hashes: None,
    parent_block_hash: None,
    token_ids: None,
    block_size: None,
    lora_id: None,
    lora_name: None,
    medium: None,
    group_idx: None,
    cache_salt: None,
    extra_keys: None,
    kv_cache_spec_kind: None,
    kv_cache_spec_sliding_window: None,
    locality: None,
    ownership: None,
    session_id: None,
    lookahead_token_ids: None,
    hash_bytes: None,
    block_hash: None,
    cache_level: None,
    priority: None,
    num_blocks_per_cache_level: None,
  };
  match e {
    KvEvent::Cleared => {}
    KvEvent::Removed(r) => {
      out.block_hashes = Some(BigUint64Array::new(r.block_hashes.clone()));
      out.medium = r.medium.clone();
      out.group_idx = r.group_idx;
      out.locality = r.locality.clone();
      out.ownership = r.ownership.clone();
      out.hash_bytes = r.hash_bytes.as_ref().map(|b| HashBytesOut {
        blocks: Some(bufs(b)),
        parent: None,
      });
    }
    KvEvent::Stored(s) => {
      out.block_hashes = Some(BigUint64Array::new(s.block_hashes.clone()));
      out.parent_block_hash = s.parent_block_hash.map(BigInt::from);
      out.token_ids = Some(Uint32Array::new(s.token_ids.clone()));
      out.block_size = Some(s.block_size);
      out.lora_id = s.lora_id.map(BigInt::from);
      out.lora_name = s.lora_name.clone();
      out.medium = s.medium.clone();
      out.group_idx = s.group_idx;
      out.cache_salt = s.cache_salt.clone();
      out.extra_keys = s.extra_keys.clone().map(JsOpaque);
      out.kv_cache_spec_kind = s.kv_cache_spec_kind.clone();
      out.kv_cache_spec_sliding_window = s.kv_cache_spec_sliding_window;
      out.locality = s.locality.clone();
      out.ownership = s.ownership.clone();
      out.session_id = s.session_id.clone();
      out.lookahead_token_ids = s.lookahead_token_ids.clone().map(JsOpaque);
      out.hash_bytes = s.hash_bytes.as_ref().map(|h| HashBytesOut {
        blocks: (!h.blocks.is_empty()).then(|| bufs(&h.blocks)),
        parent: h.parent.clone().map(Buffer::from),
      });
    }
    KvEvent::Updated(u) => {
      out.block_hash = Some(BigInt::from(u.block_hash));
      out.cache_level = diff_out(u.cache_level);
      out.priority = diff_out(u.priority);
    }
    KvEvent::Created(c) => {
      out.num_blocks_per_cache_level = Some(c.num_blocks_per_cache_level.clone());
    }
  }
  out
}

pub fn batch_out(b: &Batch) -> BatchOut {
  BatchOut {
    seq: BigInt::from(b.seq),
    ts: b.ts,
    dp_rank: b.dp_rank,
    events: b.events.iter().map(event_out).collect(),
  }
}
