//! Worker sets of index nodes. A node held by one worker stores that worker inline; a node held
//! by several points into a side table of sorted `(slot, kids)` vectors. `kids` counts the
//! worker's blocks whose parent is this node: removing a node that still has kids leaves those
//! descendants unreachable for that worker.

use super::node::{Node, EMPTY};

const MULTI: u32 = 0x8000_0000;

#[derive(Default)]
pub(super) struct Sets {
  multi: Vec<Vec<(u32, u32)>>,
  free: Vec<u32>,
}

impl Sets {
  #[inline]
  pub fn len(&self, n: &Node) -> usize {
    match n.set {
      EMPTY => 0,
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

  /// Adds `slot`; false if it was already a member.
  pub fn insert(&mut self, n: &mut Node, slot: u32) -> bool {
    debug_assert!(slot < MULTI);
    match n.set {
      EMPTY => {
        n.set = slot;
        n.kids = 0;
        true
      }
      s if s & MULTI != 0 => {
        let v = &mut self.multi[(s & !MULTI) as usize];
        match v.binary_search_by_key(&slot, |e| e.0) {
          Ok(_) => false,
          Err(at) => {
            v.insert(at, (slot, 0));
            true
          }
        }
      }
      s if s == slot => false,
      s => {
        let mut v = vec![(s, n.kids), (slot, 0)];
        v.sort_unstable_by_key(|e| e.0);
        let idx = match self.free.pop() {
          Some(i) => {
            self.multi[i as usize] = v;
            i
          }
          None => {
            self.multi.push(v);
            (self.multi.len() - 1) as u32
          }
        };
        n.set = idx | MULTI;
        n.kids = 0;
        true
      }
    }
  }

  /// Removes `slot`, returning its kids count, or `None` if it was not a member.
  pub fn remove(&mut self, n: &mut Node, slot: u32) -> Option<u32> {
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
          n.kids = only_kids;
        }
        Some(kids)
      }
      s if s == slot => {
        n.set = EMPTY;
        Some(std::mem::take(&mut n.kids))
      }
      _ => None,
    }
  }

  /// The kids counter of `slot` on this node, if it is a member.
  pub fn kids_mut<'a>(&'a mut self, n: &'a mut Node, slot: u32) -> Option<&'a mut u32> {
    match n.set {
      EMPTY => None,
      s if s & MULTI != 0 => {
        let v = &mut self.multi[(s & !MULTI) as usize];
        let at = v.binary_search_by_key(&slot, |e| e.0).ok()?;
        Some(&mut v[at].1)
      }
      s if s == slot => Some(&mut n.kids),
      _ => None,
    }
  }

  /// Heap bytes of the side table.
  pub fn bytes(&self) -> usize {
    self.multi.capacity() * std::mem::size_of::<Vec<(u32, u32)>>()
      + self.multi.iter().map(|v| v.capacity() * 8).sum::<usize>()
      + self.free.capacity() * 4
  }
}
