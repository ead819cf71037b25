//! Hash tables for the index's big maps: bucketized cuckoo hashing. An entry lives in one of two
//! buckets (one or two cache lines each) chosen from its 32-bit hash: its first bucket when that
//! has room, else its second. Bucket counts are not powers of two (fastrange:
//! `(h * buckets) >> 32`), and a table grows by half once it is 94% full, so it stays 63-94%
//! full (growing by a quarter kept it fuller, but re-placed each entry about four times over the
//! table's growth, against twice: a fifth of an index's apply).
//!
//! A big table grows a little at a time: growing allocates the bigger buckets without clearing
//! them (a bucket's slots past its fill are never read; `TagMap`'s, read whole, are zeroed when
//! their first entry goes in) and each insert after it moves `MOVE_BUCKETS` of the old buckets
//! into them. So no insert re-places or clears a whole big table, and a writer holding the
//! index's lock for one piece of an event never holds it for that, however big the table
//! (`shared.rs`). Lookups, removals and `iter` see the old buckets not moved yet; the moving is
//! done long before the new buckets fill. A small table (below `STEPWISE_FROM` buckets) grows at
//! once, into cleared buckets, which takes a few hundred microseconds at most.
//!
//! Beside the buckets, a table keeps one byte per bucket, small enough to stay in the CPU's L2
//! cache: how many entries the bucket holds, and how many entries whose first bucket it is live
//! in their second one. So a lookup reads one cache line unless its first bucket has overflowed
//! (`prefetch` knows which lines a lookup will read before it makes it), and an insert into a
//! full bucket picks an entry to move by reading only those bytes: the move itself is a write,
//! which the CPU does not wait for. Entries are kept at the front of each bucket.
//!
//! `LocMap` holds u64 keys with u64 values (8 per 128-byte bucket, two cache lines). `TagMap`
//! holds only a 32-bit hash tag and a u32 value (8 per 64-byte bucket): the caller keeps the key
//! with the value (the index keeps it in the edge) and confirms a tag match with `eq`.

use std::mem::MaybeUninit;

/// Marks an empty slot (`Entry::val` is an edge id, never `u32::MAX`).
const EMPTY: u32 = u32::MAX;

/// Spreads any u64 (random hashes or small opaque ids alike) over the word.
#[inline(always)]
pub(crate) fn mix(k: u64) -> u64 {
  let p = (k as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
  (p as u64) ^ ((p >> 64) as u64)
}

/// A `Hasher` for small integer keys (worker keys): each word written is folded in with `mix`.
/// Not for keys an outside party chooses to collide.
#[derive(Default, Clone, Copy)]
pub struct MixHasher(u64);

impl std::hash::Hasher for MixHasher {
  #[inline]
  fn write(&mut self, bytes: &[u8]) {
    for &b in bytes {
      self.0 = mix(self.0 ^ b as u64);
    }
  }
  #[inline]
  fn write_u32(&mut self, n: u32) {
    self.0 = mix(self.0 ^ n as u64);
  }
  #[inline]
  fn write_u64(&mut self, n: u64) {
    self.0 = mix(self.0.rotate_left(5) ^ n);
  }
  #[inline]
  fn finish(&self) -> u64 {
    self.0
  }
}

/// Builds `MixHasher`s.
pub type MixState = std::hash::BuildHasherDefault<MixHasher>;

/// The 32-bit hash that places `k`.
#[inline(always)]
pub(crate) fn hash32(k: u64) -> u32 {
  (mix(k) >> 32) as u32
}

/// A second, independent 32-bit hash of `h` (for the second bucket).
#[inline(always)]
fn rehash(mut x: u32) -> u32 {
  x ^= x >> 16;
  x = x.wrapping_mul(0x7feb_352d);
  x ^= x >> 15;
  x = x.wrapping_mul(0x846c_a68b);
  x ^ (x >> 16)
}

/// The first and second bucket of hash `h` among `nb` buckets.
#[inline(always)]
fn pair_in(h: u32, nb: usize) -> (usize, usize) {
  let nb = nb as u64;
  (
    ((h as u64 * nb) >> 32) as usize,
    ((rehash(h) as u64 * nb) >> 32) as usize,
  )
}

/// A table entry (integers only).
trait Entry: Copy {
  /// Whether lookups read a whole bucket (SIMD), not only its entries: such buckets are zeroed
  /// before their first entry goes in.
  const WHOLE: bool;
  fn val(&self) -> u32;
  fn hash(&self) -> u32;
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket<E, const N: usize>([E; N]);

/// A table grows once it would be fuller than this.
const MAX_LOAD_PCT: usize = 94;

/// Entry moves an insert tries before putting the entry in the stash.
const MAX_KICKS: usize = 256;

/// The bucket index of stash positions.
const STASH: usize = usize::MAX;

/// Marks a bucket index as one of the old buckets of a growth under way.
const OLD: usize = 1 << (usize::BITS - 2);

/// Old buckets each insert moves while a growth is under way: at most 32 entries. Growth
/// starts at 94% of the old buckets' room and the next one is half that room again later, so
/// the moving is done within 7% of those inserts.
const MOVE_BUCKETS: usize = 4;

/// Tables with fewer buckets (32,768 entries) grow at once: re-placing them takes a few hundred
/// microseconds at most, and costs apply less than growing them step by step (a growth under
/// way costs lookups a second probe, and its new buckets are written before they are read).
const STEPWISE_FROM: usize = 4096;

/// Low half of a bucket's meta byte: entries held (at most 8).
const FILL: u8 = 0x0f;
/// High half: entries whose first bucket this is, held in their second. Stays at 15 once there
/// (it can no longer be counted down exactly), which only costs lookups a second read.
const OVER_STEP: u8 = 0x10;
const OVER_MAX: u8 = 0xf0;

/// The cuckoo core shared by both maps.
struct Raw<E, const N: usize> {
  /// Not initialized when allocated: a bucket's first `fill` slots hold its entries, and the
  /// rest are never read (for `Entry::WHOLE`, a bucket is zeroed when its first entry goes in).
  buckets: Vec<MaybeUninit<Bucket<E, N>>>,
  /// One byte per bucket: `FILL` and overflow halves.
  meta: Vec<u8>,
  len: usize,
  /// Entries no bucket pair could take (many entries sharing one 32-bit hash); normally empty.
  stash: Vec<E>,
  /// The buckets before the growth under way (empty when none is), with their meta bytes: those
  /// from `moved` on still hold their entries.
  old: Vec<MaybeUninit<Bucket<E, N>>>,
  old_meta: Vec<u8>,
  moved: usize,
  /// Picks which entry a random walk moves.
  kick: u32,
  /// The moves of the last random walk (kept to reuse the allocation).
  moves: Vec<(usize, usize)>,
}

impl<E, const N: usize> Default for Raw<E, N> {
  fn default() -> Self {
    Raw {
      buckets: Vec::new(),
      meta: Vec::new(),
      len: 0,
      stash: Vec::new(),
      old: Vec::new(),
      old_meta: Vec::new(),
      moved: 0,
      kick: 0x2545_f491,
      moves: Vec::new(),
    }
  }
}

impl<E: Entry, const N: usize> Raw<E, N> {
  /// The first and second bucket of hash `h`.
  #[inline(always)]
  fn pair(&self, h: u32) -> (usize, usize) {
    pair_in(h, self.buckets.len())
  }

  /// The old buckets not moved yet that a lookup of `h` reads (`OLD`-marked), while a growth is
  /// under way. The old meta bytes' overflow halves are not counted down as entries move, so
  /// they may send a lookup to a second bucket for nothing, never away from one it needs.
  #[inline(always)]
  fn old_probe(&self, h: u32) -> [Option<usize>; 2] {
    if self.moved >= self.old.len() {
      return [None, None];
    }
    let (a, b) = pair_in(h, self.old.len());
    let live = |bi: usize| (bi >= self.moved).then_some(bi | OLD);
    let second = (b != a && self.old_meta[a] >= OVER_STEP)
      .then(|| live(b))
      .flatten();
    [live(a), second]
  }

  /// The entries held in bucket `bi` of the current buckets.
  #[inline(always)]
  fn held_new(&self, bi: usize) -> &[E] {
    // SAFETY: a bucket's first `fill` slots hold its entries (`buckets`).
    unsafe { std::slice::from_raw_parts(self.buckets[bi].as_ptr().cast::<E>(), self.fill(bi)) }
  }

  /// The entries held in (possibly `OLD`-marked) bucket `bi`.
  #[inline(always)]
  fn held(&self, bi: usize) -> &[E] {
    let (bucket, fill) = if bi & OLD != 0 {
      let o = bi ^ OLD;
      (&self.old[o], (self.old_meta[o] & FILL) as usize)
    } else {
      (&self.buckets[bi], self.fill(bi))
    };
    // SAFETY: a bucket's first `fill` slots hold its entries (`buckets`).
    unsafe { std::slice::from_raw_parts(bucket.as_ptr().cast::<E>(), fill) }
  }

  /// Puts `e` at slot `i` of bucket `bi`: its fill (an entry going in) or below (replacing one).
  #[inline(always)]
  fn put(&mut self, bi: usize, i: usize, e: E) {
    debug_assert!(i < N && i <= self.fill(bi));
    let p = self.buckets[bi].as_mut_ptr();
    // SAFETY: `p` is a bucket of this table and `i < N`; writing initializes what it writes.
    unsafe {
      if E::WHOLE && i == 0 && self.fill(bi) == 0 {
        p.write_bytes(0, 1);
      }
      p.cast::<E>().add(i).write(e);
    }
  }

  #[inline(always)]
  fn fill(&self, bi: usize) -> usize {
    (self.meta[bi] & FILL) as usize
  }

  /// Whether entries whose first bucket is `bi` may be in their second.
  #[inline(always)]
  fn overflowed(&self, bi: usize) -> bool {
    self.meta[bi] >= OVER_STEP
  }

  /// The buckets a lookup of `h` reads: the first, and the second only if the first overflowed.
  #[inline(always)]
  fn probe(&self, h: u32) -> (usize, Option<usize>) {
    let (a, b) = self.pair(h);
    (a, (self.overflowed(a) && b != a).then_some(b))
  }

  /// Hints the CPU to fetch the buckets a lookup of `h` reads.
  #[inline(always)]
  fn prefetch(&self, h: u32) {
    if !self.buckets.is_empty() {
      let (a, b) = self.probe(h);
      let line = |bi: usize| {
        let p: *const u8 = self.buckets.as_ptr().wrapping_add(bi).cast();
        prefetch_read(p);
        if std::mem::size_of::<Bucket<E, N>>() > 64 {
          prefetch_read(p.wrapping_add(64));
        }
      };
      line(a);
      if let Some(b) = b {
        line(b);
      }
      if self.growing() {
        self.prefetch_old(h);
      }
    }
  }

  /// `prefetch`'s read of the old first bucket of `h`, while a growth is under way.
  #[cold]
  #[inline(never)]
  fn prefetch_old(&self, h: u32) {
    if let [Some(o), _] = self.old_probe(h) {
      let p: *const u8 = self.old.as_ptr().wrapping_add(o ^ OLD).cast();
      prefetch_read(p);
      if std::mem::size_of::<Bucket<E, N>>() > 64 {
        prefetch_read(p.wrapping_add(64));
      }
    }
  }

  /// (bucket, slot) of the entry with hash `h` that `hit` accepts.
  #[inline(always)]
  fn find(&self, h: u32, mut hit: impl FnMut(&E) -> bool) -> Option<(usize, usize)> {
    if self.len == 0 {
      return None;
    }
    let (a, b) = self.probe(h);
    for bi in std::iter::once(a).chain(b) {
      if let Some(i) = self.held_new(bi).iter().position(&mut hit) {
        return Some((bi, i));
      }
    }
    if self.growing() || !self.stash.is_empty() {
      return self.find_rest(h, hit);
    }
    None
  }

  /// `find` past the current buckets: the old buckets not moved yet, then the stash.
  #[cold]
  #[inline(never)]
  fn find_rest(&self, h: u32, mut hit: impl FnMut(&E) -> bool) -> Option<(usize, usize)> {
    for bi in self.old_probe(h).into_iter().flatten() {
      if let Some(i) = self.held(bi).iter().position(&mut hit) {
        return Some((bi, i));
      }
    }
    self.stash.iter().position(hit).map(|i| (STASH, i))
  }

  /// `find`, or where an entry with hash `h` would go when none is found: its bucket pair,
  /// for `insert_vacant` (no second hashing of the key).
  #[inline(always)]
  fn find_or_vacant(&self, h: u32, hit: impl FnMut(&E) -> bool) -> Result<(usize, usize), Vacant> {
    let (a, b) = self.pair(h);
    let vacant = Vacant {
      a: a as u32,
      b: b as u32,
      #[cfg(debug_assertions)]
      shape: (self.len, self.buckets.len()),
    };
    self.find(h, hit).ok_or(vacant)
  }

  /// Adds an entry known to be absent, where `find_or_vacant` said it would go (the table not
  /// changed since).
  #[inline]
  fn insert_vacant(&mut self, v: Vacant, e: E) {
    #[cfg(debug_assertions)]
    debug_assert_eq!(v.shape, (self.len, self.buckets.len()), "a stale Vacant");
    self.insert_at(v.a as usize, v.b as usize, e);
  }

  /// Adds an absent entry whose bucket pair is `(a, b)` (placed again if the table grows).
  #[inline]
  fn insert_at(&mut self, a: usize, b: usize, e: E) {
    if self.growing() {
      self.move_old(MOVE_BUCKETS);
    }
    let placed = if (self.len + 1) * 100 > self.buckets.len() * N * MAX_LOAD_PCT {
      self.grow();
      self.place(e)
    } else {
      self.push_pair(a, b, e) || self.place_moving(a, b, e)
    };
    if !placed {
      self.stash.push(e);
    }
    self.len += 1;
  }

  #[inline(always)]
  fn at(&self, b: usize, i: usize) -> &E {
    if b == STASH {
      &self.stash[i]
    } else {
      &self.held(b)[i]
    }
  }

  /// Adds an entry known to be absent.
  #[inline]
  fn insert_new(&mut self, e: E) {
    let (a, b) = self.pair(e.hash());
    self.insert_at(a, b, e);
  }

  /// Counts `e`, now held in bucket `bi`, as overflowed from its first bucket if `bi` is its
  /// second (`up`), or takes it out of that count (`!up`).
  #[inline(always)]
  fn count_over(&mut self, e: &E, bi: usize, up: bool) {
    let (first, _) = self.pair(e.hash());
    if first != bi {
      let m = &mut self.meta[first];
      if *m < OVER_MAX {
        if up {
          *m += OVER_STEP;
        } else {
          *m -= OVER_STEP;
        }
      }
    }
  }

  /// Appends `e` to bucket `bi`, which has room.
  #[inline(always)]
  fn push(&mut self, bi: usize, e: E) {
    debug_assert_ne!(e.val(), EMPTY);
    let i = self.fill(bi);
    self.put(bi, i, e);
    self.meta[bi] += 1;
    self.count_over(&e, bi, true);
  }

  /// Puts `e` at slot `i` of bucket `bi` and returns the entry it replaces.
  #[inline(always)]
  fn swap(&mut self, bi: usize, i: usize, e: E) -> E {
    let old = self.held_new(bi)[i];
    self.put(bi, i, e);
    self.count_over(&old, bi, false);
    self.count_over(&e, bi, true);
    old
  }

  /// The other bucket of an entry held in bucket `bi`.
  #[inline(always)]
  fn other(&self, e: &E, bi: usize) -> usize {
    let (x, y) = self.pair(e.hash());
    if x == bi {
      y
    } else {
      x
    }
  }

  /// Appends `e` to `a`, its first bucket, or else to `b`, its second, if either has room (the
  /// overflow count kept without hashing `e` again).
  #[inline(always)]
  fn push_pair(&mut self, a: usize, b: usize, e: E) -> bool {
    debug_assert_ne!(e.val(), EMPTY);
    let fa = self.fill(a);
    if fa < N {
      self.put(a, fa, e);
      self.meta[a] += 1;
      return true;
    }
    let fb = self.fill(b);
    if fb < N {
      self.put(b, fb, e);
      self.meta[b] += 1;
      if self.meta[a] < OVER_MAX {
        self.meta[a] += OVER_STEP;
      }
      return true;
    }
    false
  }

  /// Puts `e` in one of its buckets, moving entries to their other bucket when both are full;
  /// false (table unchanged) if that fails.
  #[inline]
  fn place(&mut self, e: E) -> bool {
    let (a, b) = self.pair(e.hash());
    self.push_pair(a, b, e) || self.place_moving(a, b, e)
  }

  /// `place` when both buckets of `e` are full.
  #[cold]
  fn place_moving(&mut self, a: usize, b: usize, e: E) -> bool {
    // Both full: move one entry of either bucket whose other bucket has room (the meta bytes say
    // which, without reading those buckets; bucket `a` is in cache from the lookup).
    for bi in [a, b] {
      for i in 0..N {
        let x = self.held_new(bi)[i];
        let to = self.other(&x, bi);
        if to != bi && self.fill(to) < N {
          self.swap(bi, i, e);
          self.push(to, x);
          return true;
        }
      }
    }
    // Random walk; moves are recorded so a failed walk can be undone.
    let mut moves = std::mem::take(&mut self.moves);
    moves.clear();
    let mut cur = e;
    let mut bi = if self.kick & 1 == 0 { a } else { b };
    for _ in 0..MAX_KICKS {
      self.kick ^= self.kick << 13;
      self.kick ^= self.kick >> 17;
      self.kick ^= self.kick << 5;
      let i = (self.kick as usize) % N;
      cur = self.swap(bi, i, cur);
      moves.push((bi, i));
      bi = self.other(&cur, bi);
      if self.fill(bi) < N {
        self.push(bi, cur);
        self.moves = moves;
        return true;
      }
    }
    // Undo: walk the moves back so every entry is where it was.
    for &(bi, i) in moves.iter().rev() {
      cur = self.swap(bi, i, cur);
    }
    self.moves = moves;
    false
  }

  /// Starts a growth: the bigger buckets, empty, in place, and the current ones kept as the old
  /// buckets that later inserts move (`move_old`). The stash is placed again now.
  #[cold]
  fn grow(&mut self) {
    if self.moved < self.old.len() {
      // Not reached while growth needs half the room again in inserts (see `MOVE_BUCKETS`).
      self.move_old(usize::MAX);
    }
    let nb = (self.buckets.len() + self.buckets.len() / 2).max(self.buckets.len() + 1);
    let at_once = self.buckets.len() < STEPWISE_FROM;
    // A small table is allocated zeroed, which the allocator does by clearing memory it reuses
    // (bringing it into the cache before the entries are placed: about a tenth faster than
    // placing them into memory not yet read) and for nothing on fresh pages.
    // Both allocated before either is put in place: a table never holds one without the other.
    let (buckets, meta) = (alloc_buckets::<Bucket<E, N>>(nb, at_once), vec![0; nb]);
    self.old = std::mem::replace(&mut self.buckets, buckets);
    self.old_meta = std::mem::replace(&mut self.meta, meta);
    self.moved = 0;
    for e in std::mem::take(&mut self.stash) {
      if !self.place(e) {
        self.stash.push(e);
      }
    }
    if at_once {
      self.move_old(usize::MAX);
    }
  }

  /// Moves up to `n` old buckets into the current ones; frees the old ones after the last.
  #[cold]
  fn move_old(&mut self, n: usize) {
    let end = self.old.len().min(self.moved.saturating_add(n));
    // Out of `self` while their entries are placed (`place` takes all of it).
    let (old, old_meta) = (
      std::mem::take(&mut self.old),
      std::mem::take(&mut self.old_meta),
    );
    for (bucket, &meta) in old[self.moved..end].iter().zip(&old_meta[self.moved..end]) {
      // SAFETY: a bucket's first `fill` slots hold its entries (`buckets`).
      let held =
        unsafe { std::slice::from_raw_parts(bucket.as_ptr().cast::<E>(), (meta & FILL) as usize) };
      for &e in held {
        if !self.place(e) {
          self.stash.push(e);
        }
      }
    }
    (self.old, self.old_meta, self.moved) = (old, old_meta, end);
    if self.moved == self.old.len() {
      self.old = Vec::new();
      self.old_meta = Vec::new();
      self.moved = 0;
      // Now that the moving has touched the new buckets' pages: asked at allocation, each first
      // touch of a 2 MB page would be a huge page's fault under the writer's lock (up to
      // milliseconds with the kernel compacting memory); asked now, the kernel merges the pages
      // in the background.
      advise_huge_pages(
        self.buckets.as_ptr() as *const u8,
        self.buckets.len() * std::mem::size_of::<Bucket<E, N>>(),
      );
    }
  }

  /// Empties slot `i` of bucket `bi`, keeping the bucket's entries at its front.
  #[inline]
  fn remove_at(&mut self, bi: usize, i: usize) {
    self.len -= 1;
    if bi == STASH {
      self.stash.swap_remove(i);
      return;
    }
    if bi & OLD != 0 {
      // Its first bucket's overflow half is left as it is (see `old_probe`).
      let o = bi ^ OLD;
      let last = (self.old_meta[o] & FILL) as usize - 1;
      let moved = self.held(bi)[last];
      // SAFETY: slot `i` of that old bucket holds an entry (`i < last + 1`).
      unsafe { self.old[o].as_mut_ptr().cast::<E>().add(i).write(moved) };
      self.old_meta[o] -= 1;
      return;
    }
    let last = self.fill(bi) - 1;
    let held = self.held_new(bi);
    let (e, moved) = (held[i], held[last]);
    self.put(bi, i, moved);
    self.meta[bi] -= 1;
    self.count_over(&e, bi, false);
  }

  fn iter(&self) -> impl Iterator<Item = &E> + '_ {
    (0..self.places()).flat_map(|i| self.held_at(i).iter())
  }

  /// Where entries are held, numbered for `held_at`: the buckets, the old ones not moved yet, and
  /// the stash.
  fn places(&self) -> usize {
    self.buckets.len() + self.old.len().saturating_sub(self.moved) + 1
  }

  /// The entries held at place `i` (`places`).
  fn held_at(&self, i: usize) -> &[E] {
    let (nb, unmoved) = (
      self.buckets.len(),
      self.old.len().saturating_sub(self.moved),
    );
    if i < nb {
      self.held(i)
    } else if i < nb + unmoved {
      self.held((self.moved + i - nb) | OLD)
    } else {
      &self.stash
    }
  }

  fn bytes(&self) -> usize {
    (self.buckets.capacity() + self.old.capacity()) * std::mem::size_of::<Bucket<E, N>>()
      + self.meta.capacity()
      + self.old_meta.capacity()
      + self.stash.capacity() * std::mem::size_of::<E>()
  }

  /// Whether a growth is under way.
  #[inline(always)]
  fn growing(&self) -> bool {
    self.moved < self.old.len()
  }

  /// Checks the meta bytes against the buckets (tests).
  #[cfg(test)]
  fn check(&self) {
    let mut over = vec![0usize; self.buckets.len()];
    for bi in 0..self.buckets.len() {
      for e in self.held(bi) {
        assert_ne!(e.val(), EMPTY, "bucket {bi}");
        let (x, y) = self.pair(e.hash());
        assert!(bi == x || bi == y);
        if bi != x {
          over[x] += 1;
        }
      }
    }
    for (bi, &n) in over.iter().enumerate() {
      let m = (self.meta[bi] >> 4) as usize;
      // Exact below 15; at 15 it stays (sticky), whatever the count is.
      assert!(m == n || m == 15, "overflow of bucket {bi}: {m} vs {n}");
    }
    let mut held = self.stash.len();
    for bi in 0..self.buckets.len() {
      held += self.fill(bi);
    }
    for bi in self.moved.min(self.old.len())..self.old.len() {
      held += (self.old_meta[bi] & FILL) as usize;
      for e in self.held(bi | OLD) {
        let (x, y) = pair_in(e.hash(), self.old.len());
        assert!(bi == x || bi == y, "old bucket {bi}");
        // The old overflow half may be over, never under (`old_probe`).
        if bi != x {
          assert!(self.old_meta[x] >= OVER_STEP, "old overflow of bucket {x}");
        }
      }
    }
    assert_eq!(held, self.len);
  }
}

/// Where an absent key goes: its bucket pair, found by the lookup that missed it. Valid until
/// the table changes (checked in debug builds).
#[derive(Clone, Copy, Debug)]
pub struct Vacant {
  a: u32,
  b: u32,
  #[cfg(debug_assertions)]
  shape: (usize, usize),
}

/// An entry of `LocMap`: the location's high half is never `u32::MAX` (it is an edge id).
#[derive(Clone, Copy)]
#[repr(C)]
struct LocSlot {
  key: u64,
  loc: u64,
}

impl Entry for LocSlot {
  const WHOLE: bool = false;
  #[inline(always)]
  fn val(&self) -> u32 {
    (self.loc >> 32) as u32
  }
  #[inline(always)]
  fn hash(&self) -> u32 {
    hash32(self.key)
  }
}

/// u64 -> u64 map whose values' high halves are below `u32::MAX`: 16-byte entries, 4 per
/// bucket. A worker's engine ids to the locations of its blocks.
#[derive(Default)]
pub struct LocMap {
  raw: Raw<LocSlot, 8>,
}

impl LocMap {
  #[inline(always)]
  pub fn prefetch(&self, key: u64) {
    self.raw.prefetch(hash32(key));
  }

  #[inline(always)]
  fn find(&self, key: u64) -> Option<(usize, usize)> {
    self.raw.find(hash32(key), |s| s.key == key)
  }

  #[inline]
  pub fn get(&self, key: u64) -> Option<u64> {
    self.find(key).map(|(b, i)| self.raw.at(b, i).loc)
  }

  /// `get`, or where `key` would go (`insert_vacant`): one lookup for a get-then-insert.
  #[inline]
  pub fn get_or_vacant(&self, key: u64) -> Result<u64, Vacant> {
    self
      .raw
      .find_or_vacant(hash32(key), |s| s.key == key)
      .map(|(b, i)| self.raw.at(b, i).loc)
  }

  /// Inserts `key` where `get_or_vacant` found it absent; the map must not have changed since.
  #[inline]
  pub fn insert_vacant(&mut self, v: Vacant, key: u64, loc: u64) {
    debug_assert_ne!((loc >> 32) as u32, EMPTY);
    self.raw.insert_vacant(v, LocSlot { key, loc });
  }

  /// Inserts `key`, which the caller knows is absent.
  #[inline]
  pub fn insert_absent(&mut self, key: u64, loc: u64) {
    debug_assert_ne!((loc >> 32) as u32, EMPTY);
    debug_assert!(self.find(key).is_none(), "insert_absent of a present key");
    self.raw.insert_new(LocSlot { key, loc });
  }

  #[inline]
  pub fn remove(&mut self, key: u64) -> Option<u64> {
    let (b, i) = self.find(key)?;
    let loc = self.raw.at(b, i).loc;
    self.raw.remove_at(b, i);
    Some(loc)
  }

  pub fn len(&self) -> usize {
    self.raw.len
  }

  pub fn is_empty(&self) -> bool {
    self.raw.len == 0
  }

  pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
    self.raw.iter().map(|s| (s.key, s.loc))
  }

  /// How many places `locs_at` numbers: the buckets, the old ones not moved yet, and the stash.
  pub fn places(&self) -> usize {
    self.raw.places()
  }

  /// The locations held in places `at` (see `places`): a map gone through a few places at a
  /// time (a clear applied in pieces) while it does not change.
  pub fn locs_at(&self, at: std::ops::Range<usize>) -> impl Iterator<Item = u64> + '_ {
    at.flat_map(|i| self.raw.held_at(i).iter().map(|s| s.loc))
  }

  /// Heap bytes held.
  pub fn bytes(&self) -> usize {
    self.raw.bytes()
  }
}

#[derive(Clone, Copy)]
#[repr(C)]
struct TagSlot {
  tag: u32,
  val: u32,
}

impl Entry for TagSlot {
  const WHOLE: bool = true;
  #[inline(always)]
  fn val(&self) -> u32 {
    self.val
  }
  #[inline(always)]
  fn hash(&self) -> u32 {
    self.tag
  }
}

/// A set of u32 values found by the 32-bit hash (`hash32`) of a key the caller keeps: 8-byte
/// entries of (tag, value), 8 per bucket. `eq(value)` confirms a tag match against the caller's
/// key.
#[derive(Default)]
pub struct TagMap {
  raw: Raw<TagSlot, 8>,
}

/// Bit `i` set where entry `i` of the bucket, one of its first `fill`, carries tag `h` (SSE2:
/// four 16-byte compares per bucket instead of a branch per entry).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tag_hits(bucket: &[TagSlot; 8], h: u32, fill: usize) -> u32 {
  use std::arch::x86_64::*;
  // SAFETY: SSE2 is part of x86_64; the bucket is 64 bytes, 64-byte aligned (`Bucket`).
  unsafe {
    let p = bucket.as_ptr() as *const __m128i;
    let tag = _mm_set1_epi32(h as i32);
    let mut hits = 0u32;
    for q in 0..4 {
      let v = _mm_load_si128(p.add(q));
      // Lanes: tag, val, tag, val; only the tag lanes count.
      let t = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(v, tag))) as u32 & 0b0101;
      hits |= ((t & 1) | ((t >> 1) & 2)) << (2 * q);
    }
    hits & ((1u32 << fill) - 1)
  }
}

impl TagMap {
  #[inline(always)]
  pub fn prefetch(&self, h: u32) {
    self.raw.prefetch(h);
  }

  #[inline]
  pub fn get(&self, h: u32, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
      if self.raw.len == 0 {
        return None;
      }
      let (a, b) = self.raw.probe(h);
      for bi in std::iter::once(a).chain(b) {
        let fill = self.raw.fill(bi);
        if fill == 0 {
          continue;
        }
        // SAFETY: a `TagSlot` bucket holding entries was zeroed before its first (`Raw::put`).
        let bucket = unsafe { &self.raw.buckets[bi].assume_init_ref().0 };
        let mut hits = tag_hits(bucket, h, fill);
        while hits != 0 {
          let i = hits.trailing_zeros() as usize;
          if eq(bucket[i].val) {
            return Some(bucket[i].val);
          }
          hits &= hits - 1;
        }
      }
      if self.raw.growing() {
        for bi in self.raw.old_probe(h).into_iter().flatten() {
          if let Some(s) = self.raw.held(bi).iter().find(|s| s.tag == h && eq(s.val)) {
            return Some(s.val);
          }
        }
      }
      self
        .raw
        .stash
        .iter()
        .find(|s| s.tag == h && eq(s.val))
        .map(|s| s.val)
    }
    #[cfg(not(target_arch = "x86_64"))]
    self
      .raw
      .find(h, |s| s.tag == h && eq(s.val))
      .map(|(b, i)| self.raw.at(b, i).val)
  }

  /// The value matching `h` and `eq`, inserting `make()` first when absent; `true` if inserted.
  #[inline]
  pub fn get_or_insert_with(
    &mut self,
    h: u32,
    eq: impl FnMut(u32) -> bool,
    make: impl FnOnce() -> u32,
  ) -> (u32, bool) {
    if let Some(v) = self.get(h, eq) {
      return (v, false);
    }
    let val = make();
    debug_assert_ne!(val, EMPTY);
    self.raw.insert_new(TagSlot { tag: h, val });
    (val, true)
  }

  /// Removes the entry `(h, val)`; false if absent. Needs no `eq`: values are unique.
  #[inline]
  pub fn remove(&mut self, h: u32, val: u32) -> bool {
    match self.raw.find(h, |s| s.val == val) {
      Some((b, i)) => {
        self.raw.remove_at(b, i);
        true
      }
      None => false,
    }
  }

  pub fn len(&self) -> usize {
    self.raw.len
  }

  pub fn is_empty(&self) -> bool {
    self.raw.len == 0
  }

  /// Heap bytes held.
  pub fn bytes(&self) -> usize {
    self.raw.bytes()
  }
}

/// `n` values of `T`, not initialized, or zeroed (`zeroed`) by the allocator: fresh pages from
/// the system are zero already, so a big zeroed table is not written twice.
fn alloc_buckets<T>(n: usize, zeroed: bool) -> Vec<MaybeUninit<T>> {
  let layout = std::alloc::Layout::array::<T>(n).expect("table size");
  if layout.size() == 0 {
    return (0..n).map(|_| MaybeUninit::uninit()).collect();
  }
  // SAFETY: the layout has a non-zero size; the memory holds `n` `MaybeUninit<T>` (which need no
  // initializing), allocated by the global allocator with `T`'s layout, as `Vec` frees it.
  unsafe {
    let p = if zeroed {
      std::alloc::alloc_zeroed(layout)
    } else {
      std::alloc::alloc(layout)
    } as *mut MaybeUninit<T>;
    if p.is_null() {
      std::alloc::handle_alloc_error(layout);
    }
    Vec::from_raw_parts(p, n, n)
  }
}

/// Asks Linux to back a large allocation with transparent huge pages: probes of multi-megabyte
/// tables otherwise pay a TLB miss on top of the cache miss.
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
  use std::collections::HashMap;

  struct Rng(u64);
  impl Rng {
    fn next(&mut self) -> u64 {
      self.0 ^= self.0 << 13;
      self.0 ^= self.0 >> 7;
      self.0 ^= self.0 << 17;
      self.0
    }
  }

  /// `insert` of a plain map: the previous value, if any. A new key goes where the lookup that
  /// missed it said (`insert_vacant`).
  fn insert(m: &mut LocMap, key: u64, v: u64) -> Option<u64> {
    match m.get_or_vacant(key) {
      Ok(old) => {
        assert_eq!(m.remove(key), Some(old));
        m.insert_absent(key, v);
        Some(old)
      }
      Err(vacant) => {
        m.insert_vacant(vacant, key, v);
        None
      }
    }
  }

  #[test]
  fn a_vacant_insert_works_on_an_empty_map_and_on_one_drained_to_empty() {
    let mut m = LocMap::default();
    let v = m.get_or_vacant(5).unwrap_err();
    m.insert_vacant(v, 5, 9 << 32);
    assert_eq!(m.get_or_vacant(5).unwrap(), 9 << 32);
    assert_eq!(m.remove(5), Some(9 << 32));
    assert!(m.is_empty());
    let v = m.get_or_vacant(6).unwrap_err();
    m.insert_vacant(v, 6, 1);
    assert_eq!(m.get(6), Some(1));
    assert_eq!(m.get(5), None);
    m.raw.check();
  }

  #[test]
  fn loc_map_behaves_like_a_map_for_random_and_sequential_keys() {
    let mut m = LocMap::default();
    let mut reference = HashMap::new();
    let mut rng = Rng(0x1234_5678_9abc_def0);
    for i in 0..200_000u64 {
      let x = rng.next();
      let key = match i % 3 {
        0 => i,
        1 => x,
        _ => x % 1024, // dense collisions
      };
      let v = (i << 20) | (x & 0xfffff);
      assert_eq!(insert(&mut m, key, v), reference.insert(key, v));
      if i % 2 == 0 {
        let k = if i % 4 == 0 { key / 2 } else { x % 1024 };
        assert_eq!(m.remove(k), reference.remove(&k));
      }
      if i % 20_000 == 0 {
        m.raw.check();
      }
    }
    m.raw.check();
    assert_eq!(m.len(), reference.len());
    for (k, v) in &reference {
      assert_eq!(m.get(*k), Some(*v), "{k}");
    }
    assert_eq!(m.iter().count(), reference.len());
    assert_eq!(std::mem::size_of::<LocSlot>(), 16);
  }

  #[test]
  fn loc_map_grows_and_drains() {
    let mut m = LocMap::default();
    for k in 0..100_000u64 {
      match m.get_or_vacant(k * 7919) {
        Err(v) if k % 2 == 0 => m.insert_vacant(v, k * 7919, k << 32),
        Err(_) => m.insert_absent(k * 7919, k << 32),
        Ok(_) => panic!("{k} found before it was inserted"),
      }
      let load = m.len() as f64 / (m.raw.buckets.len() * 8) as f64;
      assert!(load <= 0.94, "{load}");
      assert!(m.len() < 1000 || load > 0.62, "{load}");
    }
    for k in 0..100_000u64 {
      assert_eq!(m.remove(k * 7919), Some(k << 32));
      assert_eq!(m.get(k * 7919), None);
    }
    assert!(m.is_empty());
    assert_eq!(m.iter().count(), 0);
  }

  #[test]
  fn a_growing_table_moves_a_few_buckets_an_insert_and_finds_removes_and_lists_the_rest() {
    let mut m = LocMap::default();
    let mut keys: Vec<u64> = Vec::new();
    let mut rng = Rng(0x7777_1234_aaaa_5555);
    let mut insert = |m: &mut LocMap, keys: &mut Vec<u64>| {
      let key = rng.next();
      let before = (m.raw.buckets.len(), m.raw.growing(), m.raw.moved);
      m.insert_absent(key, keys.len() as u64);
      keys.push(key);
      if m.raw.buckets.len() == before.0 && before.1 && m.raw.growing() {
        assert!(
          m.raw.moved <= before.2 + MOVE_BUCKETS,
          "one insert moves a few buckets"
        );
      }
    };
    // Into the first growth done step by step (the tenth or later), a third of the way through.
    let mut growths = 0;
    loop {
      let nb = m.raw.buckets.len();
      insert(&mut m, &mut keys);
      growths += usize::from(m.raw.buckets.len() != nb);
      if growths >= 10 && m.raw.growing() && m.raw.moved * 3 > m.raw.old.len() {
        break;
      }
    }
    assert!(
      m.raw.moved * 2 < m.raw.old.len(),
      "caught before half the old buckets moved"
    );
    m.raw.check();
    let unmoved: usize = m.raw.old_meta[m.raw.moved..]
      .iter()
      .map(|&meta| (meta & FILL) as usize)
      .sum();
    assert!(unmoved > 100, "entries still in the old buckets: {unmoved}");
    assert_eq!(m.iter().count(), keys.len());
    for (i, &k) in keys.iter().enumerate() {
      assert_eq!(m.get(k), Some(i as u64));
    }
    // Gone through place by place (a clear in pieces), mid-growth: every entry once.
    let mut by_place: Vec<u64> = (0..m.places())
      .step_by(3)
      .flat_map(|i| m.locs_at(i..(i + 3).min(m.places())).collect::<Vec<_>>())
      .collect();
    let mut all: Vec<u64> = m.iter().map(|(_, l)| l).collect();
    by_place.sort_unstable();
    all.sort_unstable();
    assert_eq!(by_place, all);
    assert_eq!(all.len(), keys.len());
    // Removals from old and new buckets alike, mid-growth.
    let removed = keys.len();
    for (i, &k) in keys.iter().enumerate().step_by(3) {
      assert_eq!(m.remove(k), Some(i as u64));
      assert_eq!(m.get(k), None);
    }
    assert!(m.raw.growing());
    m.raw.check();
    // Inserts finish the growth and free the old buckets; everything left is still there.
    while m.raw.growing() {
      insert(&mut m, &mut keys);
    }
    assert!(m.raw.old.is_empty() && m.raw.old_meta.is_empty());
    m.raw.check();
    for (i, &k) in keys.iter().enumerate() {
      let gone = i < removed && i % 3 == 0;
      assert_eq!(m.get(k), (!gone).then_some(i as u64), "key {i}");
    }
    assert_eq!(m.iter().count(), m.len());
  }

  #[test]
  fn a_bucket_overflowed_past_its_counter_still_finds_every_key() {
    // 40 keys sharing one first bucket: 32 live in their second buckets, more than the counter
    // holds (it sticks at 15). Every key stays findable while they are removed again.
    let mut m = LocMap::default();
    for k in 0..4096u64 {
      m.insert_absent(k, k);
    }
    let first = |m: &LocMap, k: u64| m.raw.pair(hash32(k)).0;
    let target = first(&m, 1 << 40);
    let crowd: Vec<u64> = ((1u64 << 40)..)
      .filter(|&k| first(&m, k) == target)
      .take(40)
      .collect();
    let buckets = m.raw.buckets.len();
    for &k in &crowd {
      m.insert_absent(k, 7);
    }
    assert_eq!(
      m.raw.buckets.len(),
      buckets,
      "no grow: the crowd stays in one first bucket"
    );
    assert_eq!(m.raw.meta[target] >> 4, 15);
    m.raw.check();
    for (i, &k) in crowd.iter().enumerate() {
      for &j in &crowd[i..] {
        assert_eq!(m.get(j), Some(7), "{j}");
      }
      assert_eq!(m.remove(k), Some(7));
      assert_eq!(m.get(k), None);
    }
    m.raw.check();
    for k in 0..4096u64 {
      assert_eq!(m.get(k), Some(k));
    }
  }

  /// Keys with forced tag collisions: `tag_of` keeps few distinct tags, so runs hold many
  /// entries with equal tags and `eq` must tell them apart.
  fn tag_map_against_hash_map(tag_of: impl Fn(u64) -> u32, ops: u64) {
    let mut m = TagMap::default();
    let mut keys: Vec<u64> = Vec::new(); // value -> key
    let mut free: Vec<u32> = Vec::new();
    let mut reference: HashMap<u64, u32> = HashMap::new();
    let mut rng = Rng(0x0bad_cafe_dead_beef);
    for i in 0..ops {
      let x = rng.next();
      let key = match i % 3 {
        0 => x % 4096,
        1 => x,
        _ => i,
      };
      let h = tag_of(key);
      if x % 5 < 3 {
        let next = free.last().copied().unwrap_or(keys.len() as u32);
        let (v, inserted) = m.get_or_insert_with(h, |v| keys[v as usize] == key, || next);
        assert_eq!(inserted, !reference.contains_key(&key));
        if inserted {
          assert_eq!(v, next);
          if free.pop().is_none() {
            keys.push(key);
          } else {
            keys[v as usize] = key;
          }
          reference.insert(key, v);
        } else {
          assert_eq!(Some(&v), reference.get(&key));
        }
      } else {
        let expect = reference.remove(&key);
        assert_eq!(m.get(h, |v| keys[v as usize] == key), expect);
        if let Some(v) = expect {
          assert!(m.remove(h, v));
          free.push(v);
        } else {
          assert!(!m.remove(h, u32::MAX - 1));
        }
      }
      assert_eq!(m.len(), reference.len());
      if i % 10_000 == 0 {
        m.raw.check();
      }
    }
    m.raw.check();
    for (&k, &v) in &reference {
      assert_eq!(m.get(tag_of(k), |w| keys[w as usize] == k), Some(v));
    }
    for (&k, &v) in &reference {
      assert!(m.remove(tag_of(k), v));
    }
    assert!(m.is_empty());
    assert_eq!(std::mem::size_of::<TagSlot>(), 8);
  }

  #[test]
  fn tag_map_behaves_like_a_map() {
    tag_map_against_hash_map(hash32, 200_000);
  }

  #[test]
  fn tag_map_tells_keys_with_equal_tags_apart() {
    tag_map_against_hash_map(|k| hash32(k % 61), 60_000);
    tag_map_against_hash_map(|k| (k % 3) as u32 * 0x5555_5555, 20_000);
  }
}
