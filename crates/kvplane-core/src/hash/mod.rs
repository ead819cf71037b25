//! Chained KV block hashing, exactly as each engine computes it (docs/protocol.md#block-hashing).
//!
//! Every algorithm hashes only **full** blocks: a trailing partial block is ignored. Every hash is
//! chained: block `i` depends on block `i - 1` (or on `parent` for the first block).

mod algo;
mod cbor;
mod options;
mod pickle;
mod sglang;
mod sha256;
mod tokens;
mod trtllm;
mod vllm;
mod xxh3;

pub use algo::Algo;
pub use options::{block_size_from_f64, DEFAULT_NONE_HASH_SEED, MAX_BLOCK_SIZE};
pub use options::{ExtraKey, HashOptions, Parent};
pub use tokens::tokens_from_f64;
pub use trtllm::{cache_salt_id, cache_salt_id_blake3, SaltIdHash};
pub use xxh3::{content_hash, content_hash_seeded, seq_hash, XXH3_SEED};

use crate::error::{KvError, KvResult};

/// The result of hashing: one u64 per full block, plus the raw digests when asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHashes {
  /// The wire (u64) form of each block's hash.
  pub hashes: Vec<u64>,
  /// `hashes.len() * digest_len` bytes when digests were requested, empty otherwise.
  pub digests: Vec<u8>,
  /// Bytes per digest (0 when digests were not requested).
  pub digest_len: usize,
}

/// Hashes every full block of `tokens` with the algorithm and options given.
///
/// `want_digests` asks for the raw digest bytes too; it is an `ERR_INVALID_ARG` for the algorithms
/// whose hash is a plain u64 (`xxh3`, `xxh3_content`, `trtllm_v1_block_key`).
pub fn hash_blocks(
  tokens: &[u32],
  opts: &HashOptions,
  want_digests: bool,
) -> KvResult<BlockHashes> {
  check_request(opts, want_digests)?;
  let blocks = tokens.chunks_exact(opts.block_size);
  let mut out = BlockHashes {
    hashes: Vec::with_capacity(blocks.len()),
    digests: Vec::new(),
    digest_len: 0,
  };
  match opts.algo {
    Algo::Xxh3 => xxh3::hash_chain(blocks, opts.parent_u64()?, &mut out.hashes),
    Algo::Xxh3Content => out.hashes.extend(blocks.map(xxh3::content_hash)),
    Algo::TrtllmV1BlockKey => trtllm::v1_chain(blocks, opts, &mut out.hashes)?,
    Algo::VllmSha256Cbor | Algo::VllmSha256 | Algo::VllmXxhashCbor | Algo::VllmXxhash => {
      let digests = want_digests.then_some(&mut out.digests);
      vllm::hash_chain(blocks, opts, &mut out.hashes, digests)?
    }
    Algo::SglangSha256 => {
      let digests = want_digests.then_some(&mut out.digests);
      sglang::hash_chain(blocks, opts, &mut out.hashes, digests)?
    }
    Algo::TrtllmV2Sha256 | Algo::TrtllmV2Sha256_64 => {
      let digests = want_digests.then_some(&mut out.digests);
      trtllm::v2_chain(blocks, opts, &mut out.hashes, digests)?
    }
  }
  if want_digests {
    out.digest_len = opts.algo.digest_len().unwrap_or(0);
  }
  Ok(out)
}

/// Checks options and the digest request without hashing anything.
pub fn check_request(opts: &HashOptions, want_digests: bool) -> KvResult<()> {
  opts.validate()?;
  if want_digests && opts.algo.digest_len().is_none() {
    return Err(KvError::invalid_arg(format!(
      "algo {} has no digest form: its hash is a plain u64",
      opts.algo.name()
    )));
  }
  Ok(())
}

/// First 8 bytes of a digest, big-endian.
#[inline]
pub(crate) fn first_u64_be(d: &[u8]) -> u64 {
  u64::from_be_bytes(d[..8].try_into().expect("digest has at least 8 bytes"))
}

/// Last 8 bytes of a digest, big-endian.
#[inline]
pub(crate) fn last_u64_be(d: &[u8]) -> u64 {
  u64::from_be_bytes(
    d[d.len() - 8..]
      .try_into()
      .expect("digest has at least 8 bytes"),
  )
}
