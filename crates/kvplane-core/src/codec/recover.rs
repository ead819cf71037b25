//! `/kv_recover` answers (docs/protocol.md#http-kv_recover) as JSON or msgpack, externally tagged:
//!
//! ```text
//! {"Events":       {"batches": [{"seq", "ts", "dp_rank", "events": [...]}], "next_start"?, "last_seq", "epoch"}}
//! {"TreeDump":     {"workers": [{"worker_id", "dp_rank", "events": [...]}], "last_seq", "epoch"}}
//! {"TooNew":       {"last_seq", "epoch"}}
//! {"InvalidRange": {"reason", "last_seq", "epoch"}}
//! ```
//!
//! Events use vLLM's field names (`type` = `BlockStored` | `BlockRemoved` | `AllBlocksCleared`);
//! in msgpack they are exactly vLLM's map encoding. Every u64 is an exact integer.
//! TRT-LLM-only events (`updated`, `created`) are not part of the published stream and are left
//! out here too.

use super::json::{write_f64, write_opt_str, write_str};
use super::msgpack::Writer;
use super::zmq_msgpack::vllm::{encode_event, encode_stored};
use crate::event::{Batch, EventRef, KvEvent, RemovedEvent, StoredEvent};
use crate::index::WorkerDump;
use crate::stream::Recovery;

/// Appends a u64 in decimal (the dump writes tens of millions of them).
#[inline]
fn push_u64(out: &mut String, mut v: u64) {
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

fn push_i64(out: &mut String, v: i64) {
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

fn key(out: &mut String, k: &str) {
  out.push(',');
  out.push('"');
  out.push_str(k);
  out.push_str("\":");
}

fn opt_i64(out: &mut String, v: Option<i64>) {
  match v {
    Some(v) => push_i64(out, v),
    None => out.push_str("null"),
  }
}

fn stored_json(s: &StoredEvent, out: &mut String) {
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
fn published(events: &[KvEvent]) -> impl Iterator<Item = &KvEvent> {
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

fn batch_json(b: &Batch, out: &mut String) {
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

fn worker_json(w: &WorkerDump, out: &mut String) {
  out.push_str("{\"worker_id\":");
  push_u64(out, w.worker.worker_id);
  key(out, "dp_rank");
  push_u64(out, w.worker.dp_rank as u64);
  key(out, "events");
  out.push('[');
  for (i, e) in w.events.iter().enumerate() {
    if i > 0 {
      out.push(',');
    }
    stored_json(e, out);
  }
  out.push(']');
  out.push('}');
}

fn tail_json(last_seq: u64, epoch: u64, out: &mut String) {
  key(out, "last_seq");
  push_u64(out, last_seq);
  key(out, "epoch");
  push_u64(out, epoch);
  out.push_str("}}");
}

/// The answer as JSON text.
pub fn to_json(r: &Recovery) -> String {
  let mut out = String::new();
  match r {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
      next_start,
    } => {
      out.push_str("{\"Events\":{\"batches\":[");
      for (i, b) in batches.iter().enumerate() {
        if i > 0 {
          out.push(',');
        }
        batch_json(b, &mut out);
      }
      out.push(']');
      if let Some(n) = next_start {
        key(&mut out, "next_start");
        push_u64(&mut out, *n);
      }
      tail_json(*last_seq, *epoch, &mut out);
    }
    Recovery::TreeDump {
      workers,
      last_seq,
      epoch,
    } => {
      let blocks: usize = workers
        .iter()
        .flat_map(|w| &w.events)
        .map(|e| e.block_hashes.len() * 24 + e.token_ids.len() * 7)
        .sum();
      out.reserve(blocks + 64);
      out.push_str("{\"TreeDump\":{\"workers\":[");
      for (i, w) in workers.iter().enumerate() {
        if i > 0 {
          out.push(',');
        }
        worker_json(w, &mut out);
      }
      out.push(']');
      tail_json(*last_seq, *epoch, &mut out);
    }
    Recovery::TooNew { last_seq, epoch } => {
      out.push_str("{\"TooNew\":{\"last_seq\":");
      push_u64(&mut out, *last_seq);
      key(&mut out, "epoch");
      push_u64(&mut out, *epoch);
      out.push_str("}}");
    }
    Recovery::InvalidRange {
      reason,
      last_seq,
      epoch,
    } => {
      out.push_str("{\"InvalidRange\":{\"reason\":");
      write_str(&mut out, reason);
      tail_json(*last_seq, *epoch, &mut out);
    }
  }
  out
}

/// The answer as msgpack (same structure; events in vLLM's map encoding).
pub fn to_msgpack(r: &Recovery) -> Vec<u8> {
  let mut w = Writer::new();
  w.map_len(1);
  let (last_seq, epoch) = match r {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
      next_start,
    } => {
      w.str("Events");
      w.map_len(3 + usize::from(next_start.is_some()));
      if let Some(n) = next_start {
        w.str("next_start");
        w.uint(*n);
      }
      w.str("batches");
      w.array_len(batches.len());
      for b in batches {
        w.map_len(4);
        w.str("seq");
        w.uint(b.seq);
        w.str("ts");
        w.f64(b.ts);
        w.str("dp_rank");
        match b.dp_rank {
          Some(d) => w.int(d as i64),
          None => w.nil(),
        }
        w.str("events");
        w.array_len(published(&b.events).count());
        for e in published(&b.events) {
          encode_event(&EventRef::of(e), &mut w);
        }
      }
      (*last_seq, *epoch)
    }
    Recovery::TreeDump {
      workers,
      last_seq,
      epoch,
    } => {
      w.str("TreeDump");
      w.map_len(3);
      w.str("workers");
      w.array_len(workers.len());
      for wd in workers {
        w.map_len(3);
        w.str("worker_id");
        w.uint(wd.worker.worker_id);
        w.str("dp_rank");
        w.uint(wd.worker.dp_rank as u64);
        w.str("events");
        w.array_len(wd.events.len());
        for e in &wd.events {
          encode_stored(e, &mut w);
        }
      }
      (*last_seq, *epoch)
    }
    Recovery::TooNew { last_seq, epoch } => {
      w.str("TooNew");
      w.map_len(2);
      (*last_seq, *epoch)
    }
    Recovery::InvalidRange {
      reason,
      last_seq,
      epoch,
    } => {
      w.str("InvalidRange");
      w.map_len(3);
      w.str("reason");
      w.str(reason);
      (*last_seq, *epoch)
    }
  };
  w.str("last_seq");
  w.uint(last_seq);
  w.str("epoch");
  w.uint(epoch);
  w.into_inner()
}

/// Parses the raw `start` / `end` parameters of a `/kv_recover` query: decimal u64s, either
/// absent. `Err` holds the reason a malformed one is an `InvalidRange`.
pub fn parse_range(
  start: Option<&str>,
  end: Option<&str>,
) -> Result<(Option<u64>, Option<u64>), String> {
  let parse = |name: &str, v: Option<&str>| match v {
    None => Ok(None),
    Some(t) => match t.parse::<u64>() {
      Ok(n) if !t.starts_with('+') => Ok(Some(n)),
      _ => Err(format!(
        "{name} {t:?} is not a seq (an integer in 0..=2^64-1)"
      )),
    },
  };
  Ok((parse("start", start)?, parse("end", end)?))
}
