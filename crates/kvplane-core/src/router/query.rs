//! Prefix queries over a router's tiers: per worker, the leading blocks of a request it holds in
//! device memory, and how far its host and disk tiers continue that run.

use super::{namespace, RouterIndex, Tier};
use crate::hash::{content_hash_seeded, seq_hash};
use crate::index::{MatchOptions, WorkerKey};
use std::collections::HashMap;

/// One worker's match, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerScore {
  pub worker: WorkerKey,
  /// Leading blocks held in device memory.
  pub device: u32,
  /// `device` plus the blocks the host tier holds right after them.
  pub host: u32,
  /// `host` plus the blocks the disk tier holds right after them.
  pub disk: u32,
  /// Blocks the worker holds in device memory in all.
  pub tree_size: u64,
}

/// Every worker holding the request's first block in some tier.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryAnswer {
  pub scores: Vec<WorkerScore>,
}

impl RouterIndex {
  /// The index keys of a request's full blocks, hashed in the namespace of `lora_name` and
  /// `cache_salt` (a trailing partial block is not matched).
  pub fn request_keys(
    &self,
    tokens: &[u32],
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
  ) -> Vec<u64> {
    let seed = namespace::seed(
      namespace::lora_part(lora_name),
      namespace::salt_part(cache_salt),
    );
    let contents = tokens
      .chunks_exact(self.block_size as usize)
      .map(|b| content_hash_seeded(b, seed));
    chain(contents)
  }

  /// The index keys of a request given as its blocks' unchained content hashes (Dynamo's
  /// `LocalBlockHash`es, namespace included).
  pub fn keys_of_content_hashes(&self, hashes: &[u64]) -> Vec<u64> {
    chain(hashes.iter().copied())
  }

  pub fn query(
    &self,
    tokens: &[u32],
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
  ) -> QueryAnswer {
    let keys = self.request_keys(tokens, lora_name, cache_salt);
    self.query_keys(&keys)
  }

  /// Scores every worker holding `keys[0]` in any tier.
  pub fn query_keys(&self, keys: &[u64]) -> QueryAnswer {
    let mut out = QueryAnswer::default();
    let Some(&first) = keys.first() else {
      return out;
    };
    let device = self.tier(Tier::Device);
    let m = device.find_matches(keys, &MatchOptions::default());
    let mut device_of: HashMap<WorkerKey, (u32, u64)> = HashMap::new();
    for ((w, blocks), (_, size)) in m.scores.iter().zip(&m.tree_sizes) {
      device_of.insert(*w, (*blocks, *size));
    }
    let mut workers: Vec<WorkerKey> = device_of.keys().copied().collect();
    for t in [Tier::Host, Tier::Disk] {
      workers.extend(self.tier(t).holders(first));
    }
    workers.sort_unstable();
    workers.dedup();
    for w in workers {
      let (d, tree_size) = device_of
        .get(&w)
        .copied()
        .unwrap_or((0, device.worker_blocks(w)));
      let h = d + self.tier(Tier::Host).run_from(w, keys, d as usize);
      let k = h + self.tier(Tier::Disk).run_from(w, keys, h as usize);
      out.scores.push(WorkerScore {
        worker: w,
        device: d,
        host: h,
        disk: k,
        tree_size,
      });
    }
    out
  }
}

/// Chains content hashes into index keys: block 0's key is its content hash, block i's is
/// `seq_hash(key[i - 1], content[i])`.
fn chain(contents: impl Iterator<Item = u64>) -> Vec<u64> {
  let mut prev: Option<u64> = None;
  contents
    .map(|c| {
      let k = prev.map_or(c, |p| seq_hash(p, c));
      prev = Some(k);
      k
    })
    .collect()
}
