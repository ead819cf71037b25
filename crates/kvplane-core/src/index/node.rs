//! Index nodes: one per distinct chained block hash, in a slab addressed by u32.

/// No node / empty worker set.
pub(super) const NONE: u32 = u32::MAX;
pub(super) const EMPTY: u32 = u32::MAX;
/// `parent` of a node on the free list.
pub(super) const FREED: u32 = u32::MAX - 1;

#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
  /// The key: the chained content hash (or the engine hash with `KeyBy::Engine`).
  pub key: u64,
  /// The chain parent node, or `NONE` for a root block.
  pub parent: u32,
  /// Worker set (see `sets.rs`).
  pub set: u32,
  /// Kids counter of the inline worker (see `sets.rs`).
  pub kids: u32,
  /// Live nodes whose `parent` is this node: a node is reclaimed only when it has no workers
  /// and no child nodes, so parent links never dangle.
  pub child_nodes: u32,
}

impl Node {
  pub fn new(key: u64, parent: u32) -> Node {
    Node {
      key,
      parent,
      set: EMPTY,
      kids: 0,
      child_nodes: 0,
    }
  }

  pub fn freed() -> Node {
    Node {
      key: 0,
      parent: FREED,
      set: EMPTY,
      kids: 0,
      child_nodes: 0,
    }
  }
}
