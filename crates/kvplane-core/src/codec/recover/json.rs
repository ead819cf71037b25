//! JSON pieces of `/kv_recover` answers: events under vLLM's field names, batches, exact u64s.

use crate::codec::json::{write_f64, write_opt_str, write_str};
use crate::event::{Batch, KvEvent, RemovedEvent, StoredEvent};

/// Appends a u64 in decimal (the dump writes tens of millions of them).
#[inline]
pub(super) fn push_u64(out: &mut String, mut v: u64) {
  let mut buf = [0u8; 20];
  let mut i = buf.len();
  loop {
    i -= 1;
    buf[i] = b'0' + (v % 10) as u8;
    v /= 10;
    if v == 0 {
      break;
    }
  }
  // SAFETY: only ASCII digits were written.
  out.push_str(unsafe { std::str::from_utf8_unchecked(&buf[i..]) });
}

pub(super) fn push_i64(out: &mut String, v: i64) {
  if v < 0 {
    out.push('-');
  }
  push_u64(out, v.unsigned_abs());
}

fn push_u64s(out: &mut String, vs: impl Iterator<Item = u64>) {
  out.push('[');
  for (i, v) in vs.enumerate() {
    if i > 0 {
      out.push(',');
    }
    push_u64(out, v);
  }
  out.push(']');
}

pub(super) fn key(out: &mut String, k: &str) {
  out.push(',');
  out.push('"');
  out.push_str(k);
  out.push_str("\":");
}

pub(super) fn opt_i64(out: &mut String, v: Option<i64>) {
  match v {
    Some(v) => push_i64(out, v),
    None => out.push_str("null"),
  }
}

pub(super) fn stored_json(s: &StoredEvent, out: &mut String) {
  out.push_str("{\"type\":\"BlockStored\"");
  key(out, "block_hashes");
  push_u64s(out, s.block_hashes.iter().copied());
  key(out, "parent_block_hash");
  match s.parent_block_hash {
    Some(p) => push_u64(out, p),
    None => out.push_str("null"),
  }
  key(out, "token_ids");
  push_u64s(out, s.token_ids.iter().map(|&t| t as u64));
  key(out, "block_size");
  push_u64(out, s.block_size as u64);
  key(out, "lora_id");
  opt_i64(out, s.lora_id);
  key(out, "medium");
  write_opt_str(out, s.medium.as_deref());
  key(out, "lora_name");
  write_opt_str(out, s.lora_name.as_deref());
  if let Some(v) = &s.extra_keys {
    key(out, "extra_keys");
    v.write_json(out);
  }
  if let Some(v) = s.group_idx {
    key(out, "group_idx");
    push_u64(out, v as u64);
  }
  for (k, v) in [
    ("kv_cache_spec_kind", &s.kv_cache_spec_kind),
    ("locality", &s.locality),
    ("ownership", &s.ownership),
    ("session_id", &s.session_id),
    ("cache_salt", &s.cache_salt),
  ] {
    if let Some(v) = v {
      key(out, k);
      write_str(out, v);
    }
  }
  if let Some(v) = s.kv_cache_spec_sliding_window {
    key(out, "kv_cache_spec_sliding_window");
    push_i64(out, v);
  }
  if let Some(v) = &s.lookahead_token_ids {
    key(out, "lookahead_token_ids");
    v.write_json(out);
  }
  out.push('}');
}

fn removed_json(r: &RemovedEvent, out: &mut String) {
  out.push_str("{\"type\":\"BlockRemoved\"");
  key(out, "block_hashes");
  push_u64s(out, r.block_hashes.iter().copied());
  key(out, "medium");
  write_opt_str(out, r.medium.as_deref());
  if let Some(v) = r.group_idx {
    key(out, "group_idx");
    push_u64(out, v as u64);
  }
  for (k, v) in [("locality", &r.locality), ("ownership", &r.ownership)] {
    if let Some(v) = v {
      key(out, k);
      write_str(out, v);
    }
  }
  out.push('}');
}

/// Events with a published form (everything but TRT-LLM's `updated` / `created`).
pub(super) fn published(events: &[KvEvent]) -> impl Iterator<Item = &KvEvent> {
  events
    .iter()
    .filter(|e| !matches!(e, KvEvent::Updated(_) | KvEvent::Created(_)))
}

fn events_json<'a>(events: impl Iterator<Item = &'a KvEvent>, out: &mut String) {
  out.push('[');
  for (i, e) in events.enumerate() {
    if i > 0 {
      out.push(',');
    }
    match e {
      KvEvent::Stored(s) => stored_json(s, out),
      KvEvent::Removed(r) => removed_json(r, out),
      KvEvent::Cleared => out.push_str("{\"type\":\"AllBlocksCleared\"}"),
      KvEvent::Updated(_) | KvEvent::Created(_) => unreachable!("filtered out"),
    }
  }
  out.push(']');
}

pub(super) fn batch_json(b: &Batch, out: &mut String) {
  out.push_str("{\"seq\":");
  push_u64(out, b.seq);
  key(out, "ts");
  write_f64(out, b.ts);
  key(out, "dp_rank");
  opt_i64(out, b.dp_rank.map(i64::from));
  key(out, "events");
  events_json(published(&b.events), out);
  out.push('}');
}
