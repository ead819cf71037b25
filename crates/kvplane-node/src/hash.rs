//! Block hashing: `hashBlocks` (sync) and `hashBlocksAsync` (off the JS thread).

use crate::convert::{bigint_u64, v8_u64s};
use crate::error::{guard_js, invalid_arg, to_js, Code};
use crate::extra_key::JsExtraKey;
use crate::tasks::{Coded, CoreWork};
use kvplane_core::hash::{self, Algo, BlockHashes, HashOptions, Parent};
use kvplane_core::int64;
use kvplane_core::KvResult;
use napi::bindgen_prelude::*;
use napi_derive::napi;

/// Options of `hashBlocks`; see the TypeScript wrapper for their meaning.
#[napi(object, object_to_js = false)]
pub struct HashBlocksOptions {
  pub algo: Option<String>,
  pub block_size: f64,
  pub parent: Option<Either<BigInt, Uint8Array>>,
  pub lora_name: Option<String>,
  pub lora_id: Option<BigInt>,
  pub cache_salt: Option<String>,
  pub cache_salt_id: Option<BigInt>,
  pub none_hash_seed: Option<String>,
  #[napi(ts_type = "Array<string | number | bigint | Uint8Array | Array<unknown>>")]
  pub extra_keys: Option<Vec<JsExtraKey>>,
  #[napi(ts_type = "Array<string | number | bigint | Uint8Array | Array<unknown>>")]
  pub first_block_extra_keys: Option<Vec<JsExtraKey>>,
}

/// Block hashes with their raw digests.
#[napi(object)]
pub struct HashedBlocks {
  /// One u64 per full block.
  pub hashes: BigUint64Array,
  /// `hashes.length * digestSize` bytes: each block's digest in order.
  pub digests: Buffer,
  /// Bytes per digest.
  pub digest_size: u32,
}

pub(crate) fn core_options(o: &HashBlocksOptions) -> KvResult<HashOptions> {
  let algo = o
    .algo
    .as_deref()
    .map(Algo::parse)
    .transpose()?
    .unwrap_or_default();
  let mut opts = HashOptions::new(algo, hash::block_size_from_f64(o.block_size)?);
  opts.parent = match &o.parent {
    None => None,
    Some(Either::A(b)) => Some(Parent::U64(bigint_u64("parent", b)?)),
    Some(Either::B(d)) => Some(Parent::Digest(d.to_vec())),
  };
  opts.lora_name = o.lora_name.clone();
  opts.lora_id = o
    .lora_id
    .as_ref()
    .map(|v| bigint_u64("loraId", v))
    .transpose()?;
  opts.cache_salt = o.cache_salt.clone();
  opts.cache_salt_id = o
    .cache_salt_id
    .as_ref()
    .map(|v| bigint_u64("cacheSaltId", v))
    .transpose()?;
  opts.none_hash_seed = o.none_hash_seed.clone();
  opts.extra_keys = o.extra_keys.iter().flatten().map(|k| k.0.clone()).collect();
  opts.first_block_extra_keys = o
    .first_block_extra_keys
    .iter()
    .flatten()
    .map(|k| k.0.clone())
    .collect();
  opts.validate()?;
  Ok(opts)
}

/// Token ids as given: a `Uint32Array` borrowed, or numbers checked by the core. JS passes numbers
/// copied into a `Float64Array`, read whole, not element by element (src/tokens.ts). Signatures
/// spell the `Either` out: the generated typings do not resolve a type alias.
pub(crate) fn tokens_of(
  tokens: &Either<Uint32Array, Float64Array>,
) -> KvResult<std::borrow::Cow<'_, [u32]>> {
  Ok(match tokens {
    Either::A(t) => std::borrow::Cow::Borrowed(t.as_ref()),
    Either::B(v) => std::borrow::Cow::Owned(hash::tokens_from_f64(v)?),
  })
}

fn to_hashed(out: BlockHashes) -> HashedBlocks {
  HashedBlocks {
    hashes: BigUint64Array::new(out.hashes),
    digests: Buffer::from(out.digests),
    digest_size: out.digest_len as u32,
  }
}

/// Chained hashes of every full block of `tokens`.
#[napi(ts_return_type = "BigUint64Array")]
pub fn hash_blocks<'env>(
  env: &'env Env,
  tokens: Either<Uint32Array, Float64Array>,
  options: HashBlocksOptions,
) -> Result<Unknown<'env>, Code> {
  let hashes = guard_js(|| {
    let opts = core_options(&options)?;
    Ok(hash::hash_blocks(&tokens_of(&tokens)?, &opts, false)?.hashes)
  })?;
  // A V8-owned array: memory the GC sees and reclaims, unlike an external buffer.
  v8_u64s(env, hashes)
}

/// Chained hashes of every full block of `tokens`, with the raw digests.
#[napi]
pub fn hash_blocks_with_digests(
  tokens: Either<Uint32Array, Float64Array>,
  options: HashBlocksOptions,
) -> Result<HashedBlocks, Code> {
  guard_js(|| {
    let opts = core_options(&options)?;
    Ok(to_hashed(hash::hash_blocks(
      &tokens_of(&tokens)?,
      &opts,
      true,
    )?))
  })
}

pub struct HashWork {
  tokens: Vec<u32>,
  opts: HashOptions,
  digests: bool,
}

impl CoreWork for HashWork {
  type Output = BlockHashes;
  type JsValue = HashedBlocks;

  fn run(&mut self) -> KvResult<BlockHashes> {
    hash::hash_blocks(&self.tokens, &self.opts, self.digests)
  }

  fn output(output: BlockHashes) -> HashedBlocks {
    to_hashed(output)
  }
}

/// `hashBlocks` off the JS thread (for bulk inputs); resolves to hashes and, if asked, digests.
#[napi(ts_return_type = "Promise<HashedBlocks>")]
pub fn hash_blocks_async(
  tokens: Either<Uint32Array, Float64Array>,
  options: HashBlocksOptions,
  digests: bool,
) -> Result<AsyncTask<Coded<HashWork>>, Code> {
  let (tokens, opts) = guard_js(|| {
    let opts = core_options(&options)?;
    hash::check_request(&opts, digests)?;
    Ok((tokens_of(&tokens)?.into_owned(), opts))
  })?;
  Ok(Coded::task(HashWork {
    tokens,
    opts,
    digests,
  }))
}

/// Two's-complement signed view of a u64 hash.
#[napi]
pub fn to_int64(value: BigInt) -> Result<BigInt, Code> {
  let v = bigint_u64("value", &value).map_err(to_js)?;
  Ok(BigInt::from(int64::to_int64(v)))
}

/// Unsigned view of a signed 64-bit hash.
#[napi]
pub fn to_uint64(value: BigInt) -> Result<BigInt, Code> {
  let (v, lossless) = value.get_i64();
  if !lossless {
    return Err(invalid_arg("value must be a bigint in -2^63..=2^63-1"));
  }
  Ok(BigInt::from(int64::to_uint64(v)))
}

/// TensorRT-LLM's salt id of a salt string; `hash` is "sha256" (default) or "blake3".
#[napi]
pub fn trtllm_cache_salt_id(salt: String, hash: Option<String>) -> Result<BigInt, Code> {
  let how = hash
    .as_deref()
    .map(hash::SaltIdHash::parse)
    .transpose()
    .map_err(to_js)?;
  Ok(BigInt::from(how.unwrap_or_default().salt_id(&salt)))
}
