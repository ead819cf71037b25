//! Worker sets of index nodes. A node held by one worker stores that worker inline; a node held
//! by several points into a pool of sorted `(slot, kids)` runs. `kids` counts the worker's blocks
//! whose parent is this node: removing a node that still has kids leaves those descendants
//! unreachable for that worker. The inline worker's kids counter is the node's u16 `kids`,
//! widened through `Wide` past u16. A node with a run in the pool keeps the run's length in
//! `kids` instead (`WIDE` past u16), so counting a node's workers reads the node alone.
//!
//! The pool is one array: a run is a header `(len, cap)` followed by `cap` entries, so reading a
//! node's workers is one fetch from the pool (no separate allocation, header and entries
//! together). Capacities come in classes (2, 4, 6, 8, 12, 16, 24, ...); a run that fills moves to
//! the next class, and freed runs are reused within their class (free runs are chained through
//! their header's first word).

use super::node::{Node, Wide, EMPTY, WIDE};

const MULTI: u32 = 0x8000_0000;
/// End of a class's free chain.
const NO_RUN: u32 = u32::MAX;

/// A side run's length as kept in its node.
#[inline]
fn len_field(len: usize) -> u16 {
  len.min(WIDE as usize) as u16
}

/// Entries a run of capacity class `class` holds.
fn class_cap(class: usize) -> usize {
  match class {
    0 => 2,
    k if k % 2 == 1 => 1 << ((k + 3) / 2),
    k => 3 << (k / 2),
  }
}

/// The smallest class holding `n` entries.
fn class_for(n: usize) -> usize {
  (0..).find(|&k| class_cap(k) >= n).expect("a class")
}

#[derive(Default)]
pub(super) struct Sets {
  /// Runs: header `(len, cap)` (a free run: `(next free run, cap)`), then `cap` entries.
  pool: Vec<(u32, u32)>,
  /// Per class, the first free run (`NO_RUN` when none).
  free: Vec<u32>,
  wide: Wide,
}

impl Sets {
  /// The run of a multi-worker set: its offset in the pool.
  #[inline]
  fn run(s: u32) -> usize {
    (s & !MULTI) as usize
  }

  /// A run's entries.
  #[inline]
  fn entries(&self, at: usize) -> &[(u32, u32)] {
    let len = self.pool[at].0 as usize;
    &self.pool[at + 1..at + 1 + len]
  }

  #[inline]
  pub fn len(&self, n: &Node) -> usize {
    match n.set {
      EMPTY => 0,
      s if s & MULTI != 0 && n.kids != WIDE => n.kids as usize,
      s if s & MULTI != 0 => self.pool[Self::run(s)].0 as usize,
      _ => 1,
    }
  }

  #[inline]
  pub fn contains(&self, n: &Node, slot: u32) -> bool {
    match n.set {
      EMPTY => false,
      s if s & MULTI != 0 => self
        .entries(Self::run(s))
        .binary_search_by_key(&slot, |e| e.0)
        .is_ok(),
      s => s == slot,
    }
  }

  /// Calls `f(slot)` for members in slot order until it returns false.
  #[inline]
  pub fn until(&self, n: &Node, mut f: impl FnMut(u32) -> bool) {
    match n.set {
      EMPTY => {}
      s if s & MULTI != 0 => {
        for e in self.entries(Self::run(s)) {
          if !f(e.0) {
            return;
          }
        }
      }
      s => {
        f(s);
      }
    }
  }

  /// Calls `f(slot)` for every member.
  #[inline]
  pub fn for_each(&self, n: &Node, mut f: impl FnMut(u32)) {
    match n.set {
      EMPTY => {}
      s if s & MULTI != 0 => self.entries(Self::run(s)).iter().for_each(|e| f(e.0)),
      s => f(s),
    }
  }

  /// A free run of class `class` (its header's cap set, len 0).
  fn alloc(&mut self, class: usize) -> usize {
    if self.free.len() <= class {
      self.free.resize(class + 1, NO_RUN);
    }
    let cap = class_cap(class);
    match self.free[class] {
      NO_RUN => {
        let at = self.pool.len();
        let need = 1 + cap;
        if self.pool.capacity() - at < need {
          // Grow by an eighth at a time (not doubling): the pool is most of a set's memory.
          self
            .pool
            .reserve_exact(need.max(self.pool.capacity() / 8).max(1024));
        }
        assert!(at + need < MULTI as usize, "worker set pool full");
        self.pool.resize(at + need, (0, 0));
        self.pool[at] = (0, cap as u32);
        at
      }
      at => {
        self.free[class] = self.pool[at as usize].0;
        self.pool[at as usize] = (0, cap as u32);
        at as usize
      }
    }
  }

  fn release(&mut self, at: usize) {
    let class = class_for(self.pool[at].1 as usize);
    self.pool[at].0 = self.free[class];
    self.free[class] = at as u32;
  }

  /// A new run holding `entries` (sorted), with room for at least one more.
  fn run_of(&mut self, entries: &[(u32, u32)]) -> usize {
    let at = self.alloc(class_for(entries.len() + 1));
    self.pool[at + 1..at + 1 + entries.len()].copy_from_slice(entries);
    self.pool[at].0 = entries.len() as u32;
    at
  }

  /// Adds `slot` to node `idx`; false if it was already a member.
  pub fn insert(&mut self, n: &mut Node, idx: u32, slot: u32) -> bool {
    debug_assert!(slot < MULTI);
    match n.set {
      EMPTY => {
        debug_assert_eq!({ n.kids }, 0);
        n.set = slot;
        true
      }
      s if s & MULTI != 0 => {
        let mut at = Self::run(s);
        let Err(i) = self.entries(at).binary_search_by_key(&slot, |e| e.0) else {
          return false;
        };
        let (len, cap) = self.pool[at];
        let len = len as usize;
        if len == cap as usize {
          // Full: move to the next class (runs are offsets, so growing the pool moves nothing).
          let to = self.alloc(class_for(len + 1));
          self.pool.copy_within(at + 1..at + 1 + len, to + 1);
          self.release(at);
          at = to;
          n.set = at as u32 | MULTI;
        }
        let e = at + 1;
        self.pool.copy_within(e + i..e + len, e + i + 1);
        self.pool[e + i] = (slot, 0);
        self.pool[at].0 = len as u32 + 1;
        n.kids = len_field(len + 1);
        true
      }
      s if s == slot => false,
      s => {
        let kids = self.wide.get(n.kids, idx);
        n.kids = self.wide.set(n.kids, idx, 0);
        let pair = if s < slot {
          [(s, kids), (slot, 0)]
        } else {
          [(slot, 0), (s, kids)]
        };
        n.set = self.run_of(&pair) as u32 | MULTI;
        n.kids = 2;
        true
      }
    }
  }

  /// Removes `slot` from node `idx`, returning its kids count, or `None` if it was not a member.
  pub fn remove(&mut self, n: &mut Node, idx: u32, slot: u32) -> Option<u32> {
    match n.set {
      EMPTY => None,
      s if s & MULTI != 0 => {
        let at = Self::run(s);
        let i = self.entries(at).binary_search_by_key(&slot, |e| e.0).ok()?;
        let len = self.pool[at].0 as usize;
        let e = at + 1;
        let kids = self.pool[e + i].1;
        self.pool.copy_within(e + i + 1..e + len, e + i);
        self.pool[at].0 = len as u32 - 1;
        if len == 2 {
          // Back to the inline form.
          let (only, only_kids) = self.pool[e];
          self.release(at);
          n.set = only;
          n.kids = self.wide.set(0, idx, only_kids);
        } else {
          n.kids = len_field(len - 1);
        }
        Some(kids)
      }
      s if s == slot => {
        let kids = self.wide.get(n.kids, idx);
        n.kids = self.wide.set(n.kids, idx, 0);
        n.set = EMPTY;
        Some(kids)
      }
      _ => None,
    }
  }

  /// Adds one to (or, with `up` false, takes one from, stopping at zero) the kids counter of
  /// `slot` on node `idx`; false if `slot` is not a member.
  #[inline]
  pub fn bump_kids(&mut self, n: &mut Node, idx: u32, slot: u32, up: bool) -> bool {
    match n.set {
      EMPTY => false,
      s if s & MULTI != 0 => {
        let at = Self::run(s);
        let Ok(i) = self.entries(at).binary_search_by_key(&slot, |e| e.0) else {
          return false;
        };
        let k = &mut self.pool[at + 1 + i].1;
        *k = if up { *k + 1 } else { k.saturating_sub(1) };
        true
      }
      s if s == slot => {
        n.kids = if up {
          self.wide.incr(n.kids, idx)
        } else {
          self.wide.decr(n.kids, idx)
        };
        true
      }
      _ => false,
    }
  }

  /// Heap bytes of the side tables.
  pub fn bytes(&self) -> usize {
    self.pool.capacity() * 8 + self.free.capacity() * 4 + self.wide.bytes()
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::index::node::Node;

  #[test]
  fn classes_grow_by_a_half_or_a_third() {
    let caps: Vec<usize> = (0..10).map(class_cap).collect();
    assert_eq!(caps, vec![2, 4, 6, 8, 12, 16, 24, 32, 48, 64]);
    assert_eq!(
      (class_for(1), class_for(2), class_for(5), class_for(33)),
      (0, 0, 2, 8)
    );
  }

  #[test]
  fn sets_grow_shrink_and_reuse_their_runs() {
    let mut sets = Sets::default();
    let mut nodes: Vec<Node> = (0..3).map(|i| Node::new(i, u32::MAX)).collect();
    // Node 1 gets a few workers, node 2 one, node 0 100 in a scrambled order.
    for w in [5, 3, 9] {
      assert!(sets.insert(&mut nodes[1], 1, w));
    }
    assert!(sets.insert(&mut nodes[2], 2, 7));
    let order: Vec<u32> = (0..100).map(|i| (i * 37) % 100).collect();
    for &w in &order {
      assert!(sets.insert(&mut nodes[0], 0, w));
      assert!(!sets.insert(&mut nodes[0], 0, w));
    }
    assert!(sets.bump_kids(&mut nodes[0], 0, 42, true));
    assert!(sets.bump_kids(&mut nodes[0], 0, 42, true));
    let members = |sets: &Sets, n: &Node| {
      let mut v = Vec::new();
      sets.for_each(n, |s| v.push(s));
      v
    };
    assert_eq!(members(&sets, &nodes[0]), (0..100).collect::<Vec<u32>>());
    assert_eq!(members(&sets, &nodes[1]), vec![3, 5, 9]);
    assert_eq!((sets.len(&nodes[0]), sets.len(&nodes[2])), (100, 1));
    assert!(sets.contains(&nodes[0], 99) && !sets.contains(&nodes[1], 4));
    // Removing everything but one worker goes back inline, kids kept.
    for w in (0..100).filter(|&w| w != 42) {
      assert_eq!(sets.remove(&mut nodes[0], 0, w), Some(0));
    }
    assert_eq!(sets.remove(&mut nodes[0], 0, 1), None);
    assert_eq!(nodes[0].set, 42);
    assert_eq!(sets.remove(&mut nodes[0], 0, 42), Some(2));
    assert_eq!(sets.len(&nodes[0]), 0);
    // The freed runs are reused: growing node 0 again takes no new pool space.
    let used = sets.pool.len();
    for &w in &order {
      sets.insert(&mut nodes[0], 0, w);
    }
    assert_eq!(sets.pool.len(), used);
    assert_eq!(members(&sets, &nodes[0]), (0..100).collect::<Vec<u32>>());
    assert_eq!(members(&sets, &nodes[1]), vec![3, 5, 9]);
  }
}
