//! vLLM's legacy events: tagged arrays `[tag, field, ...]`. Decoding takes every generation
//! (SGLang's salted 8th slot included); encoding writes the last generation, every field present.

use super::decode::{
  read_hashes, read_opt_i64, read_opt_string, read_opt_u32, read_opt_value, read_parent,
  read_tokens, read_u32, set_block_hashes, tag_of, Tag,
};
use super::{block_hash_bytes, frame, hashes_unsigned, opt_i64, parent_unsigned};
use crate::codec::msgpack::{decode_error, Kind, Reader, Writer};
use crate::error::KvResult;
use crate::event::{
  EventRef, EventRefs, KvEvent, RemovedEvent, RemovedView, StoredEvent, StoredFields, StoredView,
};

/// Slots of a legacy `BlockStored` array after the tag, in order.
const LEGACY_STORED_MIN_SLOTS: usize = 5;

/// A legacy tagged array `[tag, field, ...]` with every declared field present.
pub(super) fn decode_event(r: &mut Reader<'_>) -> KvResult<Option<KvEvent>> {
  let n = r.read_array_len()?;
  if n == 0 {
    return Err(decode_error("an empty event array"));
  }
  let tag = tag_of(r.read_str_bytes()?);
  let fields = n - 1;
  let mut read = 0;
  let ev = match tag {
    Tag::Unknown => None,
    Tag::Cleared => Some(KvEvent::Cleared),
    Tag::Removed => {
      if fields < 1 {
        return Err(decode_error("a BlockRemoved array without block_hashes"));
      }
      let (ids, bytes) = read_hashes(r)?;
      let mut e = RemovedEvent {
        block_hashes: ids,
        hash_bytes: bytes,
        ..Default::default()
      };
      read = 1;
      if fields >= 2 {
        e.medium = read_opt_string(r)?;
        read = 2;
      }
      if fields >= 3 {
        e.group_idx = read_opt_u32(r, "group_idx")?;
        read = 3;
      }
      Some(KvEvent::Removed(e))
    }
    Tag::Stored => {
      if fields < LEGACY_STORED_MIN_SLOTS {
        return Err(decode_error(format!(
          "a BlockStored array of {n} slots (at least {} expected)",
          LEGACY_STORED_MIN_SLOTS + 1
        )));
      }
      let mut s = StoredEvent::default();
      set_block_hashes(&mut s, read_hashes(r)?);
      read_parent(r, &mut s)?;
      s.token_ids = read_tokens(r)?;
      s.block_size = read_u32(r, "block_size")?;
      s.lora_id = read_opt_i64(r, "lora_id")?;
      read = 5;
      if fields > read {
        s.medium = read_opt_string(r)?;
        read += 1;
      }
      if fields > read {
        // vLLM put `lora_name` here; SGLang's salted variant a map `{cache_salt}`.
        if r.peek_kind()? == Kind::Map {
          let m = r.read_map_len()?;
          for _ in 0..m {
            if r.read_str()? == "cache_salt" {
              s.cache_salt = read_opt_string(r)?;
            } else {
              r.skip()?;
            }
          }
        } else {
          s.lora_name = read_opt_string(r)?;
        }
        read += 1;
      }
      if fields > read {
        s.extra_keys = read_opt_value(r)?;
        read += 1;
      }
      if fields > read {
        s.group_idx = read_opt_u32(r, "group_idx")?;
        read += 1;
      }
      if fields > read {
        s.kv_cache_spec_kind = read_opt_string(r)?;
        read += 1;
      }
      if fields > read {
        s.kv_cache_spec_sliding_window = read_opt_i64(r, "kv_cache_spec_sliding_window")?;
        read += 1;
      }
      Some(KvEvent::Stored(s))
    }
  };
  for _ in read..fields {
    r.skip()?;
  }
  Ok(ev)
}

/// Encodes a batch payload `[ts, events, dp_rank]` in the last legacy generation.
pub fn encode_batch<'a>(ts: f64, events: impl EventRefs<'a>, dp_rank: Option<i32>, w: &mut Writer) {
  frame(ts, events, dp_rank, w, encode_event);
}

/// One event; `updated`/`created` write nothing.
pub fn encode_event(e: &EventRef<'_>, w: &mut Writer) {
  match e {
    EventRef::Stored(s) => encode_stored(s, w),
    EventRef::Removed(r) => encode_removed(r, w),
    EventRef::Cleared => {
      w.array_len(1);
      w.str("AllBlocksCleared");
    }
    EventRef::Updated(_) | EventRef::Created(_) => {}
  }
}

fn encode_stored(s: &StoredView<'_>, w: &mut Writer) {
  w.array_len(12);
  w.str("BlockStored");
  hashes_unsigned(s.block_hashes, block_hash_bytes(*s), w);
  parent_unsigned(*s, w);
  w.u32_array(s.token_ids);
  w.uint(s.block_size() as u64);
  opt_i64(s.lora_id(), w);
  w.opt_str(s.medium());
  w.opt_str(s.lora_name());
  match s.extra_keys() {
    Some(v) => v.write(w),
    None => w.nil(),
  }
  match s.group_idx() {
    Some(v) => w.uint(v as u64),
    None => w.nil(),
  }
  w.opt_str(s.kv_cache_spec_kind());
  opt_i64(s.kv_cache_spec_sliding_window(), w);
}

fn encode_removed(r: &RemovedView<'_>, w: &mut Writer) {
  w.array_len(4);
  w.str("BlockRemoved");
  hashes_unsigned(r.block_hashes, r.hash_bytes(), w);
  w.opt_str(r.medium());
  match r.group_idx() {
    Some(v) => w.uint(v as u64),
    None => w.nil(),
  }
}
