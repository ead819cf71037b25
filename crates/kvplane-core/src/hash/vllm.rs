//! vLLM's block hashes: `hash_fn((parent, tuple(tokens), extra_keys or None))` with SHA-256 or
//! XXH3-128 over pickle protocol 5 or canonical CBOR. The root parent is `NONE_HASH =
//! hash_fn(PYTHONHASHSEED string)`; the u64 form is the digest's last 8 bytes, big-endian.
//!
//! Extra keys, in vLLM's order: the LoRA name, the caller's keys (multimodal hashes and such),
//! then, on the request's first block only (no `parent` given), the cache salt and the caller's
//! first-block keys.

use super::algo::Algo;
use super::options::{ExtraKey, HashOptions, DEFAULT_NONE_HASH_SEED};
use super::sha256::sha256;
use super::{cbor, last_u64_be, pickle};
use crate::error::KvResult;
use xxhash_rust::xxh3::xxh3_128;

/// A digest of up to 32 bytes on the stack.
#[derive(Clone, Copy)]
struct Digest {
  bytes: [u8; 32],
  len: usize,
}

impl Digest {
  fn from_slice(d: &[u8]) -> Digest {
    let mut bytes = [0u8; 32];
    bytes[..d.len()].copy_from_slice(d);
    Digest {
      bytes,
      len: d.len(),
    }
  }

  fn as_slice(&self) -> &[u8] {
    &self.bytes[..self.len]
  }
}

fn digest(algo: Algo, data: &[u8]) -> Digest {
  match algo {
    Algo::VllmSha256Cbor | Algo::VllmSha256 => Digest {
      bytes: sha256(data),
      len: 32,
    },
    _ => Digest::from_slice(&xxh3_128(data).to_be_bytes()),
  }
}

fn uses_cbor(algo: Algo) -> bool {
  matches!(algo, Algo::VllmSha256Cbor | Algo::VllmXxhashCbor)
}

/// `NONE_HASH` for a `PYTHONHASHSEED` string.
fn none_hash(algo: Algo, seed: &str, buf: &mut Vec<u8>) -> Digest {
  buf.clear();
  if uses_cbor(algo) {
    cbor::text(buf, seed);
  } else {
    pickle::text(buf, seed);
  }
  digest(algo, buf)
}

pub(super) fn hash_chain<'a>(
  blocks: impl Iterator<Item = &'a [u32]>,
  opts: &HashOptions,
  hashes: &mut Vec<u64>,
  mut digests: Option<&mut Vec<u8>>,
) -> KvResult<()> {
  let algo = opts.algo;
  let mut buf = Vec::with_capacity(64 + opts.block_size * 6);
  let explicit_parent = opts.parent_digest()?;
  let mut parent = match explicit_parent {
    Some(d) => Digest::from_slice(d),
    None => {
      let seed = opts
        .none_hash_seed
        .as_deref()
        .unwrap_or(DEFAULT_NONE_HASH_SEED);
      none_hash(algo, seed, &mut buf)
    }
  };

  let mut keys: Vec<ExtraKey> = Vec::new();
  keys.extend(opts.lora_name.iter().map(|n| ExtraKey::Str(n.clone())));
  keys.extend(opts.extra_keys.iter().cloned());
  let every_block = keys.len();
  // vLLM adds the salt only when it is truthy: an empty salt is no salt.
  let salt = opts.cache_salt.as_deref().filter(|s| !s.is_empty());
  keys.extend(salt.map(|s| ExtraKey::Str(s.to_string())));
  keys.extend(opts.first_block_extra_keys.iter().cloned());
  let first_differs = explicit_parent.is_none() && keys.len() > every_block;

  for (i, block) in blocks.enumerate() {
    let n = if i == 0 && first_differs {
      keys.len()
    } else {
      every_block
    };
    let extra = (n > 0).then(|| &keys[..n]);
    buf.clear();
    if uses_cbor(algo) {
      cbor::block_tuple(&mut buf, parent.as_slice(), block, extra);
    } else {
      pickle::block_tuple(&mut buf, parent.as_slice(), block, extra);
    }
    parent = digest(algo, &buf);
    hashes.push(last_u64_be(parent.as_slice()));
    if let Some(d) = digests.as_deref_mut() {
      d.extend_from_slice(parent.as_slice());
    }
  }
  Ok(())
}
