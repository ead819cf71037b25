//! The ZMQ msgpack stream (docs/protocol.md#vllm-and-sglang-zmq-stream,
//! docs/protocol.md#tensorrt-llm-over-zmq): vLLM's current tagged maps (`vllm`), its legacy
//! tagged arrays (`legacy`), SGLang's maps (`sglang`) and TensorRT-LLM over ZMQ, which uses
//! vLLM's field names.
//!
//! Decoding (`decode`) accepts every generation of every dialect. Encoding writes what msgspec
//! writes for vLLM's (or SGLang's) current struct definitions, or the last legacy array
//! generation; `prepared` holds the bytes a chunk's column events share in vLLM's format.

mod columns;
mod decode;
pub mod legacy;
mod prepared;
pub mod sglang;
#[cfg(test)]
mod tests;
pub mod vllm;

pub use columns::{decode_batch_chunk, ChunkBatch};
pub(crate) use decode::decode_event;
pub use decode::{decode_batch, DecodedBatch};

use crate::codec::msgpack::Writer;
use crate::event::{EventRef, EventRefs, StoredFields};

/// Writes a batch payload `[ts, [events...], dp_rank]`, each published event by `event`
/// (`updated`/`created` have no form in these structs and are left out).
fn frame<'a>(
  ts: f64,
  events: impl EventRefs<'a>,
  dp_rank: Option<i32>,
  w: &mut Writer,
  mut event: impl FnMut(&EventRef<'_>, &mut Writer),
) {
  w.array_len(3);
  w.f64(ts);
  w.array_len(events.clone().filter(|e| e.is_published()).count());
  for e in events {
    event(&e, w);
  }
  match dp_rank {
    Some(r) => w.int(r as i64),
    None => w.nil(),
  }
}

/// Block hashes as vLLM writes them: uint64s, or their byte-string originals.
fn hashes_unsigned(ids: &[u64], bytes: Option<&Vec<Vec<u8>>>, w: &mut Writer) {
  w.array_len(ids.len());
  match bytes {
    Some(b) if b.len() == ids.len() => b.iter().for_each(|h| w.bin(h)),
    _ => ids.iter().for_each(|&h| w.uint(h)),
  }
}

/// The parent hash as vLLM writes it: a uint64, its byte-string original, or nil.
fn parent_unsigned<'a>(s: impl StoredFields<'a>, w: &mut Writer) {
  match (
    s.parent_block_hash(),
    s.hash_bytes().and_then(|h| h.parent.as_ref()),
  ) {
    (Some(_), Some(b)) => w.bin(b),
    (Some(p), None) => w.uint(p),
    (None, _) => w.nil(),
  }
}

/// The byte-string originals of a stored event's block hashes, if any.
fn block_hash_bytes<'a>(s: impl StoredFields<'a>) -> Option<&'a Vec<Vec<u8>>> {
  s.hash_bytes().map(|h| &h.blocks).filter(|b| !b.is_empty())
}

fn opt_i64(v: Option<i64>, w: &mut Writer) {
  match v {
    Some(v) => w.int(v),
    None => w.nil(),
  }
}
