//! The hashing algorithms kvplane speaks, by their stable names.

use crate::error::{KvError, KvResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algo {
  /// Dynamo/SMG chained content hash: XXH3-64 (seed 1337) of tokens, chained over u64 pairs. The default.
  #[default]
  Xxh3,
  /// The unchained XXH3-64 content hash of each block.
  Xxh3Content,
  /// vLLM `sha256_cbor`: SHA-256 of canonical CBOR of `(parent, tokens, extra_keys)`.
  VllmSha256Cbor,
  /// vLLM `sha256` (its default): SHA-256 of pickle protocol 5 of the same tuple.
  VllmSha256,
  /// vLLM `xxhash_cbor`: XXH3-128 of canonical CBOR of the tuple.
  VllmXxhashCbor,
  /// vLLM `xxhash`: XXH3-128 of pickle protocol 5 of the tuple.
  VllmXxhash,
  /// SGLang: SHA-256 of parent digest || tokens as u32 LE.
  SglangSha256,
  /// TensorRT-LLM V1 cache manager `BlockKeyHasher`.
  TrtllmV1BlockKey,
  /// TensorRT-LLM V2 cache manager SHA-256 chain (u64 form: first 8 bytes big-endian).
  TrtllmV2Sha256,
  /// Same chain as [`Algo::TrtllmV2Sha256`], named for its 64-bit wire form.
  TrtllmV2Sha256_64,
}

impl Algo {
  pub const ALL: [Algo; 10] = [
    Algo::Xxh3,
    Algo::Xxh3Content,
    Algo::VllmSha256Cbor,
    Algo::VllmSha256,
    Algo::VllmXxhashCbor,
    Algo::VllmXxhash,
    Algo::SglangSha256,
    Algo::TrtllmV1BlockKey,
    Algo::TrtllmV2Sha256,
    Algo::TrtllmV2Sha256_64,
  ];

  pub const fn name(self) -> &'static str {
    match self {
      Algo::Xxh3 => "xxh3",
      Algo::Xxh3Content => "xxh3_content",
      Algo::VllmSha256Cbor => "vllm_sha256_cbor",
      Algo::VllmSha256 => "vllm_sha256",
      Algo::VllmXxhashCbor => "vllm_xxhash_cbor",
      Algo::VllmXxhash => "vllm_xxhash",
      Algo::SglangSha256 => "sglang_sha256",
      Algo::TrtllmV1BlockKey => "trtllm_v1_block_key",
      Algo::TrtllmV2Sha256 => "trtllm_v2_sha256",
      Algo::TrtllmV2Sha256_64 => "trtllm_v2_sha256_64",
    }
  }

  pub fn parse(name: &str) -> KvResult<Algo> {
    Algo::ALL
      .into_iter()
      .find(|a| a.name() == name)
      .ok_or_else(|| {
        let known: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
        KvError::invalid_arg(format!(
          "unknown hash algo {name:?}; known: {}",
          known.join(", ")
        ))
      })
  }

  /// Bytes of the raw digest, for the algorithms that have one.
  pub const fn digest_len(self) -> Option<usize> {
    match self {
      Algo::VllmSha256Cbor | Algo::VllmSha256 => Some(32),
      Algo::VllmXxhashCbor | Algo::VllmXxhash => Some(16),
      Algo::SglangSha256 | Algo::TrtllmV2Sha256 | Algo::TrtllmV2Sha256_64 => Some(32),
      Algo::Xxh3 | Algo::Xxh3Content | Algo::TrtllmV1BlockKey => None,
    }
  }

  pub(crate) const fn is_vllm(self) -> bool {
    matches!(
      self,
      Algo::VllmSha256Cbor | Algo::VllmSha256 | Algo::VllmXxhashCbor | Algo::VllmXxhash
    )
  }
}
