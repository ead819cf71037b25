//! TensorRT-LLM's two block-key schemes.
//!
//! V1 (`BlockKeyHasher`): `seed = ntokens ^ (parent * 0xBF58476D1CE4E5B9)`; on a root block the
//! cache salt id is mixed first (64-bit mix); then every token (32-bit mix); then the LoRA task id
//! (64-bit mix) on every block. The root parent is 0.
//!
//! V2 (SHA-256 radix tree): root = SHA-256(mask byte, then u64 LE LoRA id if set, then u64 LE salt
//! id if set; mask bit 0 = LoRA, bit 1 = salt); block = SHA-256(parent digest || tokens u32 LE).
//! Its 64-bit form is the first 8 digest bytes, big-endian.
//!
//! The salt id of a salt string is the first 8 bytes of its SHA-256 digest, little-endian
//! (docs/protocol.md#block-hashing, and TensorRT-LLM's unified salt id). Older TensorRT-LLM routers
//! derived it with BLAKE3 instead: [`cache_salt_id_blake3`] computes that one, to pass as an
//! explicit salt id.

use super::first_u64_be;
use super::options::HashOptions;
use super::sha256::{sha256, sha256_parts};
use super::tokens::le_bytes;
use crate::error::KvResult;

const GOLDEN: u64 = 0x9E37_79B9;
const MUL1: u64 = 0xBF58_476D_1CE4_E5B9;
const MUL2: u64 = 0x94D0_49BB_1331_11EB;

#[inline(always)]
fn mix32(v: u32, seed: u64) -> u64 {
  let mut v = ((v >> 16) ^ v).wrapping_mul(0x45D_9F3B);
  v = ((v >> 16) ^ v).wrapping_mul(0x45D_9F3B);
  v = (v >> 16) ^ v;
  // The golden-ratio constant is added in 32 bits, before widening.
  let v = v.wrapping_add(GOLDEN as u32) as u64;
  seed ^ v.wrapping_add(seed << 6).wrapping_add(seed >> 2)
}

#[inline(always)]
fn mix64(v: u64, seed: u64) -> u64 {
  let mut v = (v ^ (v >> 30)).wrapping_mul(MUL1);
  v = (v ^ (v >> 27)).wrapping_mul(MUL2);
  v ^= v >> 31;
  seed
    ^ v
      .wrapping_add(GOLDEN)
      .wrapping_add(seed << 6)
      .wrapping_add(seed >> 2)
}

/// TensorRT-LLM's salt id of a salt string: SHA-256, first 8 bytes little-endian.
pub fn cache_salt_id(salt: &str) -> u64 {
  let d = sha256(salt.as_bytes());
  u64::from_le_bytes(d[..8].try_into().expect("sha256 digest has 32 bytes"))
}

/// How a TensorRT-LLM salt string becomes its salt id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaltIdHash {
  /// SHA-256, first 8 bytes LE (docs/protocol.md#block-hashing; TensorRT-LLM's unified salt id).
  /// The default.
  #[default]
  Sha256,
  /// BLAKE3, first 8 bytes LE (older TensorRT-LLM routers).
  Blake3,
}

impl SaltIdHash {
  pub fn parse(name: &str) -> crate::KvResult<SaltIdHash> {
    match name {
      "sha256" => Ok(SaltIdHash::Sha256),
      "blake3" => Ok(SaltIdHash::Blake3),
      other => Err(crate::KvError::invalid_arg(format!(
        "salt id hash must be \"sha256\" or \"blake3\", got {other:?}"
      ))),
    }
  }

  /// The salt id of `salt`.
  pub fn salt_id(self, salt: &str) -> u64 {
    match self {
      SaltIdHash::Sha256 => cache_salt_id(salt),
      SaltIdHash::Blake3 => cache_salt_id_blake3(salt),
    }
  }
}

/// The salt id older TensorRT-LLM routers derived: BLAKE3, first 8 bytes little-endian.
pub fn cache_salt_id_blake3(salt: &str) -> u64 {
  let d = blake3::hash(salt.as_bytes());
  u64::from_le_bytes(
    d.as_bytes()[..8]
      .try_into()
      .expect("blake3 digest has 32 bytes"),
  )
}

fn salt_id(opts: &HashOptions) -> Option<u64> {
  opts
    .cache_salt_id
    .or_else(|| opts.cache_salt.as_deref().map(cache_salt_id))
}

pub(super) fn v1_chain<'a>(
  blocks: impl Iterator<Item = &'a [u32]>,
  opts: &HashOptions,
  out: &mut Vec<u64>,
) -> KvResult<()> {
  let salt = salt_id(opts);
  let mut parent = opts.parent_u64()?.unwrap_or(0);
  for block in blocks {
    let mut seed = (block.len() as u64) ^ parent.wrapping_mul(MUL1);
    if parent == 0 {
      if let Some(s) = salt {
        seed = mix64(s, seed);
      }
    }
    for &t in block {
      seed = mix32(t, seed);
    }
    if let Some(lora) = opts.lora_id {
      seed = mix64(lora, seed);
    }
    out.push(seed);
    parent = seed;
  }
  Ok(())
}

fn v2_root(lora_id: Option<u64>, salt_id: Option<u64>) -> [u8; 32] {
  let mut scope = vec![u8::from(lora_id.is_some()) | (u8::from(salt_id.is_some()) << 1)];
  for v in [lora_id, salt_id].into_iter().flatten() {
    scope.extend_from_slice(&v.to_le_bytes());
  }
  sha256(&scope)
}

pub(super) fn v2_chain<'a>(
  blocks: impl Iterator<Item = &'a [u32]>,
  opts: &HashOptions,
  hashes: &mut Vec<u64>,
  mut digests: Option<&mut Vec<u8>>,
) -> KvResult<()> {
  let mut parent: [u8; 32] = match opts.parent_digest()? {
    Some(p) => p.try_into().expect("validated 32-byte parent"),
    None => v2_root(opts.lora_id, salt_id(opts)),
  };
  for block in blocks {
    parent = sha256_parts(&[&parent, &le_bytes(block)]);
    hashes.push(first_u64_be(&parent));
    if let Some(d) = digests.as_deref_mut() {
      d.extend_from_slice(&parent);
    }
  }
  Ok(())
}
