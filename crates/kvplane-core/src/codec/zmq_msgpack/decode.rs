//! Decoding any generation of the ZMQ msgpack batch: `[ts, events, dp_rank?, ...]` with events
//! as tagged maps (any key order; unknown keys skipped) or legacy tagged arrays (`legacy`);
//! hashes as uint64, negative int64 or bin; SGLang's EAGLE token pairs. Events with unknown
//! tags are counted and skipped.

use super::legacy;
use crate::codec::msgpack::{decode_error, Int, Kind, Reader};
use crate::codec::value::Value;
use crate::error::KvResult;
use crate::event::{u64_of_hash_bytes, Batch, KvEvent, RemovedEvent, StoredEvent};

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
pub(super) type Hashes = (Vec<u64>, Option<Vec<Vec<u8>>>);

pub(super) fn read_hashes(r: &mut Reader<'_>) -> KvResult<Hashes> {
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

pub(super) fn read_u32(r: &mut Reader<'_>, what: &str) -> KvResult<u32> {
  match r.read_int()? {
    Int::U(v) if v <= u32::MAX as u64 => Ok(v as u32),
    v => Err(decode_error(format!("{what} {v:?} is not a u32"))),
  }
}

pub(super) fn read_opt_u32(r: &mut Reader<'_>, what: &str) -> KvResult<Option<u32>> {
  if r.try_nil() {
    Ok(None)
  } else {
    read_u32(r, what).map(Some)
  }
}

pub(super) fn read_opt_i64(r: &mut Reader<'_>, what: &str) -> KvResult<Option<i64>> {
  if r.try_nil() {
    return Ok(None);
  }
  let v = r.read_int()?;
  v.as_i64()
    .map(Some)
    .ok_or_else(|| decode_error(format!("{what} {v:?} does not fit an int64")))
}

pub(super) fn read_opt_string(r: &mut Reader<'_>) -> KvResult<Option<String>> {
  Ok(r.read_opt_str()?.map(str::to_owned))
}

pub(super) fn read_opt_value(r: &mut Reader<'_>) -> KvResult<Option<Value>> {
  if r.try_nil() {
    Ok(None)
  } else {
    Value::read(r).map(Some)
  }
}

/// Token ids: ints, or SGLang EAGLE `[a, b]` pairs (the pair's first token is the position's
/// token; the second is the next position's, already in the list).
pub(super) fn read_tokens(r: &mut Reader<'_>) -> KvResult<Vec<u32>> {
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

pub(super) fn read_parent(r: &mut Reader<'_>, s: &mut StoredEvent) -> KvResult<()> {
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

pub(super) fn set_block_hashes(s: &mut StoredEvent, (ids, bytes): Hashes) {
  s.block_hashes = ids;
  if let Some(b) = bytes {
    s.hash_bytes.get_or_insert_with(Default::default).blocks = b;
  }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
  Stored,
  Removed,
  Cleared,
  Unknown,
}

pub(super) fn tag_of(name: &[u8]) -> Tag {
  match name {
    b"BlockStored" => Tag::Stored,
    b"BlockRemoved" => Tag::Removed,
    b"AllBlocksCleared" => Tag::Cleared,
    _ => Tag::Unknown,
  }
}

/// One event, map or legacy array; `None` for an unknown tag.
pub(crate) fn decode_event(r: &mut Reader<'_>) -> KvResult<Option<KvEvent>> {
  match r.peek_kind()? {
    Kind::Map => decode_map_event(r),
    Kind::Array => legacy::decode_event(r),
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
    let key = r.read_str_bytes()?;
    match key {
      b"type" => tag = Some(tag_of(r.read_str_bytes()?)),
      b"block_hashes" => set_block_hashes(&mut s, read_hashes(r)?),
      b"parent_block_hash" => read_parent(r, &mut s)?,
      b"token_ids" => s.token_ids = read_tokens(r)?,
      b"block_size" => s.block_size = read_u32(r, "block_size")?,
      b"lora_id" => s.lora_id = read_opt_i64(r, "lora_id")?,
      b"medium" => s.medium = read_opt_string(r)?,
      b"lora_name" => s.lora_name = read_opt_string(r)?,
      b"extra_keys" => s.extra_keys = read_opt_value(r)?,
      b"group_idx" => s.group_idx = read_opt_u32(r, "group_idx")?,
      b"kv_cache_spec_kind" => s.kv_cache_spec_kind = read_opt_string(r)?,
      b"kv_cache_spec_sliding_window" => {
        s.kv_cache_spec_sliding_window = read_opt_i64(r, "kv_cache_spec_sliding_window")?
      }
      b"locality" => s.locality = read_opt_string(r)?,
      b"ownership" => s.ownership = read_opt_string(r)?,
      b"session_id" => s.session_id = read_opt_string(r)?,
      b"cache_salt" => s.cache_salt = read_opt_string(r)?,
      b"lookahead_token_ids" => s.lookahead_token_ids = read_opt_value(r)?,
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
