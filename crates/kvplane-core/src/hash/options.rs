//! Options of `hash_blocks`, and which algorithm takes which of them.

use super::algo::Algo;
use crate::error::{KvError, KvResult};

/// Largest block size accepted (engines use 1 to 256; this only guards against nonsense).
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// Where a chain continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
  /// For the u64 algorithms (`xxh3`, `trtllm_v1_block_key`): the parent block's hash.
  U64(u64),
  /// For the digest algorithms: the parent block's full digest.
  Digest(Vec<u8>),
}

/// One vLLM extra key: vLLM puts LoRA names, multimodal hashes (optionally with offsets), cache
/// salts and prompt-embedding digests in a tuple hashed with the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
  Str(String),
  /// An integer in `-2^64 ..= 2^64 - 1`.
  Int(i128),
  Bytes(Vec<u8>),
  Tuple(Vec<ExtraKey>),
}

impl ExtraKey {
  /// An integer extra key from a JS number, which must be a safe integer.
  pub fn from_f64(v: f64) -> KvResult<ExtraKey> {
    const SAFE: f64 = 9_007_199_254_740_991.0;
    if v.fract() == 0.0 && v.abs() <= SAFE {
      Ok(ExtraKey::Int(v as i128))
    } else {
      Err(KvError::invalid_arg(format!(
        "extra key number {v} is not a safe integer: pass larger integers as bigint"
      )))
    }
  }
}

/// Largest string or bytes extra key: pickle writes bigger payloads outside its frames, a layout
/// kvplane does not reproduce, so it refuses rather than hash differently from the engine.
pub const MAX_EXTRA_KEY_BYTES: usize = 64 * 1024 - 1;
const MAX_EXTRA_KEY_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashOptions {
  pub algo: Algo,
  pub block_size: usize,
  pub parent: Option<Parent>,
  /// vLLM: the LoRA adapter's name (first extra key).
  pub lora_name: Option<String>,
  /// TensorRT-LLM: the LoRA task id.
  pub lora_id: Option<u64>,
  /// vLLM: salt string (extra key of the request's first block); TensorRT-LLM: salt string whose
  /// BLAKE3 digest gives the salt id.
  pub cache_salt: Option<String>,
  /// TensorRT-LLM: the salt id itself, when the caller already has it.
  pub cache_salt_id: Option<u64>,
  /// vLLM: the `PYTHONHASHSEED` string whose hash is the root parent `NONE_HASH`.
  pub none_hash_seed: Option<String>,
  /// vLLM: extra keys hashed with every block, after the LoRA name.
  pub extra_keys: Vec<ExtraKey>,
  /// vLLM: extra keys hashed with the request's first block only, after the salt (vLLM >= 0.33
  /// hashes its salt as the tagged key `("cache_salt", salt)`).
  pub first_block_extra_keys: Vec<ExtraKey>,
}

/// The seed kvplane uses for vLLM's SHA-256 `NONE_HASH` when none is given: vLLM run with
/// `PYTHONHASHSEED=vllm-none-hash` hashes exactly the same.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Opt {
  Parent,
  LoraName,
  LoraId,
  CacheSalt,
  CacheSaltId,
  NoneHashSeed,
  ExtraKeys,
  FirstBlockExtraKeys,
}

impl Opt {
  const fn name(self) -> &'static str {
    match self {
      Opt::Parent => "parent",
      Opt::LoraName => "loraName",
      Opt::LoraId => "loraId",
      Opt::CacheSalt => "cacheSalt",
      Opt::CacheSaltId => "cacheSaltId",
      Opt::NoneHashSeed => "noneHashSeed",
      Opt::ExtraKeys => "extraKeys",
      Opt::FirstBlockExtraKeys => "firstBlockExtraKeys",
    }
  }
}

fn allowed(algo: Algo) -> &'static [Opt] {
  use Opt::*;
  match algo {
    Algo::Xxh3 => &[Parent],
    Algo::Xxh3Content => &[],
    Algo::VllmSha256Cbor | Algo::VllmSha256 | Algo::VllmXxhashCbor | Algo::VllmXxhash => &[
      Parent,
      LoraName,
      CacheSalt,
      NoneHashSeed,
      ExtraKeys,
      FirstBlockExtraKeys,
    ],
    Algo::SglangSha256 => &[Parent, CacheSalt],
    Algo::TrtllmV1BlockKey | Algo::TrtllmV2Sha256 | Algo::TrtllmV2Sha256_64 => {
      &[Parent, LoraId, CacheSalt, CacheSaltId]
    }
  }
}

/// Checks a JS number is a usable block size.
pub fn block_size_from_f64(v: f64) -> KvResult<usize> {
  if v.fract() == 0.0 && v >= 1.0 && v <= MAX_BLOCK_SIZE as f64 {
    Ok(v as usize)
  } else {
    Err(KvError::invalid_arg(format!(
      "blockSize is {v}: it must be an integer in 1..={MAX_BLOCK_SIZE}"
    )))
  }
}

impl HashOptions {
  pub fn new(algo: Algo, block_size: usize) -> Self {
    HashOptions {
      algo,
      block_size,
      parent: None,
      lora_name: None,
      lora_id: None,
      cache_salt: None,
      cache_salt_id: None,
      none_hash_seed: None,
      extra_keys: Vec::new(),
      first_block_extra_keys: Vec::new(),
    }
  }

  fn present(&self) -> impl Iterator<Item = Opt> + '_ {
    [
      (Opt::Parent, self.parent.is_some()),
      (Opt::LoraName, self.lora_name.is_some()),
      (Opt::LoraId, self.lora_id.is_some()),
      (Opt::CacheSalt, self.cache_salt.is_some()),
      (Opt::CacheSaltId, self.cache_salt_id.is_some()),
      (Opt::NoneHashSeed, self.none_hash_seed.is_some()),
      (Opt::ExtraKeys, !self.extra_keys.is_empty()),
      (
        Opt::FirstBlockExtraKeys,
        !self.first_block_extra_keys.is_empty(),
      ),
    ]
    .into_iter()
    .filter_map(|(o, set)| set.then_some(o))
  }

  /// Checks the options fit the algorithm: every option it does not define is refused.
  pub fn validate(&self) -> KvResult<()> {
    let algo = self.algo;
    if self.block_size == 0 || self.block_size > MAX_BLOCK_SIZE {
      return Err(KvError::invalid_arg(format!(
        "blockSize is {}: it must be an integer in 1..={MAX_BLOCK_SIZE}",
        self.block_size
      )));
    }
    let ok = allowed(algo);
    if let Some(bad) = self.present().find(|o| !ok.contains(o)) {
      return Err(KvError::invalid_arg(format!(
        "algo {} does not take option {}",
        algo.name(),
        bad.name()
      )));
    }
    if self.cache_salt.is_some() && self.cache_salt_id.is_some() {
      return Err(KvError::invalid_arg(
        "give cacheSalt or cacheSaltId, not both",
      ));
    }
    match (&self.parent, algo.digest_len()) {
      (Some(Parent::U64(_)), Some(_)) => {
        return Err(KvError::invalid_arg(format!(
          "algo {} chains on full digests: pass parent as bytes (a Uint8Array digest)",
          algo.name()
        )))
      }
      (Some(Parent::Digest(_)), None) => {
        return Err(KvError::invalid_arg(format!(
          "algo {} chains on u64 hashes: pass parent as a bigint",
          algo.name()
        )))
      }
      (Some(Parent::Digest(d)), Some(len)) => {
        // vLLM's random NONE_HASH is 32 bytes even for the 16-byte xxhash digests.
        let fits = d.len() == len || (algo.is_vllm() && d.len() == 32);
        if !fits {
          return Err(KvError::invalid_arg(format!(
            "parent digest for {} has {} bytes; expected {len}",
            algo.name(),
            d.len()
          )));
        }
      }
      _ => {}
    }
    if matches!(algo, Algo::VllmXxhashCbor | Algo::VllmXxhash)
      && self.parent.is_none()
      && self.none_hash_seed.is_none()
    {
      return Err(KvError::invalid_arg(format!(
        "algo {} needs noneHashSeed (vLLM's PYTHONHASHSEED) or a parent digest",
        algo.name()
      )));
    }
    for key in self.extra_keys.iter().chain(&self.first_block_extra_keys) {
      check_extra_key(key, 0)?;
    }
    for s in [&self.lora_name, &self.cache_salt, &self.none_hash_seed]
      .into_iter()
      .flatten()
    {
      if s.len() > MAX_EXTRA_KEY_BYTES {
        return Err(KvError::invalid_arg(format!(
          "string options are limited to {MAX_EXTRA_KEY_BYTES} bytes"
        )));
      }
    }
    Ok(())
  }

  pub(crate) fn parent_u64(&self) -> KvResult<Option<u64>> {
    match &self.parent {
      None => Ok(None),
      Some(Parent::U64(v)) => Ok(Some(*v)),
      Some(Parent::Digest(_)) => Err(KvError::invalid_arg("parent must be a bigint")),
    }
  }

  pub(crate) fn parent_digest(&self) -> KvResult<Option<&[u8]>> {
    match &self.parent {
      None => Ok(None),
      Some(Parent::Digest(d)) => Ok(Some(d)),
      Some(Parent::U64(_)) => Err(KvError::invalid_arg("parent must be a digest")),
    }
  }
}

fn check_extra_key(key: &ExtraKey, depth: usize) -> KvResult<()> {
  const INT_MIN: i128 = -(1i128 << 64);
  const INT_MAX: i128 = (1i128 << 64) - 1;
  match key {
    ExtraKey::Str(s) if s.len() > MAX_EXTRA_KEY_BYTES => Err(KvError::invalid_arg(format!(
      "extra key strings are limited to {MAX_EXTRA_KEY_BYTES} bytes"
    ))),
    ExtraKey::Bytes(b) if b.len() > MAX_EXTRA_KEY_BYTES => Err(KvError::invalid_arg(format!(
      "extra key bytes are limited to {MAX_EXTRA_KEY_BYTES} bytes"
    ))),
    ExtraKey::Int(v) if !(INT_MIN..=INT_MAX).contains(v) => Err(KvError::invalid_arg(
      "extra key integers must lie in -2^64..=2^64-1",
    )),
    ExtraKey::Tuple(_) if depth >= MAX_EXTRA_KEY_DEPTH => Err(KvError::invalid_arg(format!(
      "extra keys nest at most {MAX_EXTRA_KEY_DEPTH} deep"
    ))),
    ExtraKey::Tuple(items) => items.iter().try_for_each(|k| check_extra_key(k, depth + 1)),
    _ => Ok(()),
  }
}
