//! The `xxh3` content hash used by Dynamo and SMG's cache-aware router.
//!
//! content = XXH3-64(seed 1337) over the block's tokens as u32 LE; block 0's chained hash is its
//! content hash, block i's is XXH3-64(seed 1337) over `seq[i-1]` LE u64 || `content[i]` LE u64.

use super::tokens::le_bytes;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub const XXH3_SEED: u64 = 1337;

/// The unchained content hash of one block.
#[inline]
pub fn content_hash(block: &[u32]) -> u64 {
  xxh3_64_with_seed(&le_bytes(block), XXH3_SEED)
}

/// The content hash of one block under another seed (a LoRA or cache-salt namespace: Dynamo adds
/// theirs to 1337).
#[inline]
pub fn content_hash_seeded(block: &[u32], seed: u64) -> u64 {
  xxh3_64_with_seed(&le_bytes(block), seed)
}

/// Chains a block's content hash onto its parent's sequence hash.
#[inline]
pub fn seq_hash(parent: u64, content: u64) -> u64 {
  let mut buf = [0u8; 16];
  buf[..8].copy_from_slice(&parent.to_le_bytes());
  buf[8..].copy_from_slice(&content.to_le_bytes());
  xxh3_64_with_seed(&buf, XXH3_SEED)
}

pub(super) fn hash_chain<'a>(
  blocks: impl Iterator<Item = &'a [u32]>,
  parent: Option<u64>,
  out: &mut Vec<u64>,
) {
  let mut prev = parent;
  for block in blocks {
    let content = content_hash(block);
    let h = match prev {
      None => content,
      Some(p) => seq_hash(p, content),
    };
    out.push(h);
    prev = Some(h);
  }
}
