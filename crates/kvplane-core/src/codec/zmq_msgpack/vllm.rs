//! vLLM's current events: tagged maps, as msgspec writes its `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` structs (absent optional fields left out). Column events are written from
//! bytes prepared once per chunk (`prepared`).

use super::prepared::Prepared;
use super::{block_hash_bytes, frame, hashes_unsigned, opt_i64, parent_unsigned};
use crate::codec::msgpack::Writer;
use crate::event::{EventRef, EventRefs, RemovedView, StoredFields};

/// Declared fields of vLLM's `BlockStored` / `BlockRemoved`, plus the tag.
pub(super) const VLLM_STORED_DECLARED: usize = 15 + 1;
pub(super) const VLLM_REMOVED_DECLARED: usize = 5 + 1;

/// Encodes a batch payload `[ts, events, dp_rank]` as msgspec does.
pub fn encode_batch<'a>(ts: f64, events: impl EventRefs<'a>, dp_rank: Option<i32>, w: &mut Writer) {
  let mut prepared = Prepared::default();
  frame(ts, events, dp_rank, w, |e, w| match e {
    EventRef::Stored(s) => match (s.chunk_attrs(), s.event()) {
      (Some(attrs), _) => prepared.of(attrs).stored(s, w),
      // A whole event's fields are read directly, not through the view's per-field branches.
      (None, Some(e)) => encode_stored(e, w),
      (None, None) => encode_stored(*s, w),
    },
    EventRef::Removed(r) => match r.chunk_attrs() {
      Some(attrs) => prepared.of(attrs).removed(r, w),
      None => encode_removed(r, w),
    },
    _ => encode_event(e, w),
  });
}

/// One event; `updated`/`created` write nothing.
pub fn encode_event(e: &EventRef<'_>, w: &mut Writer) {
  match e {
    EventRef::Stored(s) => encode_stored(*s, w),
    EventRef::Removed(r) => encode_removed(r, w),
    EventRef::Cleared => {
      w.map_len(1);
      w.str("type");
      w.str("AllBlocksCleared");
    }
    EventRef::Updated(_) | EventRef::Created(_) => {}
  }
}

/// One stored event, from a whole event or a view (tree dumps hold them without the enum).
#[inline]
pub fn encode_stored<'a>(s: impl StoredFields<'a>, w: &mut Writer) {
  let extra_keys = s.extra_keys();
  let group_idx = s.group_idx();
  let kv_cache_spec_kind = s.kv_cache_spec_kind();
  let kv_cache_spec_sliding_window = s.kv_cache_spec_sliding_window();
  let locality = s.locality();
  let ownership = s.ownership();
  let session_id = s.session_id();
  let lookahead_token_ids = s.lookahead_token_ids();
  let optional = [
    extra_keys.is_some(),
    group_idx.is_some(),
    kv_cache_spec_kind.is_some(),
    kv_cache_spec_sliding_window.is_some(),
    locality.is_some(),
    ownership.is_some(),
    session_id.is_some(),
    lookahead_token_ids.is_some(),
  ];
  let present = 8 + optional.iter().filter(|&&p| p).count();
  w.struct_map_len(present, VLLM_STORED_DECLARED);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  hashes_unsigned(s.block_hashes(), block_hash_bytes(s), w);
  w.str("parent_block_hash");
  parent_unsigned(s, w);
  w.str("token_ids");
  w.u32_array(s.token_ids());
  w.str("block_size");
  w.uint(s.block_size() as u64);
  w.str("lora_id");
  opt_i64(s.lora_id(), w);
  w.str("medium");
  w.opt_str(s.medium());
  w.str("lora_name");
  w.opt_str(s.lora_name());
  if let Some(v) = extra_keys {
    w.str("extra_keys");
    v.write(w);
  }
  if let Some(v) = group_idx {
    w.str("group_idx");
    w.uint(v as u64);
  }
  if let Some(v) = kv_cache_spec_kind {
    w.str("kv_cache_spec_kind");
    w.str(v);
  }
  if let Some(v) = kv_cache_spec_sliding_window {
    w.str("kv_cache_spec_sliding_window");
    w.int(v);
  }
  if let Some(v) = locality {
    w.str("locality");
    w.str(v);
  }
  if let Some(v) = ownership {
    w.str("ownership");
    w.str(v);
  }
  if let Some(v) = session_id {
    w.str("session_id");
    w.str(v);
  }
  if let Some(v) = lookahead_token_ids {
    w.str("lookahead_token_ids");
    v.write(w);
  }
}

#[inline]
fn encode_removed(r: &RemovedView<'_>, w: &mut Writer) {
  let group_idx = r.group_idx();
  let locality = r.locality();
  let ownership = r.ownership();
  let present = 3
    + [group_idx.is_some(), locality.is_some(), ownership.is_some()]
      .iter()
      .filter(|&&p| p)
      .count();
  w.struct_map_len(present, VLLM_REMOVED_DECLARED);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  hashes_unsigned(r.block_hashes, r.hash_bytes(), w);
  w.str("medium");
  w.opt_str(r.medium());
  if let Some(v) = group_idx {
    w.str("group_idx");
    w.uint(v as u64);
  }
  if let Some(v) = locality {
    w.str("locality");
    w.str(v);
  }
  if let Some(v) = ownership {
    w.str("ownership");
    w.str(v);
  }
}
