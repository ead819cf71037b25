//! Encodes the publish queue's events (`EventRef`s) as one ZMQ msgpack batch, byte-identical to
//! encoding the same events as a `Batch`. In vLLM's current format, column events are written
//! straight from their slices: the bytes every event of a chunk shares (keys, tags, block size,
//! medium, LoRA) are prepared once per chunk and copied.

use super::msgpack::Writer;
use super::vllm::{encode_event, ZmqFormat, VLLM_REMOVED_DECLARED, VLLM_STORED_DECLARED};
use crate::chunk::{Attrs, EventRef};
use crate::event::KvEvent;

/// The constant parts of a chunk's stored and removed events, in vLLM's current format.
struct Shared {
  stored_head: Vec<u8>,
  parent_key: Vec<u8>,
  tokens_key: Vec<u8>,
  stored_tail: Vec<u8>,
  removed_head: Vec<u8>,
  removed_tail: Vec<u8>,
}

fn bytes(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
  let mut w = Writer::new();
  f(&mut w);
  w.into_inner()
}

impl Shared {
  fn new(a: &Attrs) -> Shared {
    Shared {
      stored_head: bytes(|w| {
        w.struct_map_len(8, VLLM_STORED_DECLARED);
        w.str("type");
        w.str("BlockStored");
        w.str("block_hashes");
      }),
      parent_key: bytes(|w| w.str("parent_block_hash")),
      tokens_key: bytes(|w| w.str("token_ids")),
      stored_tail: bytes(|w| {
        w.str("block_size");
        w.uint(a.block_size as u64);
        w.str("lora_id");
        match a.lora_id {
          Some(v) => w.int(v),
          None => w.nil(),
        }
        w.str("medium");
        w.opt_str(a.medium.as_deref());
        w.str("lora_name");
        w.opt_str(a.lora_name.as_deref());
      }),
      removed_head: bytes(|w| {
        w.struct_map_len(3, VLLM_REMOVED_DECLARED);
        w.str("type");
        w.str("BlockRemoved");
        w.str("block_hashes");
      }),
      removed_tail: bytes(|w| {
        w.str("medium");
        w.opt_str(a.medium.as_deref());
      }),
    }
  }
}

fn is_encoded(e: &EventRef<'_>) -> bool {
  !matches!(
    e,
    EventRef::Event(KvEvent::Updated(_) | KvEvent::Created(_))
  )
}

/// Bytes to reserve for encoding `events`.
pub fn size_hint(events: &[EventRef<'_>]) -> usize {
  events
    .iter()
    .map(|e| match e {
      EventRef::Stored { hashes, tokens, .. } => 160 + hashes.len() * 9 + tokens.len() * 5,
      EventRef::Removed { hashes, .. } => 48 + hashes.len() * 9,
      EventRef::Event(_) => 256,
      EventRef::Cleared => 24,
    })
    .sum::<usize>()
    + 32
}

fn u64s(v: &[u64], w: &mut Writer) {
  w.array_len(v.len());
  v.iter().for_each(|&h| w.uint(h));
}

/// `[ts, [events...], dp_rank]` as `vllm::encode_batch` writes it for the same events.
pub fn encode_events(
  ts: f64,
  events: &[EventRef<'_>],
  dp_rank: Option<i32>,
  format: ZmqFormat,
  w: &mut Writer,
) {
  w.array_len(3);
  w.f64(ts);
  w.array_len(events.iter().filter(|e| is_encoded(e)).count());
  let mut shared: Option<(*const Attrs, Shared)> = None;
  for e in events {
    match (format, *e) {
      (
        ZmqFormat::VllmMap,
        EventRef::Stored {
          hashes,
          parent,
          tokens,
          attrs,
        },
      ) => {
        let s = shared_for(&mut shared, attrs);
        w.buf.extend_from_slice(&s.stored_head);
        u64s(hashes, w);
        w.buf.extend_from_slice(&s.parent_key);
        match parent {
          Some(p) => w.uint(p),
          None => w.nil(),
        }
        w.buf.extend_from_slice(&s.tokens_key);
        w.u32_array(tokens);
        w.buf.extend_from_slice(&s.stored_tail);
      }
      (ZmqFormat::VllmMap, EventRef::Removed { hashes, attrs }) => {
        let s = shared_for(&mut shared, attrs);
        w.buf.extend_from_slice(&s.removed_head);
        u64s(hashes, w);
        w.buf.extend_from_slice(&s.removed_tail);
      }
      (_, EventRef::Event(ev)) => encode_event(ev, format, w),
      (_, EventRef::Cleared) => encode_event(&KvEvent::Cleared, format, w),
      (_, other) => encode_event(&other.to_event(), format, w),
    }
  }
  match dp_rank {
    Some(r) => w.int(r as i64),
    None => w.nil(),
  }
}

/// The shared parts for `attrs`, prepared again only when the chunk changes.
fn shared_for<'s>(cache: &'s mut Option<(*const Attrs, Shared)>, attrs: &Attrs) -> &'s Shared {
  let key = attrs as *const Attrs;
  if cache.as_ref().is_none_or(|(k, _)| *k != key) {
    *cache = Some((key, Shared::new(attrs)));
  }
  &cache.as_ref().expect("just set").1
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::chunk::EventChunk;
  use crate::codec::{self, Format};
  use crate::columns::Columns;
  use crate::event::{Batch, RemovedEvent, StoredEvent};

  fn chunk(medium: Option<&str>, lora: Option<(i64, &str)>) -> EventChunk {
    EventChunk::from_columns(&Columns {
      kinds: &[0, 1, 2, 0, 0],
      hash_counts: &[2, 1, 0, 1, 0],
      hashes: &[u64::MAX, 200, 7, 1 << 40],
      parents: &[0, 0, 0, 5, 0],
      has_parent: &[0, 0, 0, 1, 0],
      tokens: &[1, 300, 70_000, 4, u32::MAX, 0],
      block_size: 2,
      medium,
      lora_id: lora.map(|l| l.0),
      lora_name: lora.map(|l| l.1),
    })
    .unwrap()
  }

  fn objects() -> EventChunk {
    EventChunk::from_events(vec![
      KvEvent::Stored(StoredEvent {
        block_hashes: vec![9],
        token_ids: vec![1, 2],
        block_size: 2,
        group_idx: Some(3),
        session_id: Some("s".into()),
        ..Default::default()
      }),
      KvEvent::Removed(RemovedEvent {
        block_hashes: vec![9],
        locality: Some("LOCAL".into()),
        ..Default::default()
      }),
    ])
  }

  #[test]
  fn writes_what_the_batch_encoder_writes_in_every_format() {
    let chunks = [
      chunk(Some("GPU"), None),
      chunk(None, Some((-3, "adapter"))),
      objects(),
      chunk(
        Some("CPU_TIER_WITH_A_LONG_NAME_OVER_31_BYTES"),
        Some((7, "x")),
      ),
    ];
    let refs: Vec<EventRef<'_>> = chunks.iter().flat_map(|c| c.iter()).collect();
    for (format, zf) in [
      (Format::Vllm, ZmqFormat::VllmMap),
      (Format::VllmLegacy, ZmqFormat::VllmArray),
      (Format::Sglang, ZmqFormat::SglangMap),
    ] {
      for dp_rank in [None, Some(3)] {
        let batch = Batch {
          seq: 0,
          ts: 1.5,
          dp_rank,
          events: refs.iter().map(|e| e.to_event()).collect(),
        };
        let mut w = Writer::new();
        encode_events(1.5, &refs, dp_rank, zf, &mut w);
        assert_eq!(w.into_inner(), codec::encode(&batch, format), "{format:?}");
      }
    }
  }
}
