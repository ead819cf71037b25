//! Wire codecs (docs/protocol.md#formats-at-a-glance): every engine dialect decodes into the
//! normalized model of docs/protocol.md#events, and
//! batches encode once into the formats kvplane publishes.

pub mod dynamo_dump;
pub mod dynamo_query;
pub mod json;
pub mod msgpack;
pub mod protobuf;
pub mod recover;
pub mod smg;
pub mod trtllm_json;
pub mod value;
pub mod zmq_msgpack;

use crate::chunk::EventChunk;
use crate::error::{KvError, KvResult};
use crate::event::{Batch, EventRef, EventRefs, KvEvent};

/// What bytes to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
  /// vLLM's ZMQ msgpack payload, any generation.
  Vllm,
  /// SGLang's ZMQ msgpack payload (signed hashes, EAGLE pairs, salted legacy slot).
  Sglang,
  /// TensorRT-LLM events over ZMQ (msgpack, vLLM's field names).
  Trtllm,
  /// TensorRT-LLM's JSON event list.
  TrtllmJson,
  /// SMG's protobuf `KvEventBatch`.
  SmgProto,
}

impl Dialect {
  pub fn parse(name: &str) -> KvResult<Dialect> {
    Ok(match name {
      "vllm" => Dialect::Vllm,
      "sglang" => Dialect::Sglang,
      "trtllm" => Dialect::Trtllm,
      "trtllm_json" => Dialect::TrtllmJson,
      "smg_proto" => Dialect::SmgProto,
      other => {
        return Err(KvError::invalid_arg(format!(
          "unknown dialect {other:?}; expected vllm, sglang, trtllm, trtllm_json or smg_proto"
        )))
      }
    })
  }
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
  /// vLLM's current msgpack (tagged maps), byte-identical to msgspec.
  Vllm,
  /// vLLM's legacy msgpack (tagged arrays).
  VllmLegacy,
  /// SGLang's current msgpack (tagged maps, signed hashes).
  Sglang,
  /// SMG's protobuf `KvEventBatch`.
  SmgProto,
}

impl Format {
  /// The format's name, as `parse` takes it.
  pub fn name(self) -> &'static str {
    match self {
      Format::Vllm => "vllm",
      Format::VllmLegacy => "vllm_legacy",
      Format::Sglang => "sglang",
      Format::SmgProto => "smg_proto",
    }
  }

  pub fn parse(name: &str) -> KvResult<Format> {
    Ok(match name {
      "vllm" => Format::Vllm,
      "vllm_legacy" => Format::VllmLegacy,
      "sglang" => Format::Sglang,
      "smg_proto" => Format::SmgProto,
      other => {
        return Err(KvError::invalid_arg(format!(
          "unknown format {other:?}; expected vllm, vllm_legacy, sglang or smg_proto"
        )))
      }
    })
  }
}

/// Decoded batches (one for every dialect but TensorRT-LLM JSON, whose list may span ranks).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
  pub batches: Vec<Batch>,
  /// The source's event ids per batch (TensorRT-LLM JSON, SMG proto); empty lists otherwise.
  pub event_ids: Vec<Vec<u64>>,
  /// Events of a kind this version does not know: skipped and counted, never guessed.
  pub unknown_events: u32,
}

/// Decodes bytes of a dialect. Never panics on arbitrary input: bad bytes are `ERR_DECODE`.
pub fn decode(bytes: &[u8], dialect: Dialect) -> KvResult<Decoded> {
  match dialect {
    Dialect::Vllm | Dialect::Sglang | Dialect::Trtllm => {
      let d = zmq_msgpack::decode_batch(bytes)?;
      Ok(Decoded {
        batches: vec![d.batch],
        event_ids: vec![Vec::new()],
        unknown_events: d.unknown_events,
      })
    }
    Dialect::TrtllmJson => {
      let d = trtllm_json::decode_json(bytes)?;
      Ok(Decoded {
        batches: d.batches,
        event_ids: d.event_ids,
        unknown_events: d.unknown_events,
      })
    }
    Dialect::SmgProto => {
      let d = smg::decode_batch(bytes)?;
      Ok(Decoded {
        batches: vec![d.batch],
        event_ids: vec![d.event_ids],
        unknown_events: d.unknown_events,
      })
    }
  }
}

/// Decodes payloads that arrived together, all or none: the first that does not decode is the
/// error, naming its position when there are several.
pub fn decode_all(payloads: &[&[u8]], dialect: Dialect) -> KvResult<Vec<Decoded>> {
  payloads
    .iter()
    .enumerate()
    .map(|(i, bytes)| decode_nth(payloads.len(), i, bytes, dialect))
    .collect()
}

/// `decode` of payload `i` of `n` that arrived together: its error names its position when
/// there are several.
fn decode_nth(n: usize, i: usize, bytes: &[u8], dialect: Dialect) -> KvResult<Decoded> {
  decode(bytes, dialect).map_err(|mut e| {
    if n > 1 {
      e.message = format!("payload {i}: {}", e.message);
    }
    e
  })
}

/// `decode_all`, each batch as a chunk: msgpack payloads in columns where their events allow
/// (`zmq_msgpack::decode_batch_chunk`), every other event whole. The events are the same.
pub fn decode_all_chunks(
  payloads: &[&[u8]],
  dialect: Dialect,
) -> KvResult<Vec<zmq_msgpack::ChunkBatch>> {
  let mut out = Vec::with_capacity(payloads.len());
  for (i, bytes) in payloads.iter().enumerate() {
    if matches!(dialect, Dialect::Vllm | Dialect::Sglang | Dialect::Trtllm) {
      if let Some(c) = zmq_msgpack::decode_batch_chunk(bytes) {
        out.push(c);
        continue;
      }
    }
    let d = decode_nth(payloads.len(), i, bytes, dialect)?;
    out.extend(d.batches.into_iter().map(|b| zmq_msgpack::ChunkBatch {
      ts: b.ts,
      dp_rank: b.dp_rank,
      chunk: EventChunk::from_events(b.events),
    }));
  }
  Ok(out)
}

/// The layout check (docs/protocol.md#fail-closed-layouts) over decoded batches: the first stored
/// event whose tokens do not split into `block_size` x hashes is `ERR_UNSUPPORTED_LAYOUT`, naming
/// the batch's rank and the event.
pub fn check_layout(batches: &[Batch]) -> KvResult<()> {
  for b in batches {
    for (i, e) in b.events.iter().enumerate() {
      if let KvEvent::Stored(s) = e {
        s.check_layout(false).map_err(|mut err| {
          let rank = b.dp_rank.map_or("none".to_owned(), |r| r.to_string());
          err.message = format!("{} (dp_rank {rank}, event {i})", err.message);
          err
        })?;
      }
    }
  }
  Ok(())
}

/// Encodes a batch once (docs/protocol.md#seqs-and-epochs: the same bytes go to every
/// subscriber): `encode_events` of its events, each viewed as it is written.
pub fn encode(b: &Batch, format: Format) -> Vec<u8> {
  let events = b.events.iter().map(EventRef::of);
  encode_with(b.seq, b.ts, events, b.dp_rank, format, batch_size_hint(b))
}

/// Encodes events as batch `seq` in `format`: the one encoder of every format. The ZMQ formats
/// carry no seq (it travels in its own frame); SMG's `KvEventBatch` does. TRT-LLM-only events
/// (`updated`, `created`) have no form in any of them and are left out.
pub fn encode_events(
  seq: u64,
  ts: f64,
  events: &[EventRef<'_>],
  dp_rank: Option<i32>,
  format: Format,
) -> Vec<u8> {
  let hint = size_hint(events);
  encode_with(seq, ts, events.iter().copied(), dp_rank, format, hint)
}

/// `encode_events` into a buffer of `capacity` bytes.
fn encode_with<'a>(
  seq: u64,
  ts: f64,
  events: impl EventRefs<'a>,
  dp_rank: Option<i32>,
  format: Format,
  capacity: usize,
) -> Vec<u8> {
  match format {
    Format::Vllm => msgpack_with(capacity, |w| {
      zmq_msgpack::vllm::encode_batch(ts, events, dp_rank, w)
    }),
    Format::VllmLegacy => msgpack_with(capacity, |w| {
      zmq_msgpack::legacy::encode_batch(ts, events, dp_rank, w)
    }),
    Format::Sglang => msgpack_with(capacity, |w| {
      zmq_msgpack::sglang::encode_batch(ts, events, dp_rank, w)
    }),
    Format::SmgProto => {
      let mut out = Vec::with_capacity(capacity);
      smg::encode_batch(seq, ts, dp_rank, events, &mut out);
      out
    }
  }
}

fn msgpack_with(capacity: usize, f: impl FnOnce(&mut msgpack::Writer)) -> Vec<u8> {
  let mut w = msgpack::Writer::with_capacity(capacity);
  f(&mut w);
  w.into_inner()
}

/// Bytes to reserve for encoding a whole batch.
fn batch_size_hint(b: &Batch) -> usize {
  b.events
    .iter()
    .map(|e| match e {
      KvEvent::Stored(s) => 160 + s.block_hashes.len() * 12 + s.token_ids.len() * 3,
      KvEvent::Removed(r) => 48 + r.block_hashes.len() * 10,
      _ => 24,
    })
    .sum::<usize>()
    + 32
}

/// Bytes to reserve for encoding `events`.
fn size_hint(events: &[EventRef<'_>]) -> usize {
  events
    .iter()
    .map(|e| match e {
      EventRef::Stored(s) => 160 + s.block_hashes.len() * 9 + s.token_ids.len() * 5,
      EventRef::Removed(r) => 48 + r.block_hashes.len() * 9,
      EventRef::Cleared => 24,
      _ => 0,
    })
    .sum::<usize>()
    + 32
}
