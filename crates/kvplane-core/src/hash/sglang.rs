//! SGLang's page hash: SHA-256 over the parent page's digest (absent for the first page) followed
//! by the page's tokens as u32 little-endian. Its event form is the first 8 digest bytes read
//! big-endian as a signed int64; kvplane returns the same 64 bits unsigned (see `to_int64`).
//! EAGLE bigram pages hash each pair's two ids in order: pass them flattened with a doubled
//! block size. A salted request's chain starts from SHA-256("sglang-cache-salt-v1\0" || salt)
//! as its prior hash.

use super::first_u64_be;
use super::options::HashOptions;
use super::sha256::sha256_parts;
use super::tokens::le_bytes;

const SALT_PREFIX: &[u8] = b"sglang-cache-salt-v1\0";

/// The prior hash SGLang gives the first page of a request with this salt (none when empty).
fn salt_root(salt: &str) -> Option<[u8; 32]> {
  (!salt.is_empty()).then(|| sha256_parts(&[SALT_PREFIX, salt.as_bytes()]))
}

pub(super) fn hash_chain<'a>(
  blocks: impl Iterator<Item = &'a [u32]>,
  opts: &HashOptions,
  hashes: &mut Vec<u64>,
  mut digests: Option<&mut Vec<u8>>,
) -> crate::KvResult<()> {
  let mut prev: Option<[u8; 32]> = match opts.parent_digest()? {
    Some(p) => Some(p.try_into().expect("validated 32-byte parent")),
    None => opts.cache_salt.as_deref().and_then(salt_root),
  };
  for block in blocks {
    let toks = le_bytes(block);
    let d = match &prev {
      Some(p) => sha256_parts(&[p, &toks]),
      None => sha256_parts(&[&toks]),
    };
    hashes.push(first_u64_be(&d));
    if let Some(out) = digests.as_deref_mut() {
      out.extend_from_slice(&d);
    }
    prev = Some(d);
  }
  Ok(())
}
