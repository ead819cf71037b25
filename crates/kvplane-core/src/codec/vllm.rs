//! The vLLM / SGLang / TRT-LLM ZMQ msgpack stream (SPEC §3.1, §3.2).
//!
//! Decoding accepts every generation: 2- and 3-slot batches (extra slots ignored), tagged-map
//! events in any key order, legacy tagged arrays of every length, hashes as uint64, negative
//! int64 or bin, SGLang's EAGLE token pairs and salted 8th slot; unknown keys are skipped and
//! events with unknown tags are counted and skipped.
//!
//! Encoding writes what msgspec writes for vLLM's (or SGLang's) current struct definitions, or the
//! last legacy array generation.

use super::msgpack::{decode_error, Int, Kind, Reader, Writer};
use super::value::Value;
use crate::error::KvResult;
use crate::event::{u64_of_hash_bytes, Batch, HashBytes, KvEvent, RemovedEvent, StoredEvent};

/// What a payload decoded to.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedBatch {
  pub batch: Batch,
  /// Events whose tag this version does not know (skipped, never guessed).
  pub unknown_events: u32,
}

/// Decodes one batch payload. The batch's `seq` is 0: the seq travels in its own ZMQ frame.
pub fn decode_batch(bytes: &[u8]) -> KvResult<DecodedBatch> {
  let mut r = Reader::new(bytes);
  let slots = r.read_array_len()?;
  if slots < 2 {
    return Err(decode_error(format!(
      "a batch is an array [ts, events, dp_rank?]; got {slots} slots"
    )));
  }
  let ts = r.read_f64()?;
  let n = r.read_array_len()?;
  let mut events = Vec::with_capacity(n);
  let mut unknown_events = 0;
  for i in 0..n {
    match decode_event(&mut r) {
      Ok(Some(e)) => events.push(e),
      Ok(None) => unknown_events += 1,
      Err(mut e) => {
        e.message = format!("event {i}: {}", e.message);
        return Err(e);
      }
    }
  }
  let dp_rank = if slots >= 3 && !r.try_nil() {
    let v = r.read_int()?;
    Some(
      v.as_i64()
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| decode_error(format!("dp_rank {v:?} is out of range")))?,
    )
  } else {
    None
  };
  for _ in 3..slots {
    r.skip()?;
  }
  if !r.is_at_end() {
    return Err(decode_error(format!(
      "{} trailing bytes after the batch",
      bytes.len() - r.pos()
    )));
  }
  Ok(DecodedBatch {
    batch: Batch {
      seq: 0,
      ts,
      dp_rank,
      events,
    },
    unknown_events,
  })
}

/// One engine hash: an integer (either sign) or a byte string.
enum WireHash<'a> {
  Int(u64),
  Bytes(&'a [u8]),
}

fn read_hash<'a>(r: &mut Reader<'a>) -> KvResult<WireHash<'a>> {
  if r.peek_kind()? == Kind::Bin {
    let b = r.read_bin()?;
    if b.is_empty() || b.len() > 64 {
      return Err(decode_error(format!(
        "a byte-string block hash of {} bytes",
        b.len()
      )));
    }
    Ok(WireHash::Bytes(b))
  } else {
    Ok(WireHash::Int(r.read_int()?.bits()))
  }
}

/// Block hash ids, plus their byte-string originals when they came as bytes.
type Hashes = (Vec<u64>, Option<Vec<Vec<u8>>>);

fn read_hashes(r: &mut Reader<'_>) -> KvResult<Hashes> {
  let n = r.read_array_len()?;
  let mut ids = Vec::with_capacity(n);
  let mut bytes: Option<Vec<Vec<u8>>> = None;
  for i in 0..n {
    match read_hash(r)? {
      WireHash::Int(v) if bytes.is_none() => ids.push(v),
      WireHash::Bytes(b) if i == 0 || bytes.is_some() => {
        ids.push(u64_of_hash_bytes(b));
        bytes
          .get_or_insert_with(|| Vec::with_capacity(n))
          .push(b.to_vec());
      }
      _ => return Err(decode_error("block_hashes mix integers and byte strings")),
    }
  }
  Ok((ids, bytes))
}

fn read_u32(r: &mut Reader<'_>, what: &str) -> KvResult<u32> {
  match r.read_int()? {
    Int::U(v) if v <= u32::MAX as u64 => Ok(v as u32),
    v => Err(decode_error(format!("{what} {v:?} is not a u32"))),
  }
}

fn read_opt_u32(r: &mut Reader<'_>, what: &str) -> KvResult<Option<u32>> {
  if r.try_nil() {
    Ok(None)
  } else {
    read_u32(r, what).map(Some)
  }
}

fn read_opt_i64(r: &mut Reader<'_>, what: &str) -> KvResult<Option<i64>> {
  if r.try_nil() {
    return Ok(None);
  }
  let v = r.read_int()?;
  v.as_i64()
    .map(Some)
    .ok_or_else(|| decode_error(format!("{what} {v:?} does not fit an int64")))
}

fn read_opt_string(r: &mut Reader<'_>) -> KvResult<Option<String>> {
  Ok(r.read_opt_str()?.map(str::to_owned))
}

fn read_opt_value(r: &mut Reader<'_>) -> KvResult<Option<Value>> {
  if r.try_nil() {
    Ok(None)
  } else {
    Value::read(r).map(Some)
  }
}

/// Token ids: ints, or SGLang EAGLE `[a, b]` pairs (the pair's first token is the position's
/// token; the second is the next position's, already in the list).
fn read_tokens(r: &mut Reader<'_>) -> KvResult<Vec<u32>> {
  let n = r.read_array_len()?;
  let mut out = Vec::with_capacity(n);
  r.read_u32_run(n, &mut out);
  for _ in out.len()..n {
    if r.peek_kind()? == Kind::Array {
      let k = r.read_array_len()?;
      if k == 0 {
        return Err(decode_error("an empty token pair"));
      }
      out.push(read_u32(r, "token id")?);
      for _ in 1..k {
        r.skip()?;
      }
    } else {
      out.push(read_u32(r, "token id")?);
    }
  }
  Ok(out)
}

fn read_parent(r: &mut Reader<'_>, s: &mut StoredEvent) -> KvResult<()> {
  if r.try_nil() {
    s.parent_block_hash = None;
    return Ok(());
  }
  match read_hash(r)? {
    WireHash::Int(v) => s.parent_block_hash = Some(v),
    WireHash::Bytes(b) => {
      s.parent_block_hash = Some(u64_of_hash_bytes(b));
      s.hash_bytes.get_or_insert_with(Default::default).parent = Some(b.to_vec());
    }
  }
  Ok(())
}

fn set_block_hashes(s: &mut StoredEvent, (ids, bytes): Hashes) {
  s.block_hashes = ids;
  if let Some(b) = bytes {
    s.hash_bytes.get_or_insert_with(Default::default).blocks = b;
  }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
  Stored,
  Removed,
  Cleared,
  Unknown,
}

fn tag_of(name: &str) -> Tag {
  match name {
    "BlockStored" => Tag::Stored,
    "BlockRemoved" => Tag::Removed,
    "AllBlocksCleared" => Tag::Cleared,
    _ => Tag::Unknown,
  }
}

/// One event, map or legacy array; `None` for an unknown tag.
fn decode_event(r: &mut Reader<'_>) -> KvResult<Option<KvEvent>> {
  match r.peek_kind()? {
    Kind::Map => decode_map_event(r),
    Kind::Array => decode_array_event(r),
    k => Err(decode_error(format!(
      "an event must be a map or an array, got {k:?}"
    ))),
  }
}

/// A tagged map: `type` may come anywhere; fields of either event kind are read as they come
/// and the event is built once the tag is known.
fn decode_map_event(r: &mut Reader<'_>) -> KvResult<Option<KvEvent>> {
  let n = r.read_map_len()?;
  let mut tag = None;
  let mut s = StoredEvent::default();
  let mut removed = RemovedEvent::default();
  for _ in 0..n {
    let key = r.read_str()?;
    match key {
      "type" => tag = Some(tag_of(r.read_str()?)),
      "block_hashes" => set_block_hashes(&mut s, read_hashes(r)?),
      "parent_block_hash" => read_parent(r, &mut s)?,
      "token_ids" => s.token_ids = read_tokens(r)?,
      "block_size" => s.block_size = read_u32(r, "block_size")?,
      "lora_id" => s.lora_id = read_opt_i64(r, "lora_id")?,
      "medium" => s.medium = read_opt_string(r)?,
      "lora_name" => s.lora_name = read_opt_string(r)?,
      "extra_keys" => s.extra_keys = read_opt_value(r)?,
      "group_idx" => s.group_idx = read_opt_u32(r, "group_idx")?,
      "kv_cache_spec_kind" => s.kv_cache_spec_kind = read_opt_string(r)?,
      "kv_cache_spec_sliding_window" => {
        s.kv_cache_spec_sliding_window = read_opt_i64(r, "kv_cache_spec_sliding_window")?
      }
      "locality" => s.locality = read_opt_string(r)?,
      "ownership" => s.ownership = read_opt_string(r)?,
      "session_id" => s.session_id = read_opt_string(r)?,
      "cache_salt" => s.cache_salt = read_opt_string(r)?,
      "lookahead_token_ids" => s.lookahead_token_ids = read_opt_value(r)?,
      _ => r.skip()?,
    }
  }
  Ok(match tag {
    None => return Err(decode_error("an event map without a \"type\" key")),
    Some(Tag::Unknown) => None,
    Some(Tag::Cleared) => Some(KvEvent::Cleared),
    Some(Tag::Stored) => Some(KvEvent::Stored(s)),
    Some(Tag::Removed) => {
      removed.block_hashes = std::mem::take(&mut s.block_hashes);
      removed.hash_bytes = s.hash_bytes.take().map(|h| h.blocks);
      removed.medium = s.medium.take();
      removed.group_idx = s.group_idx;
      removed.locality = s.locality.take();
      removed.ownership = s.ownership.take();
      Some(KvEvent::Removed(removed))
    }
  })
}

/// Slots of a legacy `BlockStored` array after the tag, in order.
const LEGACY_STORED_MIN_SLOTS: usize = 5;

/// A legacy tagged array `[tag, field, ...]` with every declared field present.
fn decode_array_event(r: &mut Reader<'_>) -> KvResult<Option<KvEvent>> {
  let n = r.read_array_len()?;
  if n == 0 {
    return Err(decode_error("an empty event array"));
  }
  let tag = tag_of(r.read_str()?);
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

/// Which struct definitions an encoding follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZmqFormat {
  /// vLLM's current tagged maps (its `BlockStored` declares 15 fields: a map16 header).
  VllmMap,
  /// vLLM's last legacy generation: tagged arrays, every field present.
  VllmArray,
  /// SGLang's current tagged maps (signed int64 hashes).
  SglangMap,
}

/// Encodes a batch payload `[ts, events, dp_rank]` as msgspec does. TRT-LLM-only events
/// (`updated`, `created`) have no form in these structs and are left out.
pub fn encode_batch(b: &Batch, format: ZmqFormat, w: &mut Writer) {
  w.array_len(3);
  w.f64(b.ts);
  let n = b
    .events
    .iter()
    .filter(|e| !matches!(e, KvEvent::Updated(_) | KvEvent::Created(_)))
    .count();
  w.array_len(n);
  for e in &b.events {
    encode_event(e, format, w);
  }
  match b.dp_rank {
    Some(r) => w.int(r as i64),
    None => w.nil(),
  }
}

/// Encodes one stored event (tree dumps hold them without the enum).
pub fn encode_stored(s: &StoredEvent, format: ZmqFormat, w: &mut Writer) {
  match format {
    ZmqFormat::VllmMap => vllm_stored(s, w),
    ZmqFormat::SglangMap => sglang_stored(s, w),
    ZmqFormat::VllmArray => legacy_stored(s, w),
  }
}

pub fn encode_event(e: &KvEvent, format: ZmqFormat, w: &mut Writer) {
  match (format, e) {
    (_, KvEvent::Updated(_) | KvEvent::Created(_)) => {}
    (_, KvEvent::Stored(s)) => encode_stored(s, format, w),
    (ZmqFormat::VllmMap, KvEvent::Removed(r)) => vllm_removed(r, w),
    (ZmqFormat::SglangMap, KvEvent::Removed(r)) => sglang_removed(r, w),
    (ZmqFormat::VllmMap | ZmqFormat::SglangMap, KvEvent::Cleared) => {
      w.map_len(1);
      w.str("type");
      w.str("AllBlocksCleared");
    }
    (ZmqFormat::VllmArray, KvEvent::Removed(r)) => legacy_removed(r, w),
    (ZmqFormat::VllmArray, KvEvent::Cleared) => {
      w.array_len(1);
      w.str("AllBlocksCleared");
    }
  }
}

fn hashes_unsigned(ids: &[u64], bytes: Option<&Vec<Vec<u8>>>, w: &mut Writer) {
  w.array_len(ids.len());
  match bytes {
    Some(b) if b.len() == ids.len() => b.iter().for_each(|h| w.bin(h)),
    _ => ids.iter().for_each(|&h| w.uint(h)),
  }
}

fn hashes_signed(ids: &[u64], w: &mut Writer) {
  w.array_len(ids.len());
  ids.iter().for_each(|&h| w.int(h as i64));
}

fn parent_unsigned(s: &StoredEvent, w: &mut Writer) {
  match (
    s.parent_block_hash,
    s.hash_bytes.as_ref().and_then(|h| h.parent.as_ref()),
  ) {
    (Some(_), Some(b)) => w.bin(b),
    (Some(p), None) => w.uint(p),
    (None, _) => w.nil(),
  }
}

fn opt_i64(v: Option<i64>, w: &mut Writer) {
  match v {
    Some(v) => w.int(v),
    None => w.nil(),
  }
}

fn block_hash_bytes(s: &StoredEvent) -> Option<&Vec<Vec<u8>>> {
  s.hash_bytes
    .as_deref()
    .map(|h: &HashBytes| &h.blocks)
    .filter(|b| !b.is_empty())
}

/// Declared fields of vLLM's `BlockStored` / `BlockRemoved`, plus the tag.
pub(super) const VLLM_STORED_DECLARED: usize = 15 + 1;
pub(super) const VLLM_REMOVED_DECLARED: usize = 5 + 1;
const SGLANG_STORED_DECLARED: usize = 9 + 1;
const SGLANG_REMOVED_DECLARED: usize = 2 + 1;

fn vllm_stored(s: &StoredEvent, w: &mut Writer) {
  let optional = [
    s.extra_keys.is_some(),
    s.group_idx.is_some(),
    s.kv_cache_spec_kind.is_some(),
    s.kv_cache_spec_sliding_window.is_some(),
    s.locality.is_some(),
    s.ownership.is_some(),
    s.session_id.is_some(),
    s.lookahead_token_ids.is_some(),
  ];
  let present = 8 + optional.iter().filter(|&&p| p).count();
  w.struct_map_len(present, VLLM_STORED_DECLARED);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  hashes_unsigned(&s.block_hashes, block_hash_bytes(s), w);
  w.str("parent_block_hash");
  parent_unsigned(s, w);
  w.str("token_ids");
  w.u32_array(&s.token_ids);
  w.str("block_size");
  w.uint(s.block_size as u64);
  w.str("lora_id");
  opt_i64(s.lora_id, w);
  w.str("medium");
  w.opt_str(s.medium.as_deref());
  w.str("lora_name");
  w.opt_str(s.lora_name.as_deref());
  if let Some(v) = &s.extra_keys {
    w.str("extra_keys");
    v.write(w);
  }
  if let Some(v) = s.group_idx {
    w.str("group_idx");
    w.uint(v as u64);
  }
  if let Some(v) = &s.kv_cache_spec_kind {
    w.str("kv_cache_spec_kind");
    w.str(v);
  }
  if let Some(v) = s.kv_cache_spec_sliding_window {
    w.str("kv_cache_spec_sliding_window");
    w.int(v);
  }
  if let Some(v) = &s.locality {
    w.str("locality");
    w.str(v);
  }
  if let Some(v) = &s.ownership {
    w.str("ownership");
    w.str(v);
  }
  if let Some(v) = &s.session_id {
    w.str("session_id");
    w.str(v);
  }
  if let Some(v) = &s.lookahead_token_ids {
    w.str("lookahead_token_ids");
    v.write(w);
  }
}

fn vllm_removed(r: &RemovedEvent, w: &mut Writer) {
  let present = 3
    + [
      r.group_idx.is_some(),
      r.locality.is_some(),
      r.ownership.is_some(),
    ]
    .iter()
    .filter(|&&p| p)
    .count();
  w.struct_map_len(present, VLLM_REMOVED_DECLARED);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  hashes_unsigned(&r.block_hashes, r.hash_bytes.as_ref(), w);
  w.str("medium");
  w.opt_str(r.medium.as_deref());
  if let Some(v) = r.group_idx {
    w.str("group_idx");
    w.uint(v as u64);
  }
  if let Some(v) = &r.locality {
    w.str("locality");
    w.str(v);
  }
  if let Some(v) = &r.ownership {
    w.str("ownership");
    w.str(v);
  }
}

fn sglang_stored(s: &StoredEvent, w: &mut Writer) {
  let optional = [
    s.medium.is_some(),
    s.cache_salt.is_some(),
    s.session_id.is_some(),
    s.lora_name.is_some(),
  ];
  let present = 6 + optional.iter().filter(|&&p| p).count();
  w.struct_map_len(present, SGLANG_STORED_DECLARED);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  hashes_signed(&s.block_hashes, w);
  w.str("parent_block_hash");
  match s.parent_block_hash {
    Some(p) => w.int(p as i64),
    None => w.nil(),
  }
  w.str("token_ids");
  w.u32_array(&s.token_ids);
  w.str("block_size");
  w.uint(s.block_size as u64);
  w.str("lora_id");
  opt_i64(s.lora_id, w);
  for (key, v) in [
    ("medium", &s.medium),
    ("cache_salt", &s.cache_salt),
    ("session_id", &s.session_id),
    ("lora_name", &s.lora_name),
  ] {
    if let Some(v) = v {
      w.str(key);
      w.str(v);
    }
  }
}

fn sglang_removed(r: &RemovedEvent, w: &mut Writer) {
  w.struct_map_len(2 + r.medium.is_some() as usize, SGLANG_REMOVED_DECLARED);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  hashes_signed(&r.block_hashes, w);
  if let Some(m) = &r.medium {
    w.str("medium");
    w.str(m);
  }
}

fn legacy_stored(s: &StoredEvent, w: &mut Writer) {
  w.array_len(12);
  w.str("BlockStored");
  hashes_unsigned(&s.block_hashes, block_hash_bytes(s), w);
  parent_unsigned(s, w);
  w.u32_array(&s.token_ids);
  w.uint(s.block_size as u64);
  opt_i64(s.lora_id, w);
  w.opt_str(s.medium.as_deref());
  w.opt_str(s.lora_name.as_deref());
  match &s.extra_keys {
    Some(v) => v.write(w),
    None => w.nil(),
  }
  match s.group_idx {
    Some(v) => w.uint(v as u64),
    None => w.nil(),
  }
  w.opt_str(s.kv_cache_spec_kind.as_deref());
  opt_i64(s.kv_cache_spec_sliding_window, w);
}

fn legacy_removed(r: &RemovedEvent, w: &mut Writer) {
  w.array_len(4);
  w.str("BlockRemoved");
  hashes_unsigned(&r.block_hashes, r.hash_bytes.as_ref(), w);
  w.opt_str(r.medium.as_deref());
  match r.group_idx {
    Some(v) => w.uint(v as u64),
    None => w.nil(),
  }
}
