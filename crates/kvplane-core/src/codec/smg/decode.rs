//! `KvEventBatch` and `SubscribeKvEventsRequest` reading: unknown fields are skipped, events
//! with no known `data` (a newer oneof member) are counted and skipped.

use super::*;
use crate::codec::msgpack::decode_error;
use crate::codec::protobuf::{Reader, I64};
use crate::codec::value::Value;
use crate::error::KvResult;
use crate::event::{Batch, KvEvent, RemovedEvent, StoredEvent};

/// What a `KvEventBatch` decoded to.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedProtoBatch {
  pub batch: Batch,
  /// `event_id` of each decoded event, in order.
  pub event_ids: Vec<u64>,
  /// Events with no known `data` (a newer oneof member), skipped.
  pub unknown_events: u32,
}

fn i32_of(v: u64, what: &str) -> KvResult<i32> {
  let v = v as i64;
  i32::try_from(v).map_err(|_| decode_error(format!("protobuf: {what} {v} overflows int32")))
}

/// A `SubscribeKvEventsRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscribeRequest {
  /// `start_sequence_number` (0 when absent: the current state).
  pub start: u64,
  /// `load_records_before_first_batch`: the subscriber takes `load_only` batches numbered 0.
  pub load_records_early: bool,
}

/// Reads a `SubscribeKvEventsRequest`; newer fields are skipped.
pub fn decode_subscribe_request(bytes: &[u8]) -> KvResult<SubscribeRequest> {
  let mut p = Reader::new(bytes);
  let mut out = SubscribeRequest::default();
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      SUBSCRIBE_START_SEQUENCE_NUMBER => out.start = p.varint_field(wire)?,
      SUBSCRIBE_LOAD_RECORDS_EARLY => out.load_records_early = p.varint_field(wire)? != 0,
      _ => p.skip(field, wire)?,
    }
  }
  Ok(out)
}

/// A `KvEventBatch`'s head, read without decoding its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchHead {
  /// `sequence_number`.
  pub seq: u64,
  /// On a snapshot chunk: how many chunks of its snapshot follow it (`count - index - 1`).
  pub snapshot_rest: Option<u64>,
}

/// Reads a `KvEventBatch`'s seq and snapshot position without decoding its events.
pub fn batch_head(bytes: &[u8]) -> KvResult<BatchHead> {
  let mut p = Reader::new(bytes);
  let mut head = BatchHead::default();
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      BATCH_SEQUENCE_NUMBER => head.seq = p.varint_field(wire)?,
      BATCH_SNAPSHOT => {
        let mut q = Reader::new(p.bytes_field(wire)?);
        let (mut index, mut count) = (0u64, 0u64);
        while !q.done() {
          let (f, w) = q.key()?;
          match f {
            SNAPSHOT_INDEX => index = q.varint_field(w)?,
            SNAPSHOT_COUNT => count = q.varint_field(w)?,
            _ => q.skip(f, w)?,
          }
        }
        head.snapshot_rest = Some(count.saturating_sub(index.saturating_add(1)));
      }
      _ => p.skip(field, wire)?,
    }
  }
  Ok(head)
}

pub fn decode_batch(bytes: &[u8]) -> KvResult<DecodedProtoBatch> {
  let mut p = Reader::new(bytes);
  let mut out = DecodedProtoBatch {
    batch: Batch {
      seq: 0,
      ts: 0.0,
      dp_rank: None,
      events: Vec::new(),
    },
    event_ids: Vec::new(),
    unknown_events: 0,
  };
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      BATCH_SEQUENCE_NUMBER => out.batch.seq = p.varint_field(wire)?,
      BATCH_TIMESTAMP => {
        p.expect(wire, I64)?;
        out.batch.ts = f64::from_le_bytes(p.fixed()?);
      }
      BATCH_EVENTS => {
        let (id, ev) = decode_event(p.bytes_field(wire)?)?;
        match ev {
          Some(e) => {
            out.batch.events.push(e);
            out.event_ids.push(id);
          }
          None => out.unknown_events += 1,
        }
      }
      BATCH_DP_RANK => out.batch.dp_rank = Some(i32_of(p.varint_field(wire)?, "dp_rank")?),
      _ => p.skip(field, wire)?,
    }
  }
  Ok(out)
}

/// A `KvCacheEvent`: its id, and its event (`None` for an unknown `data`).
fn decode_event(bytes: &[u8]) -> KvResult<(u64, Option<KvEvent>)> {
  let mut p = Reader::new(bytes);
  let mut id = 0;
  let mut ev = None;
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      EVENT_ID => id = p.varint_field(wire)?,
      EVENT_STORED => ev = Some(decode_stored(p.bytes_field(wire)?)?),
      EVENT_REMOVED => ev = Some(decode_removed(p.bytes_field(wire)?)?),
      EVENT_CLEARED => {
        p.bytes_field(wire)?;
        ev = Some(KvEvent::Cleared);
      }
      _ => p.skip(field, wire)?,
    }
  }
  Ok((id, ev))
}

/// A `KvBlockExtraKey` back into the opaque value vLLM published.
fn decode_extra_key(bytes: &[u8]) -> KvResult<Value> {
  let mut p = Reader::new(bytes);
  let mut v = Value::Nil;
  while !p.done() {
    let (field, wire) = p.key()?;
    v = match field {
      EXTRA_KEY_TEXT => Value::Str(p.string_field(wire)?),
      EXTRA_KEY_BLOB => Value::Bin(p.bytes_field(wire)?.to_vec()),
      EXTRA_KEY_NUMBER => match p.varint_field(wire)? as i64 {
        n if n < 0 => Value::Int(n),
        n => Value::Uint(n as u64),
      },
      EXTRA_KEY_MULTIMODAL => decode_multimodal_key(p.bytes_field(wire)?)?,
      _ => {
        p.skip(field, wire)?;
        v
      }
    };
  }
  Ok(v)
}

/// A `KvMultimodalKey` as the `[identifier, offset]` pair vLLM published.
fn decode_multimodal_key(bytes: &[u8]) -> KvResult<Value> {
  let mut m = Reader::new(bytes);
  let (mut id, mut offset) = (String::new(), 0i64);
  while !m.done() {
    let (f, w) = m.key()?;
    match f {
      MULTIMODAL_IDENTIFIER => id = m.string_field(w)?,
      MULTIMODAL_OFFSET => offset = m.varint_field(w)? as i64,
      _ => m.skip(f, w)?,
    }
  }
  let offset = if offset < 0 {
    Value::Int(offset)
  } else {
    Value::Uint(offset as u64)
  };
  Ok(Value::Array(vec![Value::Str(id), offset]))
}

/// A `KvBlock`, read.
struct Block {
  hash: u64,
  tokens: Vec<u64>,
  size: i32,
  lora: Option<i64>,
  level: Option<i32>,
  extra_keys: Vec<Value>,
}

fn decode_block(bytes: &[u8]) -> KvResult<Block> {
  let mut b = Reader::new(bytes);
  let mut out = Block {
    hash: 0,
    tokens: Vec::new(),
    size: 0,
    lora: None,
    level: None,
    extra_keys: Vec::new(),
  };
  while !b.done() {
    let (f, w) = b.key()?;
    match f {
      BLOCK_HASH => out.hash = b.varint_field(w)?,
      BLOCK_TOKEN_IDS => b.repeated_varint(w, &mut out.tokens)?,
      BLOCK_SIZE => out.size = i32_of(b.varint_field(w)?, "block_size")?,
      BLOCK_LORA_ID => out.lora = Some(b.varint_field(w)? as i64),
      BLOCK_CACHE_LEVEL => out.level = Some(i32_of(b.varint_field(w)?, "cache_level")?),
      BLOCK_EXTRA_KEYS => out.extra_keys.push(decode_extra_key(b.bytes_field(w)?)?),
      _ => b.skip(f, w)?,
    }
  }
  if out.size < 0 {
    return Err(decode_error(format!(
      "protobuf: block_size {} is negative",
      out.size
    )));
  }
  Ok(out)
}

/// Blocks of one stored event; they become one normalized event with the blocks' tokens in a
/// row, `block_size`, `lora_id` and the tier taken from the first block (blocks of different
/// sizes make the event fail the layout check).
fn decode_stored(bytes: &[u8]) -> KvResult<KvEvent> {
  let mut p = Reader::new(bytes);
  let mut s = StoredEvent::default();
  let mut sizes_differ = false;
  let mut level_medium = None;
  let mut tier_medium = None;
  let mut extra: Vec<Value> = Vec::new();
  let mut any_extra = false;
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      STORED_BLOCKS => {
        let block = decode_block(p.bytes_field(wire)?)?;
        for t in block.tokens {
          s.token_ids.push(
            u32::try_from(t)
              .map_err(|_| decode_error(format!("protobuf: token id {t} overflows uint32")))?,
          );
        }
        if s.block_hashes.is_empty() {
          s.block_size = block.size as u32;
          s.lora_id = block.lora;
          level_medium = block.level.and_then(medium_of_cache_level);
        } else if s.block_size != block.size as u32 {
          sizes_differ = true;
        }
        any_extra |= !block.extra_keys.is_empty();
        extra.push(if block.extra_keys.is_empty() {
          Value::Nil
        } else {
          Value::Array(block.extra_keys)
        });
        s.block_hashes.push(block.hash);
      }
      STORED_PARENT_BLOCK_HASH => s.parent_block_hash = Some(p.varint_field(wire)?),
      STORED_TIER => tier_medium = medium_of_tier(p.varint_field(wire)?),
      STORED_MEDIUM => s.medium = Some(p.string_field(wire)?),
      STORED_GROUP_IDX => s.group_idx = Some(p.varint_field(wire)? as u32),
      STORED_KV_CACHE_SPEC_KIND => s.kv_cache_spec_kind = Some(p.string_field(wire)?),
      STORED_KV_CACHE_SPEC_SLIDING_WINDOW => {
        s.kv_cache_spec_sliding_window = Some(p.varint_field(wire)? as u32 as i64)
      }
      STORED_LOCALITY => s.locality = locality_name(p.varint_field(wire)?),
      STORED_OWNERSHIP => s.ownership = Some(p.string_field(wire)?),
      STORED_SESSION_ID => s.session_id = Some(p.string_field(wire)?),
      STORED_LORA_NAME => s.lora_name = Some(p.string_field(wire)?),
      STORED_CACHE_SALT => s.cache_salt = Some(p.string_field(wire)?),
      _ => p.skip(field, wire)?,
    }
  }
  if s.medium.is_none() {
    s.medium = tier_medium.or(level_medium).map(str::to_owned);
  }
  if any_extra {
    s.extra_keys = Some(Value::Array(extra));
  }
  if sizes_differ {
    // Blocks of different sizes cannot form one event: mark the layout as unsplittable.
    s.block_size = 0;
  }
  Ok(KvEvent::Stored(s))
}

/// A `KvBlocksRemoved`.
fn decode_removed(bytes: &[u8]) -> KvResult<KvEvent> {
  let mut p = Reader::new(bytes);
  let mut r = RemovedEvent::default();
  let (mut level_medium, mut tier_medium) = (None, None);
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      REMOVED_BLOCK_HASHES => p.repeated_varint(wire, &mut r.block_hashes)?,
      REMOVED_CACHE_LEVEL => {
        level_medium = medium_of_cache_level(i32_of(p.varint_field(wire)?, "cache_level")?)
      }
      REMOVED_TIER => tier_medium = medium_of_tier(p.varint_field(wire)?),
      REMOVED_MEDIUM => r.medium = Some(p.string_field(wire)?),
      REMOVED_GROUP_IDX => r.group_idx = Some(p.varint_field(wire)? as u32),
      REMOVED_LOCALITY => r.locality = locality_name(p.varint_field(wire)?),
      REMOVED_OWNERSHIP => r.ownership = Some(p.string_field(wire)?),
      _ => p.skip(field, wire)?,
    }
  }
  if r.medium.is_none() {
    r.medium = tier_medium.or(level_medium).map(str::to_owned);
  }
  Ok(KvEvent::Removed(r))
}
