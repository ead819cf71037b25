//! A compact hash map from u64 keys to u32 values for the index's big maps: packed 12-byte slots
//! with linear probing and backward-shift deletion (no tombstones), power-of-two capacity, at most
//! 7/8 full. Slot addresses are known from the key alone, so a batch can `prefetch` all of its
//! probes before making any: applying events is bound by cache misses on these tables.

/// Marks an empty slot (values are node indices, never `u32::MAX`).
const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Slot {
  key: u64,
  val: u32,
}

const VACANT: Slot = Slot { key: 0, val: EMPTY };

/// Spreads any u64 (random hashes or small opaque ids alike) over the word.
#[inline(always)]
fn mix(k: u64) -> u64 {
  let p = (k as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
  (p as u64) ^ ((p >> 64) as u64)
}

#[derive(Default)]
pub struct U64Map {
  slots: Vec<Slot>,
  len: usize,
}

impl U64Map {
  #[inline(always)]
  fn mask(&self) -> usize {
    self.slots.len() - 1
  }

  #[inline(always)]
  fn home(&self, key: u64) -> usize {
    mix(key) as usize & self.mask()
  }

  /// Hints the CPU to fetch `key`'s home slot.
  #[inline(always)]
  pub fn prefetch(&self, key: u64) {
    if !self.slots.is_empty() {
      prefetch_read(self.slots.as_ptr().wrapping_add(self.home(key)).cast());
    }
  }

  /// The slot holding `key`, or the empty slot where it would go.
  #[inline(always)]
  fn find(&self, key: u64) -> (usize, bool) {
    let mask = self.mask();
    let mut i = self.home(key);
    loop {
      let s = self.slots[i];
      if s.val == EMPTY {
        return (i, false);
      }
      if ({ s.key }) == key {
        return (i, true);
      }
      i = (i + 1) & mask;
    }
  }

  #[inline]
  pub fn get(&self, key: u64) -> Option<u32> {
    if self.len == 0 {
      return None;
    }
    let (i, found) = self.find(key);
    found.then(|| self.slots[i].val)
  }

  fn grow(&mut self) {
    let cap = (self.slots.len() * 2).max(16);
    let mut slots = Vec::with_capacity(cap);
    advise_huge_pages(
      slots.as_ptr() as *const u8,
      cap * std::mem::size_of::<Slot>(),
    );
    slots.resize(cap, VACANT);
    let old = std::mem::replace(&mut self.slots, slots);
    for s in old.into_iter().filter(|s| s.val != EMPTY) {
      let (i, _) = self.find(s.key);
      self.slots[i] = s;
    }
  }

  #[inline]
  fn reserve_one(&mut self) {
    if (self.len + 1) * 8 > self.slots.len() * 7 {
      self.grow();
    }
  }

  /// Inserts or overwrites; returns the previous value.
  #[inline]
  pub fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
    debug_assert_ne!(val, EMPTY);
    self.reserve_one();
    let (i, found) = self.find(key);
    if found {
      let old = self.slots[i].val;
      self.slots[i].val = val;
      return Some(old);
    }
    self.slots[i] = Slot { key, val };
    self.len += 1;
    None
  }

  /// The value for `key`, inserting `make()` first when absent (one probe); `true` if inserted.
  #[inline]
  pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> u32) -> (u32, bool) {
    self.reserve_one();
    let (i, found) = self.find(key);
    if found {
      return (self.slots[i].val, false);
    }
    let val = make();
    debug_assert_ne!(val, EMPTY);
    self.slots[i] = Slot { key, val };
    self.len += 1;
    (val, true)
  }

  #[inline]
  pub fn remove(&mut self, key: u64) -> Option<u32> {
    if self.len == 0 {
      return None;
    }
    let (mut hole, found) = self.find(key);
    if !found {
      return None;
    }
    let val = self.slots[hole].val;
    // Backward-shift: pull later entries of the run into the hole when their home allows it.
    let mask = self.mask();
    let mut j = hole;
    loop {
      j = (j + 1) & mask;
      let s = self.slots[j];
      if s.val == EMPTY {
        break;
      }
      let home = self.home(s.key);
      // Move s if its home is not cyclically within (hole, j].
      let dist_hole = hole.wrapping_sub(home) & mask;
      let dist_j = j.wrapping_sub(home) & mask;
      if dist_hole < dist_j {
        self.slots[hole] = s;
        hole = j;
      }
    }
    self.slots[hole] = VACANT;
    self.len -= 1;
    Some(val)
  }

  pub fn len(&self) -> usize {
    self.len
  }

  pub fn is_empty(&self) -> bool {
    self.len == 0
  }

  pub fn clear(&mut self) {
    self.slots = Vec::new();
    self.len = 0;
  }

  pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
    self
      .slots
      .iter()
      .filter(|s| s.val != EMPTY)
      .map(|s| (s.key, s.val))
  }

  /// Heap bytes held.
  pub fn bytes(&self) -> usize {
    self.slots.capacity() * std::mem::size_of::<Slot>()
  }
}

/// Asks Linux to back a large, not yet touched allocation with transparent huge pages: probes of
/// multi-megabyte tables otherwise pay a TLB miss on top of the cache miss.
fn advise_huge_pages(p: *const u8, len: usize) {
  #[cfg(target_os = "linux")]
  {
    const HUGE: usize = 2 << 20;
    const PAGE: usize = 4096;
    if len >= HUGE {
      let start = (p as usize).next_multiple_of(PAGE);
      let end = (p as usize + len) & !(PAGE - 1);
      if end > start {
        // SAFETY: advice on pages of an allocation we own; it never changes their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
      }
    }
  }
  #[cfg(not(target_os = "linux"))]
  let _ = (p, len);
}

/// Hints the CPU to fetch the cache line at `p` (never faults).
#[inline(always)]
pub(crate) fn prefetch_read(p: *const u8) {
  #[cfg(target_arch = "x86_64")]
  // SAFETY: prefetch is a hint; it never faults, whatever the address.
  unsafe {
    std::arch::x86_64::_mm_prefetch(p.cast(), std::arch::x86_64::_MM_HINT_T0)
  };
  #[cfg(target_arch = "aarch64")]
  // SAFETY: as above; PRFM never faults.
  unsafe {
    std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
  };
  #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
  let _ = p;
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn behaves_like_a_map_for_random_and_sequential_keys() {
    let mut m = U64Map::default();
    let mut reference = std::collections::HashMap::new();
    let mut x = 0x1234_5678_9abc_def0u64;
    for i in 0..200_000u64 {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      let key = match i % 3 {
        0 => i,
        1 => x,
        _ => x % 1024, // dense collisions
      };
      assert_eq!(m.insert(key, i as u32), reference.insert(key, i as u32));
      if i % 2 == 0 {
        let k = if i % 4 == 0 { key / 2 } else { x % 1024 };
        assert_eq!(m.remove(k), reference.remove(&k));
      }
      if i % 5 == 0 {
        let (v, inserted) = m.get_or_insert_with(x % 997, || 7);
        let r = *reference.entry(x % 997).or_insert(7);
        assert_eq!((v, inserted), (r, inserted));
      }
    }
    assert_eq!(m.len(), reference.len());
    for (k, v) in &reference {
      assert_eq!(m.get(*k), Some(*v), "{k}");
    }
    assert_eq!(m.iter().count(), reference.len());
    assert_eq!(std::mem::size_of::<Slot>(), 12);
  }
}
