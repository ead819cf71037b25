//! Index nodes: one per distinct chained block hash, in a slab addressed by u32.

use super::table::U64Map;

/// No node / empty worker set.
pub(super) const NONE: u32 = u32::MAX;
pub(super) const EMPTY: u32 = u32::MAX;
/// `parent` of a node on the free list.
pub(super) const FREED: u32 = u32::MAX - 1;

/// 20 bytes. Counters are u16; a counter at `WIDE` has its value in a `Wide` side map (only
/// branch points get there).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(super) struct Node {
  /// The key: the chained content hash (or the engine hash with `KeyBy::Engine`). On the free
  /// list: the next free node.
  pub key: u64,
  /// The chain parent node, or `NONE` for a root block.
  pub parent: u32,
  /// Worker set (see `sets.rs`).
  pub set: u32,
  /// Kids counter of the inline worker (see `sets.rs`).
  pub kids: u16,
  /// Live nodes whose `parent` is this node: a node is reclaimed only when it has no workers
  /// and no child nodes, so parent links never dangle.
  pub child_nodes: u16,
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

  /// A node on the free list, followed by `next`.
  pub fn freed(next: u32) -> Node {
    Node {
      key: next as u64,
      parent: FREED,
      set: EMPTY,
      kids: 0,
      child_nodes: 0,
    }
  }
}

/// Marks a u16 node counter whose value lives in `Wide`.
pub(super) const WIDE: u16 = u16::MAX;

/// Values of node counters that do not fit in u16, by node index (one map per counter).
#[derive(Default)]
pub(super) struct Wide {
  map: U64Map,
}

impl Wide {
  #[inline]
  pub fn get(&self, field: u16, node: u32) -> u32 {
    if field == WIDE {
      self.map.get(node as u64).expect("wide counter")
    } else {
      field as u32
    }
  }

  /// Stores `v` as `node`'s counter; returns the field value to keep in the node.
  #[inline]
  pub fn set(&mut self, field: u16, node: u32, v: u32) -> u16 {
    if v < WIDE as u32 {
      if field == WIDE {
        self.map.remove(node as u64);
      }
      v as u16
    } else {
      self.map.insert(node as u64, v);
      WIDE
    }
  }

  /// Adds one to the counter; returns the new field value.
  #[inline]
  pub fn incr(&mut self, field: u16, node: u32) -> u16 {
    if field < WIDE - 1 {
      field + 1
    } else {
      let v = self.get(field, node) + 1;
      self.set(field, node, v)
    }
  }

  /// Takes one from the counter, stopping at zero; returns the new field value.
  #[inline]
  pub fn decr(&mut self, field: u16, node: u32) -> u16 {
    if field < WIDE {
      field.saturating_sub(1)
    } else {
      let v = self.get(field, node) - 1;
      self.set(field, node, v)
    }
  }

  pub fn bytes(&self) -> usize {
    self.map.bytes()
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn node_is_20_bytes() {
    assert_eq!(std::mem::size_of::<Node>(), 20);
  }

  #[test]
  fn wide_counters_round_trip_past_u16() {
    let mut w = Wide::default();
    let (mut a, mut b) = (0u16, 0u16);
    for i in 1..=200_000u32 {
      a = w.incr(a, 1);
      if i % 2 == 0 {
        b = w.incr(b, 2);
      }
      assert_eq!(w.get(a, 1), i);
      assert_eq!(w.get(b, 2), i / 2);
    }
    for i in (0..200_000u32).rev() {
      a = w.decr(a, 1);
      assert_eq!(w.get(a, 1), i);
    }
    assert_eq!(a, 0);
    assert_eq!(w.decr(a, 1), 0);
    b = w.set(b, 2, 3);
    assert_eq!((b, w.map.len()), (3, 0));
  }
}
