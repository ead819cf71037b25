//! Column events in vLLM's current format, written straight from their slices: the bytes every
//! event of a chunk shares (keys, tags, block size, medium, LoRA, cache group) are prepared once per chunk
//! and copied. The bytes are those `vllm::encode_stored` / `encode_removed` write for the same
//! events.

use super::vllm::{VLLM_REMOVED_DECLARED, VLLM_STORED_DECLARED};
use crate::chunk::Attrs;
use crate::codec::msgpack::Writer;
use crate::event::{RemovedView, StoredView};

/// The constant parts of a chunk's stored and removed events.
pub(super) struct Shared {
  stored_head: Vec<u8>,
  parent_key: Vec<u8>,
  tokens_key: Vec<u8>,
  stored_tail: Vec<u8>,
  /// The chunk's stored events carry one nil extra key per block.
  nil_extra_keys: bool,
  stored_group: Vec<u8>,
  removed_head: Vec<u8>,
  removed_tail: Vec<u8>,
}

fn bytes(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
  let mut w = Writer::new();
  f(&mut w);
  w.into_inner()
}

/// `group_idx`, where the chunk's events have one (after the fields above, as the struct orders it).
fn group(a: &Attrs, w: &mut Writer) {
  if let Some(g) = a.group_idx {
    w.str("group_idx");
    w.uint(g as u64);
  }
}

fn u64s(v: &[u64], w: &mut Writer) {
  w.array_len(v.len());
  v.iter().for_each(|&h| w.uint(h));
}

impl Shared {
  fn new(a: &Attrs) -> Shared {
    Shared {
      stored_head: bytes(|w| {
        let optional = a.group_idx.is_some() as usize + !a.nil_extra_keys.is_empty() as usize;
        w.struct_map_len(8 + optional, VLLM_STORED_DECLARED);
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
      nil_extra_keys: !a.nil_extra_keys.is_empty(),
      stored_group: bytes(|w| group(a, w)),
      removed_head: bytes(|w| {
        w.struct_map_len(3 + a.group_idx.is_some() as usize, VLLM_REMOVED_DECLARED);
        w.str("type");
        w.str("BlockRemoved");
        w.str("block_hashes");
      }),
      removed_tail: bytes(|w| {
        w.str("medium");
        w.opt_str(a.medium.as_deref());
        group(a, w);
      }),
    }
  }

  /// A column stored event of the chunk these bytes were prepared for.
  pub(super) fn stored(&self, s: &StoredView<'_>, w: &mut Writer) {
    w.buf.extend_from_slice(&self.stored_head);
    u64s(s.block_hashes, w);
    w.buf.extend_from_slice(&self.parent_key);
    match s.parent_block_hash {
      Some(p) => w.uint(p),
      None => w.nil(),
    }
    w.buf.extend_from_slice(&self.tokens_key);
    w.u32_array(s.token_ids);
    w.buf.extend_from_slice(&self.stored_tail);
    if self.nil_extra_keys {
      w.str("extra_keys");
      w.array_len(s.block_hashes.len());
      (0..s.block_hashes.len()).for_each(|_| w.nil());
    }
    w.buf.extend_from_slice(&self.stored_group);
  }

  /// A column removed event of the chunk these bytes were prepared for.
  pub(super) fn removed(&self, r: &RemovedView<'_>, w: &mut Writer) {
    w.buf.extend_from_slice(&self.removed_head);
    u64s(r.block_hashes, w);
    w.buf.extend_from_slice(&self.removed_tail);
  }
}

/// The shared bytes of the chunk being encoded, prepared again only when the chunk changes.
#[derive(Default)]
pub(super) struct Prepared(Option<(*const Attrs, Shared)>);

impl Prepared {
  /// The shared bytes for the column events of `attrs`.
  pub(super) fn of(&mut self, attrs: &Attrs) -> &Shared {
    let key = attrs as *const Attrs;
    if self.0.as_ref().is_none_or(|(k, _)| *k != key) {
      self.0 = Some((key, Shared::new(attrs)));
    }
    &self.0.as_ref().expect("just set").1
  }
}
