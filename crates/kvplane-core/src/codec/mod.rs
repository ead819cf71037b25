//! Wire codecs (SPEC §3): every engine dialect decodes into the normalized model of SPEC §2, and
//! batches encode once into the formats kvplane publishes.

pub mod json;
pub mod msgpack;
pub mod recover;
pub mod smg_proto;
pub mod trtllm;
pub mod value;
pub mod vllm;
pub mod zmq_chunk;

use crate::chunk::EventRef;
use crate::error::{KvError, KvResult};
use crate::event::{Batch, KvEvent};

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
      let d = vllm::decode_batch(bytes)?;
      Ok(Decoded {
        batches: vec![d.batch],
        event_ids: vec![Vec::new()],
        unknown_events: d.unknown_events,
      })
    }
    Dialect::TrtllmJson => {
      let d = trtllm::decode_json(bytes)?;
      Ok(Decoded {
        batches: d.batches,
        event_ids: d.event_ids,
        unknown_events: d.unknown_events,
      })
    }
    Dialect::SmgProto => {
      let d = smg_proto::decode_batch(bytes)?;
      Ok(Decoded {
        batches: vec![d.batch],
        event_ids: vec![d.event_ids],
        unknown_events: d.unknown_events,
      })
    }
  }
}

/// The layout check of SPEC §3.1 over decoded batches: the first stored event whose tokens do not
/// split into `block_size` x hashes is `ERR_UNSUPPORTED_LAYOUT`, naming the batch's rank and the
/// event.
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

/// Encodes a batch once (SPEC §6: the same bytes go to every subscriber).
pub fn encode(b: &Batch, format: Format) -> Vec<u8> {
  match format {
    Format::Vllm | Format::VllmLegacy | Format::Sglang => {
      let zf = match format {
        Format::Vllm => vllm::ZmqFormat::VllmMap,
        Format::VllmLegacy => vllm::ZmqFormat::VllmArray,
        _ => vllm::ZmqFormat::SglangMap,
      };
      let mut w = msgpack::Writer::with_capacity(encoded_size_hint(b));
      vllm::encode_batch(b, zf, &mut w);
      w.into_inner()
    }
    Format::SmgProto => {
      let mut out = Vec::with_capacity(encoded_size_hint(b));
      smg_proto::encode_batch(b, &mut out);
      out
    }
  }
}

/// Encodes the publish queue's events as one batch (seq 0): the same bytes as `encode` of those
/// events as a `Batch`. The ZMQ formats write column events straight from their slices.
pub fn encode_zmq_events(
  ts: f64,
  events: &[EventRef<'_>],
  dp_rank: Option<i32>,
  format: Format,
) -> Vec<u8> {
  let zf = match format {
    Format::Vllm => vllm::ZmqFormat::VllmMap,
    Format::VllmLegacy => vllm::ZmqFormat::VllmArray,
    Format::Sglang => vllm::ZmqFormat::SglangMap,
    Format::SmgProto => return encode_proto_events(0, ts, events, dp_rank),
  };
  let mut w = msgpack::Writer::with_capacity(zmq_chunk::size_hint(events));
  zmq_chunk::encode_events(ts, events, dp_rank, zf, &mut w);
  w.into_inner()
}

/// Encodes the publish queue's events as SMG protobuf batch `seq`: the same bytes as `encode` of
/// those events as a `Batch` with that seq, written from the column slices.
pub fn encode_proto_events(
  seq: u64,
  ts: f64,
  events: &[EventRef<'_>],
  dp_rank: Option<i32>,
) -> Vec<u8> {
  let mut out = Vec::with_capacity(zmq_chunk::size_hint(events));
  smg_proto::encode_event_refs(seq, ts, dp_rank, events, &mut out);
  out
}

fn encoded_size_hint(b: &Batch) -> usize {
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
