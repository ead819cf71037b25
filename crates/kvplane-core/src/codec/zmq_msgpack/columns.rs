//! Decoding a batch payload into a chunk of columns: the relay's path. A plain event (integer
//! hashes, plain token ids, a block size its tokens fill, and the chunk's medium and LoRA, with
//! no other field set) goes into the chunk's columns without an allocation of its own; any other
//! event is decoded whole, as `decode_batch` decodes it, and kept whole in the chunk. (The cache
//! group is one of the chunk's attributes, and so are `extra_keys` of one nil per block: vLLM
//! sets both on every stored event.) A payload
//! that is not a well-formed batch gives `None`: the caller decodes it with `decode_batch`, for
//! the same result or error.

use super::decode::{decode_event, read_opt_i64, read_opt_u32, read_u32, tag_of, Tag};
use crate::chunk::{ChunkBuilder, EventChunk};
use crate::codec::msgpack::{Kind, Reader};
use crate::error::KvResult;

/// A batch payload decoded into a chunk (`seq` travels in its own frame).
#[derive(Debug)]
pub struct ChunkBatch {
  pub ts: f64,
  pub dp_rank: Option<i32>,
  pub chunk: EventChunk,
}

/// The payload's batch as a chunk, or `None` where it does not decode (see the module doc).
pub fn decode_batch_chunk(bytes: &[u8]) -> Option<ChunkBatch> {
  let mut r = Reader::new(bytes);
  let slots = r.read_array_len().ok()?;
  if slots < 2 {
    return None;
  }
  let ts = r.read_f64().ok()?;
  let n = r.read_array_len().ok()?;
  let mut b = ChunkBuilder::with_capacity(n);
  for _ in 0..n {
    let at = r.clone();
    if !plain_event(&mut r, &mut b).ok()? {
      r = at;
      // Unknown tags are skipped, as `decode_batch` skips them.
      if let Some(e) = decode_event(&mut r).ok()? {
        b.push_event(e);
      }
    }
  }
  let dp_rank = if slots >= 3 && !r.try_nil() {
    Some(
      r.read_int()
        .ok()?
        .as_i64()
        .and_then(|v| i32::try_from(v).ok())?,
    )
  } else {
    None
  };
  for _ in 3..slots {
    r.skip().ok()?;
  }
  if !r.is_at_end() {
    return None;
  }
  Some(ChunkBatch {
    ts,
    dp_rank,
    chunk: b.finish(),
  })
}

/// Fields a plain event leaves unset (nil or absent); one set means the event is read whole.
const WHOLE_ONLY: [&[u8]; 7] = [
  b"kv_cache_spec_kind",
  b"kv_cache_spec_sliding_window",
  b"locality",
  b"ownership",
  b"session_id",
  b"cache_salt",
  b"lookahead_token_ids",
];

/// Reads one event into the columns: `Ok(false)` (columns as they were) when it is not a plain
/// stored, removed or cleared event, for the caller to read it whole from where it starts.
fn plain_event(r: &mut Reader<'_>, b: &mut ChunkBuilder) -> KvResult<bool> {
  if r.peek_kind()? != Kind::Map {
    return Ok(false);
  }
  let n = r.read_map_len()?;
  let mark = b.mark();
  let not_plain = |b: &mut ChunkBuilder| {
    b.rollback(mark);
    Ok(false)
  };
  let mut tag = None;
  // Keys read so far (a repeated one is read whole: there the last one counts).
  let mut seen = 0u16;
  let mut parent = None;
  let mut tokens = 0usize;
  let mut block_size = 0u32;
  let mut lora_id = None;
  let mut medium = None;
  let mut lora_name = None;
  let mut group_idx = None;
  // `extra_keys` of nils only: how many.
  let mut nil_extra_keys = None;
  for _ in 0..n {
    let key = r.read_str_bytes()?;
    let bit = match key {
      b"type" => 1,
      b"block_hashes" => 2,
      b"parent_block_hash" => 4,
      b"token_ids" => 8,
      b"block_size" => 16,
      b"lora_id" => 32,
      b"medium" => 64,
      b"lora_name" => 128,
      b"group_idx" => 256,
      b"extra_keys" => 512,
      _ => 0,
    };
    if seen & bit != 0 {
      return not_plain(b);
    }
    seen |= bit;
    match key {
      b"type" => tag = Some(tag_of(r.read_str_bytes()?)),
      b"block_hashes" => {
        let count = r.read_array_len()?;
        for _ in 0..count {
          if r.peek_kind()? == Kind::Bin {
            return not_plain(b);
          }
          let h = r.read_int()?.bits();
          b.hashes().push(h);
        }
      }
      b"parent_block_hash" => {
        if !r.try_nil() {
          if r.peek_kind()? == Kind::Bin {
            return not_plain(b);
          }
          parent = Some(r.read_int()?.bits());
        }
      }
      b"token_ids" => {
        let count = r.read_array_len()?;
        let out = b.tokens();
        let end = out.len() + count;
        r.read_u32_run(end, out);
        // Anything but plain u32s (SGLang's EAGLE pairs, say) is read whole.
        if out.len() != end {
          return not_plain(b);
        }
        tokens = count;
      }
      b"block_size" => block_size = read_u32(r, "block_size")?,
      b"lora_id" => lora_id = read_opt_i64(r, "lora_id")?,
      b"medium" => medium = r.read_opt_str()?,
      b"lora_name" => lora_name = r.read_opt_str()?,
      b"group_idx" => group_idx = read_opt_u32(r, "group_idx")?,
      b"extra_keys" => {
        if !r.try_nil() {
          if r.peek_kind()? != Kind::Array {
            return not_plain(b);
          }
          let k = r.read_array_len()?;
          for _ in 0..k {
            if !r.try_nil() {
              return not_plain(b);
            }
          }
          nil_extra_keys = Some(k);
        }
      }
      k if WHOLE_ONLY.contains(&k) => {
        if !r.try_nil() {
          return not_plain(b);
        }
      }
      _ => r.skip()?,
    }
  }
  let count = b.mark().0 - mark.0;
  match tag {
    Some(Tag::Stored)
      if count > 0
        && block_size > 0
        && tokens == count * block_size as usize
        && nil_extra_keys.is_none_or(|k| k == count)
        && b.fits_stored(
          (block_size, nil_extra_keys.is_some()),
          (medium, group_idx),
          lora_id,
          lora_name,
        ) =>
    {
      b.push_stored(count as u32, parent);
      Ok(true)
    }
    Some(Tag::Removed)
      if count > 0 && nil_extra_keys.is_none() && b.fits_removed((medium, group_idx)) =>
    {
      // A removed event's other fields are not part of it.
      b.rollback((b.mark().0, mark.1));
      b.push_removed(count as u32);
      Ok(true)
    }
    Some(Tag::Cleared) => {
      b.rollback(mark);
      b.push_cleared();
      Ok(true)
    }
    // Unknown tags, no tag (an error there), and events that do not fit: read whole.
    _ => not_plain(b),
  }
}
