//! TensorRT-LLM's JSON KV-cache events (docs/protocol.md#tensorrt-llm-json): the list
//! `/kv_cache_events` returns.
//!
//! Each element is `{event_id, data, window_size, attention_dp_rank?, hash_algo?,
//! layer_group_id?}` with `data.type` one of `created`, `stored`, `removed`, `updated`. Hashes
//! are JSON integers (V1 block keys, `v2_sha256_64`) or hex strings of the 32-byte V2 key
//! (`v2_sha256`); a hex key's u64 id is its first 8 bytes big-endian, which is TensorRT-LLM's own
//! `v2_sha256_64` form. Stored blocks' tokens are concatenated; `block_size` is the first block's
//! token count, so partial blocks fail the layout check rather than being guessed at.
//! Consecutive events of one attention-DP rank form one batch.

use super::msgpack::decode_error;
use crate::error::KvResult;
use crate::event::{
  Batch, CreatedEvent, Diff, HashBytes, KvEvent, RemovedEvent, StoredEvent, UpdatedEvent,
  MAX_BATCH_EVENTS,
};
use serde_json::Value as J;

/// The decoded list: batches in order, with each event's TRT-LLM `event_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedEvents {
  pub batches: Vec<Batch>,
  pub event_ids: Vec<Vec<u64>>,
  /// Events with an unknown `data.type`, skipped.
  pub unknown_events: u32,
}

fn field<'a>(o: &'a J, k: &str) -> Option<&'a J> {
  o.get(k).filter(|v| !v.is_null())
}

fn err<T>(what: String) -> KvResult<T> {
  Err(decode_error(format!("TensorRT-LLM event: {what}")))
}

fn u64_of(v: &J, what: &str) -> KvResult<u64> {
  match v.as_u64().or_else(|| v.as_i64().map(|i| i as u64)) {
    Some(x) => Ok(x),
    None => err(format!("{what} is not an integer: {v}")),
  }
}

fn i64_of(v: &J, what: &str) -> KvResult<i64> {
  match v.as_i64() {
    Some(x) => Ok(x),
    None => err(format!("{what} is not an int64: {v}")),
  }
}

fn u32_of(v: &J, what: &str) -> KvResult<u32> {
  match v.as_u64().and_then(|x| u32::try_from(x).ok()) {
    Some(x) => Ok(x),
    None => err(format!("{what} is not a u32: {v}")),
  }
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
  let s = s.strip_prefix("0x").unwrap_or(s);
  if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 128 {
    return None;
  }
  (0..s.len())
    .step_by(2)
    .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
    .collect()
}

/// A hash: its u64 id and, for a hex key, the key's bytes.
fn hash_of(v: &J, what: &str) -> KvResult<(u64, Option<Vec<u8>>)> {
  if let Some(s) = v.as_str() {
    let Some(b) = hex_bytes(s) else {
      return err(format!("{what} is not a hex string: {s:?}"));
    };
    let mut first = [0u8; 8];
    let n = b.len().min(8);
    first[8 - n..].copy_from_slice(&b[..n]);
    return Ok((u64::from_be_bytes(first), Some(b)));
  }
  Ok((u64_of(v, what)?, None))
}

fn diff_of(v: Option<&J>, what: &str) -> KvResult<Option<Diff>> {
  let Some(d) = v else {
    return Ok(None);
  };
  let get = |k: &str| match field(d, k) {
    Some(x) => i64_of(x, what),
    None => err(format!("{what} lacks {k}")),
  };
  Ok(Some(Diff {
    old: get("old_value")?,
    new: get("new_value")?,
  }))
}

fn medium_of_level(level: Option<&J>) -> Option<String> {
  match level?.as_i64()? {
    0 => Some("GPU".to_owned()),
    1 => Some("CPU".to_owned()),
    _ => None,
  }
}

fn stored(data: &J) -> KvResult<StoredEvent> {
  let mut s = StoredEvent::default();
  let mut bytes = HashBytes::default();
  if let Some(p) = field(data, "parent_hash") {
    let (id, b) = hash_of(p, "parent_hash")?;
    s.parent_block_hash = Some(id);
    bytes.parent = b;
  }
  let Some(blocks) = field(data, "blocks").and_then(J::as_array) else {
    return err("a stored event without blocks".into());
  };
  let mut unsplittable = false;
  for (i, blk) in blocks.iter().enumerate() {
    let Some(h) = field(blk, "block_hash") else {
      return err(format!("stored block {i} without block_hash"));
    };
    let (id, b) = hash_of(h, "block_hash")?;
    s.block_hashes.push(id);
    if let Some(b) = b {
      bytes.blocks.push(b);
    }
    let toks = field(blk, "tokens").and_then(J::as_array);
    let toks = toks.map(Vec::as_slice).unwrap_or(&[]);
    for t in toks {
      match field(t, "token_id") {
        // A multimodal digest token (a string) has no u32 id: the event is not indexable.
        Some(J::String(_)) => unsplittable = true,
        Some(v) => s.token_ids.push(u32_of(v, "token_id")?),
        None => return err(format!("a token of block {i} without token_id")),
      }
    }
    if i == 0 {
      s.block_size = toks.len() as u32;
      s.medium = medium_of_level(field(blk, "cache_level"));
      s.cache_salt = field(blk, "cache_salt")
        .and_then(J::as_str)
        .map(str::to_owned);
    }
  }
  if let Some(l) = field(data, "lora_id") {
    s.lora_id = Some(i64_of(l, "lora_id")?);
  }
  if unsplittable {
    s.block_size = 0;
  }
  if !bytes.blocks.is_empty() && bytes.blocks.len() != s.block_hashes.len() {
    return err("a stored event mixes integer and hex block hashes".into());
  }
  if !bytes.blocks.is_empty() || bytes.parent.is_some() {
    s.hash_bytes = Some(Box::new(bytes));
  }
  Ok(s)
}

fn event(e: &J) -> KvResult<Option<KvEvent>> {
  let Some(data) = field(e, "data") else {
    return err("an event without data".into());
  };
  let kind = field(data, "type").and_then(J::as_str).unwrap_or("");
  Ok(Some(match kind {
    "stored" => KvEvent::Stored(stored(data)?),
    "removed" => {
      let Some(hs) = field(data, "block_hashes").and_then(J::as_array) else {
        return err("a removed event without block_hashes".into());
      };
      let mut r = RemovedEvent::default();
      let mut bytes = Vec::new();
      for h in hs {
        let (id, b) = hash_of(h, "block_hashes[i]")?;
        r.block_hashes.push(id);
        bytes.extend(b);
      }
      if !bytes.is_empty() {
        r.hash_bytes = Some(bytes);
      }
      KvEvent::Removed(r)
    }
    "updated" => {
      let Some(h) = field(data, "block_hash") else {
        return err("an updated event without block_hash".into());
      };
      KvEvent::Updated(UpdatedEvent {
        block_hash: hash_of(h, "block_hash")?.0,
        cache_level: diff_of(field(data, "cache_level"), "cache_level")?,
        priority: diff_of(field(data, "priority"), "priority")?,
      })
    }
    "created" => {
      let levels = field(data, "num_blocks_per_cache_level").and_then(J::as_array);
      let levels = levels.map(Vec::as_slice).unwrap_or(&[]);
      KvEvent::Created(CreatedEvent {
        num_blocks_per_cache_level: levels
          .iter()
          .map(|v| u32_of(v, "num_blocks_per_cache_level[i]"))
          .collect::<KvResult<_>>()?,
      })
    }
    _ => return Ok(None),
  }))
}

/// Decodes the JSON list (a single event object is accepted as a list of one).
pub fn decode_json(bytes: &[u8]) -> KvResult<DecodedEvents> {
  let root: J = match serde_json::from_slice(bytes) {
    Ok(v) => v,
    Err(e) => {
      return Err(decode_error(format!(
        "TensorRT-LLM events: invalid JSON: {e}"
      )))
    }
  };
  let items: &[J] = match &root {
    J::Array(a) => a,
    J::Object(_) => std::slice::from_ref(&root),
    _ => return err("the events are not a JSON list".into()),
  };
  let mut out = DecodedEvents {
    batches: Vec::new(),
    event_ids: Vec::new(),
    unknown_events: 0,
  };
  for (i, e) in items.iter().enumerate() {
    let id = match field(e, "event_id") {
      Some(v) => u64_of(v, "event_id")?,
      None => return err(format!("event {i} without event_id")),
    };
    let rank = match field(e, "attention_dp_rank") {
      Some(v) => Some(
        v.as_i64()
          .and_then(|r| i32::try_from(r).ok())
          .ok_or_else(|| decode_error(format!("attention_dp_rank {v} is out of range")))?,
      ),
      None => None,
    };
    let ev = event(e).map_err(|mut x| {
      x.message = format!("event {i}: {}", x.message);
      x
    })?;
    let Some(mut ev) = ev else {
      out.unknown_events += 1;
      continue;
    };
    if let (KvEvent::Stored(s), Some(g)) = (&mut ev, field(e, "layer_group_id")) {
      s.group_idx = Some(u32_of(g, "layer_group_id")?);
    }
    let same_batch = out
      .batches
      .last()
      .is_some_and(|b| b.dp_rank == rank && b.events.len() < MAX_BATCH_EVENTS);
    if !same_batch {
      out.batches.push(Batch {
        seq: 0,
        ts: 0.0,
        dp_rank: rank,
        events: Vec::new(),
      });
      out.event_ids.push(Vec::new());
    }
    out.batches.last_mut().expect("pushed").events.push(ev);
    out.event_ids.last_mut().expect("pushed").push(id);
  }
  Ok(out)
}
