//! Content-key namespaces: a LoRA adapter and a cache salt change every block's content hash, so
//! requests of one never match blocks of another. The seed of a block's `xxh3` content hash is
//! 1337 plus XXH3-64 of the LoRA name (seed 0) plus XXH3-64 of the salt (seed 1), wrapping, as
//! Dynamo's indexer makes it; empty names count as absent.

use crate::codec::value::Value;
use crate::event::StoredEvent;
use crate::hash::XXH3_SEED;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The prefix that marks a cache salt among a block's extra keys.
pub const SALT_KEY_PREFIX: &str = "dynamo-cache-salt:";

/// The LoRA part of a content seed (0 without one).
pub fn lora_part(lora_name: Option<&str>) -> u64 {
  match lora_name {
    Some(n) if !n.is_empty() => xxh3_64_with_seed(n.as_bytes(), 0),
    _ => 0,
  }
}

/// The cache-salt part of a content seed (0 without one).
pub fn salt_part(salt: Option<&str>) -> u64 {
  match salt {
    Some(s) if !s.is_empty() => xxh3_64_with_seed(s.as_bytes(), 1),
    _ => 0,
  }
}

/// The content seed of a namespace.
pub fn seed(lora: u64, salt: u64) -> u64 {
  XXH3_SEED.wrapping_add(lora).wrapping_add(salt)
}

/// The cache salt a stored event names: its own `cache_salt` (SGLang), else a
/// `dynamo-cache-salt:<salt>` string among its first block's extra keys.
pub fn event_salt(s: &StoredEvent) -> Option<&str> {
  if let Some(salt) = s.cache_salt.as_deref().filter(|v| !v.is_empty()) {
    return Some(salt);
  }
  let Some(Value::Array(blocks)) = &s.extra_keys else {
    return None;
  };
  let Some(Value::Array(first)) = blocks.first() else {
    return None;
  };
  first.iter().find_map(|k| match k {
    Value::Str(v) => v.strip_prefix(SALT_KEY_PREFIX).filter(|v| !v.is_empty()),
    _ => None,
  })
}
