//! Worker sets of index nodes. A node held by one worker stores that worker inline; a node held
//! by several points into a side table of sorted `(slot, kids)` vectors. `kids` counts the
//! worker's blocks whose parent is this node: removing a node that still has kids leaves those
//! descendants unreachable for that worker. The inline worker's kids counter is the node's u16
//! `kids`, widened through `Wide` past u16. A node with a side vector keeps the vector's length in
//! `kids` instead (`WIDE` past u16), so counting a node's workers reads the node alone.

use super::node::{Node, Wide, EMPTY, WIDE};

const MULTI: u32 = 0x8000_0000;

/// A side vector's length as kept in its node.
#[inline]
fn len_field(len: usize) -> u16 {
  len.min(WIDE as usize) as u16
}

#[derive(Default)]
pub(super) struct Sets {
  multi: Vec<Vec<(u32, u32)>>,
  free: Vec<u32>,
  wide: Wide,
}

impl Sets {
  #[inline]
  pub fn len(&self, n: &Node) -> usize {
    match n.set {
      EMPTY => 0,
      s if s & MULTI != 0 && n.kids != WIDE => n.kids as usize,
      s if s & MULTI != 0 => self.multi[(s & !MULTI) as usize].len(),
      _ => 1,
    }
  }

  #[inline]
  pub fn contains(&self, n: &Node, slot: u32) -> bool {
    match n.set {
      EMPTY => false,
      s if s & MULTI != 0 => self.multi[(s & !MULTI) as usize]
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
        for e in &self.multi[(s & !MULTI) as usize] {
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
      s if s & MULTI != 0 => self.multi[(s & !MULTI) as usize]
        .iter()
        .for_each(|e| f(e.0)),
      s => f(s),
    }
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
        let v = &mut self.multi[(s & !MULTI) as usize];
        match v.binary_search_by_key(&slot, |e| e.0) {
          Ok(_) => false,
          Err(at) => {
            v.insert(at, (slot, 0));
            n.kids = len_field(v.len());
            true
          }
        }
      }
      s if s == slot => false,
      s => {
        let kids = self.wide.get(n.kids, idx);
        n.kids = self.wide.set(n.kids, idx, 0);
        let mut v = vec![(s, kids), (slot, 0)];
        v.sort_unstable_by_key(|e| e.0);
        let i = match self.free.pop() {
          Some(i) => {
            self.multi[i as usize] = v;
            i
          }
          None => {
            self.multi.push(v);
            (self.multi.len() - 1) as u32
          }
        };
        n.set = i | MULTI;
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
        let i = (s & !MULTI) as usize;
        let v = &mut self.multi[i];
        let at = v.binary_search_by_key(&slot, |e| e.0).ok()?;
        let kids = v.remove(at).1;
        if v.len() == 1 {
          // Back to the inline form.
          let (only, only_kids) = v[0];
          self.multi[i] = Vec::new();
          self.free.push(i as u32);
          n.set = only;
          n.kids = self.wide.set(0, idx, only_kids);
        } else {
          n.kids = len_field(v.len());
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
        let v = &mut self.multi[(s & !MULTI) as usize];
        let Ok(at) = v.binary_search_by_key(&slot, |e| e.0) else {
          return false;
        };
        let k = &mut v[at].1;
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
    self.multi.capacity() * std::mem::size_of::<Vec<(u32, u32)>>()
      + self.multi.iter().map(|v| v.capacity() * 8).sum::<usize>()
      + self.free.capacity() * 4
      + self.wide.bytes()
  }
}
