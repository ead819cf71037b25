//! SHA-256 for the digest algorithms, behind one seam. Backed by ring (BoringSSL's assembly,
//! with AVX/BMI2 or ARMv8 crypto paths chosen at run time): on CPUs without SHA extensions it
//! hashes the short messages block hashing makes ~1.4x faster than the portable crates.

use ring::digest::{Context, SHA256};

/// SHA-256 of `data`.
#[inline]
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
  sha256_parts(&[data])
}

/// SHA-256 of the concatenation of `parts`.
#[inline]
pub(crate) fn sha256_parts(parts: &[&[u8]]) -> [u8; 32] {
  let mut ctx = Context::new(&SHA256);
  for p in parts {
    ctx.update(p);
  }
  ctx
    .finish()
    .as_ref()
    .try_into()
    .expect("SHA-256 digests have 32 bytes")
}
