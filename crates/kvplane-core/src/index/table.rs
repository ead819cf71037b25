//! A compact hash map from pre-hashed u64 keys to u32 values: 12-byte packed entries in a
//! SwissTable (hashbrown), so the index's two big maps cost ~13 bytes per slot.

use hashbrown::HashTable;

#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Entry {
  key: u64,
  val: u32,
}

/// Spreads any u64 (random hashes or small opaque ids alike) over both ends of the word.
#[inline(always)]
fn mix(k: u64) -> u64 {
  let p = (k as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
  (p as u64) ^ ((p >> 64) as u64)
}

#[derive(Default)]
pub struct U64Map {
  table: HashTable<Entry>,
}

impl U64Map {
  #[inline]
  pub fn get(&self, key: u64) -> Option<u32> {
    self
      .table
      .find(mix(key), |e| ({ e.key }) == key)
      .map(|e| e.val)
  }

  /// Inserts or overwrites; returns the previous value.
  #[inline]
  pub fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
    match self
      .table
      .entry(mix(key), |e| ({ e.key }) == key, |e| mix(e.key))
    {
      hashbrown::hash_table::Entry::Occupied(mut o) => {
        let old = o.get().val;
        o.get_mut().val = val;
        Some(old)
      }
      hashbrown::hash_table::Entry::Vacant(v) => {
        v.insert(Entry { key, val });
        None
      }
    }
  }

  /// The value for `key`, inserting `make()` first when absent (one probe); `true` if inserted.
  #[inline]
  pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> u32) -> (u32, bool) {
    match self
      .table
      .entry(mix(key), |e| ({ e.key }) == key, |e| mix(e.key))
    {
      hashbrown::hash_table::Entry::Occupied(o) => (o.get().val, false),
      hashbrown::hash_table::Entry::Vacant(v) => {
        let val = make();
        v.insert(Entry { key, val });
        (val, true)
      }
    }
  }

  #[inline]
  pub fn remove(&mut self, key: u64) -> Option<u32> {
    match self.table.find_entry(mix(key), |e| ({ e.key }) == key) {
      Ok(o) => Some(o.remove().0.val),
      Err(_) => None,
    }
  }

  pub fn len(&self) -> usize {
    self.table.len()
  }

  pub fn is_empty(&self) -> bool {
    self.table.is_empty()
  }

  pub fn clear(&mut self) {
    self.table = HashTable::new();
  }

  pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
    self.table.iter().map(|e| (e.key, e.val))
  }

  /// Heap bytes held (buckets and control bytes).
  pub fn bytes(&self) -> usize {
    self.table.capacity() * (std::mem::size_of::<Entry>() + 1)
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn behaves_like_a_map_for_random_and_sequential_keys() {
    let mut m = U64Map::default();
    let mut reference = std::collections::HashMap::new();
    let mut x = 0x1234_5678_9abc_def0u64;
    for i in 0..20_000u64 {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      let key = if i % 2 == 0 { i } else { x };
      assert_eq!(m.insert(key, i as u32), reference.insert(key, i as u32));
      if i % 3 == 0 {
        assert_eq!(m.remove(key / 2), reference.remove(&(key / 2)));
      }
    }
    assert_eq!(m.len(), reference.len());
    for (k, v) in &reference {
      assert_eq!(m.get(*k), Some(*v));
    }
    assert_eq!(std::mem::size_of::<Entry>(), 12);
  }
}
