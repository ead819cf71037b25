//! SGLang's current events: tagged maps as msgspec writes its structs, hashes as signed int64s.

use super::{frame, opt_i64};
use crate::codec::msgpack::Writer;
use crate::event::{EventRef, EventRefs, RemovedView, StoredFields, StoredView};

/// Declared fields of SGLang's `BlockStored` / `BlockRemoved`, plus the tag.
const SGLANG_STORED_DECLARED: usize = 9 + 1;
const SGLANG_REMOVED_DECLARED: usize = 2 + 1;

/// Encodes a batch payload `[ts, events, dp_rank]` as msgspec does.
pub fn encode_batch<'a>(ts: f64, events: impl EventRefs<'a>, dp_rank: Option<i32>, w: &mut Writer) {
  frame(ts, events, dp_rank, w, encode_event);
}

/// One event; `updated`/`created` write nothing.
pub fn encode_event(e: &EventRef<'_>, w: &mut Writer) {
  match e {
    EventRef::Stored(s) => encode_stored(s, w),
    EventRef::Removed(r) => encode_removed(r, w),
    EventRef::Cleared => {
      w.map_len(1);
      w.str("type");
      w.str("AllBlocksCleared");
    }
    EventRef::Updated(_) | EventRef::Created(_) => {}
  }
}

fn hashes_signed(ids: &[u64], w: &mut Writer) {
  w.array_len(ids.len());
  ids.iter().for_each(|&h| w.int(h as i64));
}

fn encode_stored(s: &StoredView<'_>, w: &mut Writer) {
  let optional = [
    ("medium", s.medium()),
    ("cache_salt", s.cache_salt()),
    ("session_id", s.session_id()),
    ("lora_name", s.lora_name()),
  ];
  let present = 6 + optional.iter().filter(|(_, v)| v.is_some()).count();
  w.struct_map_len(present, SGLANG_STORED_DECLARED);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  hashes_signed(s.block_hashes, w);
  w.str("parent_block_hash");
  match s.parent_block_hash {
    Some(p) => w.int(p as i64),
    None => w.nil(),
  }
  w.str("token_ids");
  w.u32_array(s.token_ids);
  w.str("block_size");
  w.uint(s.block_size() as u64);
  w.str("lora_id");
  opt_i64(s.lora_id(), w);
  for (key, v) in optional {
    if let Some(v) = v {
      w.str(key);
      w.str(v);
    }
  }
}

fn encode_removed(r: &RemovedView<'_>, w: &mut Writer) {
  let medium = r.medium();
  w.struct_map_len(2 + medium.is_some() as usize, SGLANG_REMOVED_DECLARED);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  hashes_signed(r.block_hashes, w);
  if let Some(m) = medium {
    w.str("medium");
    w.str(m);
  }
}
