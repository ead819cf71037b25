//! Edges: chains of blocks stored together (docs/architecture.md#index-layout).
//!
//! An edge holds the keys of consecutive blocks of one chain side by side, each block the
//! parent of the next. An edge hangs from a block of another edge (any block, not only the
//! last), or is a root. Which workers hold its blocks is kept as spans: from a span's start up
//! to the next span, every block has the same holders. So a block costs its key where it is
//! stored, and a worker joining or leaving a run of blocks changes a span or two.

/// No edge.
pub(super) const NONE: u32 = u32::MAX;
/// `parent` of an edge on the free list.
pub(super) const FREED: u32 = u32::MAX - 1;

/// Blocks `start..` (up to the next span) and the worker slots holding each of them, sorted;
/// and `left`, the previous span's holders that are not holders here, sorted (empty for the
/// first): a walk down the edge that matched the previous span loses exactly these. Both lists
/// share one allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Span {
  pub start: u32,
  /// How many of `words` are holders; the rest is `left`.
  held: u32,
  words: Box<[u32]>,
}

impl Span {
  fn new(start: u32, holders: &[u32], left: &[u32]) -> Span {
    let mut words = Vec::with_capacity(holders.len() + left.len());
    words.extend_from_slice(holders);
    words.extend_from_slice(left);
    Span {
      start,
      held: holders.len() as u32,
      words: words.into_boxed_slice(),
    }
  }

  #[inline(always)]
  pub fn holders(&self) -> &[u32] {
    &self.words[..self.held as usize]
  }

  #[inline(always)]
  pub fn left(&self) -> &[u32] {
    &self.words[self.held as usize..]
  }

  /// New holders, `left` kept (the caller relinks).
  fn set_holders(&mut self, holders: &[u32]) {
    *self = Span::new(self.start, holders, self.left());
  }

  /// Heap bytes.
  fn bytes(&self) -> usize {
    self.words.len() * 4
  }
}

#[derive(Debug)]
pub(super) struct Edge {
  /// The blocks' keys, root side first.
  pub keys: Vec<u64>,
  /// Holders along the edge; `spans[0].start == 0` while the edge has keys.
  pub spans: Vec<Span>,
  /// Edges hanging from this one's blocks: (the block's offset, the edge), sorted (a prompt
  /// many conversations hang from can have thousands).
  pub kids: Vec<(u32, u32)>,
  /// Per block, when tokens are retained.
  pub tokens: Vec<Box<[u32]>>,
  /// Per block, when content hashes are retained: the block's own (unchained) content hash,
  /// which its key chains onto its parent's.
  pub contents: Vec<u64>,
  /// The edge this one hangs from (`NONE` for a root, `FREED` on the free list).
  pub parent: u32,
  /// The block of `parent` it hangs from.
  pub parent_off: u32,
}

/// A block's location: edge id in the high half, offset in the low half.
#[inline(always)]
pub(super) fn loc(edge: u32, off: u32) -> u64 {
  ((edge as u64) << 32) | off as u64
}

#[inline(always)]
pub(super) fn unloc(l: u64) -> (u32, u32) {
  ((l >> 32) as u32, l as u32)
}

impl Edge {
  pub fn new(parent: u32, parent_off: u32) -> Edge {
    Edge {
      keys: Vec::new(),
      spans: Vec::new(),
      kids: Vec::new(),
      tokens: Vec::new(),
      contents: Vec::new(),
      parent,
      parent_off,
    }
  }

  pub fn len(&self) -> usize {
    self.keys.len()
  }

  /// The span holding block `i`.
  #[inline]
  pub fn span_at(&self, i: u32) -> usize {
    self.spans.partition_point(|s| s.start <= i) - 1
  }

  #[inline]
  pub fn holders_at(&self, i: u32) -> &[u32] {
    self.spans[self.span_at(i)].holders()
  }

  #[inline]
  pub fn holds(&self, i: u32, slot: u32) -> bool {
    self.holders_at(i).binary_search(&slot).is_ok()
  }

  /// Whether `slot` holds block `i`, with the blocks `lo..hi` around it for which the answer is
  /// the same (its span).
  #[inline]
  pub fn holds_run(&self, i: u32, slot: u32) -> (bool, u32, u32) {
    let si = self.span_at(i);
    let span = &self.spans[si];
    let held = span.holders().binary_search(&slot).is_ok();
    (held, span.start, self.span_end(si) as u32)
  }

  /// Where the span after `si` starts (the edge's end for the last).
  #[inline]
  pub fn span_end(&self, si: usize) -> usize {
    self
      .spans
      .get(si + 1)
      .map_or(self.keys.len(), |s| s.start as usize)
  }

  /// Appends a block held by `slot` alone.
  pub fn push(&mut self, key: u64, tokens: Option<&[u32]>, content: Option<u64>, slot: u32) {
    let i = self.keys.len() as u32;
    self.keys.push(key);
    if let Some(t) = tokens {
      self.tokens.push(t.into());
    }
    if let Some(c) = content {
      self.contents.push(c);
    }
    if self.spans.last().is_none_or(|s| s.holders() != [slot]) {
      self.spans.push(Span::new(i, &[slot], &[]));
      self.relink(self.spans.len() - 1, self.spans.len() - 1);
    }
  }

  /// Makes a span start at `i` (`i < len`); returns its index.
  fn split(&mut self, i: u32) -> usize {
    let si = self.span_at(i);
    if self.spans[si].start == i {
      return si;
    }
    // The same holders as the span before: nothing left.
    let span = Span::new(i, self.spans[si].holders(), &[]);
    self.spans.insert(si + 1, span);
    si + 1
  }

  /// Whether every span's `left` is what it says (debug checks).
  fn left_ok(&self) -> bool {
    (0..self.spans.len()).all(|k| {
      k == 0 && self.spans[0].left().is_empty()
        || k > 0
          && minus(self.spans[k - 1].holders(), self.spans[k].holders())
            .eq(self.spans[k].left().iter().copied())
    })
  }

  /// Recomputes `left` of spans `lo..=hi` (those past the end are skipped), rebuilding only
  /// the spans whose `left` changed.
  fn relink(&mut self, lo: usize, hi: usize) {
    for k in lo..=hi.min(self.spans.len().saturating_sub(1)) {
      let span = &self.spans[k];
      let prev: &[u32] = if k == 0 {
        &[]
      } else {
        self.spans[k - 1].holders()
      };
      if !minus(prev, span.holders()).eq(span.left().iter().copied()) {
        let left: Vec<u32> = minus(prev, span.holders()).collect();
        self.spans[k] = Span::new(span.start, span.holders(), &left);
      }
    }
  }

  /// Joins spans `lo..=hi` with equal neighbours (a span equal to the one before has no `left`,
  /// and the next one's `left` is the same against either).
  fn merge(&mut self, lo: usize, hi: usize) {
    let hi = hi.min(self.spans.len() - 1);
    for k in (lo.max(1)..=hi).rev() {
      if self.spans[k].holders() == self.spans[k - 1].holders() {
        self.spans.remove(k);
      }
    }
  }

  /// Adds `slot` to blocks `a..b`, none of which it holds.
  pub fn add(&mut self, a: u32, b: u32, slot: u32) {
    debug_assert!(a < b && b as usize <= self.keys.len());
    let sa = self.split(a);
    let sb = if (b as usize) < self.keys.len() {
      self.split(b)
    } else {
      self.spans.len()
    };
    for s in &mut self.spans[sa..sb] {
      s.set_holders(&with(s.holders(), slot));
    }
    self.relink(sa, sb);
    self.merge(sa, sb);
    debug_assert!(self.left_ok());
  }

  /// Takes `slot` out of block `i`; false if it did not hold it.
  pub fn remove(&mut self, i: u32, slot: u32) -> bool {
    let si = self.span_at(i);
    if self.spans[si].holders().binary_search(&slot).is_err() {
      return false;
    }
    let (start, end) = (self.spans[si].start, self.span_end(si));
    if start == i
      && si > 0
      && is_without(self.spans[si - 1].holders(), self.spans[si].holders(), slot)
    {
      // Block i now has the previous span's holders: it joins that span (an engine evicting a
      // chain root side first, block after block), nothing rebuilt.
      if (i as usize) + 1 < end {
        self.spans[si].start += 1;
      } else {
        self.spans.remove(si);
        self.relink(si, si);
        self.merge(si, si);
      }
      debug_assert!(self.left_ok());
      return true;
    }
    // Block i gets the span's holders without `slot`; the blocks after it in the span keep them.
    let less = without(self.spans[si].holders(), slot);
    let at = if start == i {
      if (i as usize) + 1 < end {
        // The blocks after i keep the old holders, a superset of block i's: nothing left.
        let old = Span::new(i + 1, self.spans[si].holders(), &[]);
        self.spans.insert(si + 1, old);
      }
      self.spans[si].set_holders(&less);
      si
    } else {
      self.spans.insert(si + 1, Span::new(i, &less, &[]));
      if (i as usize) + 1 < end {
        let old = Span::new(i + 1, self.spans[si].holders(), &[]);
        self.spans.insert(si + 2, old);
      }
      si + 1
    };
    self.relink(at, at + 1);
    self.merge(at, at + 1);
    debug_assert!(self.left_ok());
    true
  }

  /// Drops the last block when `slot` alone holds it: what an engine evicting from the tail
  /// does, without building a span for the empty block. False (nothing changed) otherwise.
  pub fn pop_sole(&mut self, slot: u32) -> bool {
    let Some(last) = self.spans.last() else {
      return false;
    };
    let i = self.keys.len() as u32 - 1;
    if last.holders() != [slot] || self.hung_at(i) {
      return false;
    }
    self.keys.pop();
    self.tokens.truncate(self.keys.len());
    self.contents.truncate(self.keys.len());
    if last.start == i {
      self.spans.pop();
    }
    true
  }

  /// Empties the edge for reuse, keeping small allocations.
  pub fn reset(&mut self, parent: u32, parent_off: u32) {
    const KEEP: usize = 64;
    if self.keys.capacity() > KEEP {
      self.keys = Vec::new();
    }
    if self.spans.capacity() > 4 {
      self.spans = Vec::new();
    }
    self.keys.clear();
    self.spans.clear();
    self.kids = Vec::new();
    self.tokens = Vec::new();
    self.contents = Vec::new();
    (self.parent, self.parent_off) = (parent, parent_off);
  }

  /// Takes `slot` out of every block; how many it held.
  pub fn remove_all(&mut self, slot: u32) -> usize {
    let mut held = 0;
    for si in 0..self.spans.len() {
      if self.spans[si].holders().binary_search(&slot).is_ok() {
        held += self.span_end(si) - self.spans[si].start as usize;
        let s = &mut self.spans[si];
        s.set_holders(&without(s.holders(), slot));
      }
    }
    let n = self.spans.len();
    if n > 0 {
      self.relink(0, n - 1);
      self.merge(1, n - 1);
    }
    debug_assert!(self.left_ok());
    held
  }

  /// Where the blocks no worker holds and nothing hangs from begin at the edge's end: the
  /// length it can be cut to.
  pub fn kept_len(&self) -> usize {
    let Some(last) = self.spans.last() else {
      return 0;
    };
    if !last.holders().is_empty() {
      return self.keys.len();
    }
    let hung = self.kids.last().map_or(0, |&(off, _)| off as usize + 1);
    (last.start as usize).max(hung)
  }

  /// Whether an edge hangs from block `off`.
  #[inline]
  pub fn hung_at(&self, off: u32) -> bool {
    let i = self.kids.partition_point(|&(o, _)| o < off);
    self.kids.get(i).is_some_and(|&(o, _)| o == off)
  }

  pub fn add_kid(&mut self, off: u32, kid: u32) {
    let i = self.kids.partition_point(|&k| k < (off, kid));
    self.kids.insert(i, (off, kid));
  }

  pub fn remove_kid(&mut self, off: u32, kid: u32) {
    if let Ok(i) = self.kids.binary_search(&(off, kid)) {
      self.kids.remove(i);
    }
  }

  /// Cuts the edge to `len` blocks.
  pub fn truncate(&mut self, len: usize) {
    self.keys.truncate(len);
    self.tokens.truncate(len);
    self.contents.truncate(len);
    let keep = self.spans.partition_point(|s| (s.start as usize) < len);
    self.spans.truncate(keep);
  }

  pub fn bytes(&self) -> usize {
    self.keys.capacity() * 8
      + self.spans.capacity() * std::mem::size_of::<Span>()
      + self.spans.iter().map(Span::bytes).sum::<usize>()
      + self.kids.capacity() * 8
      + self.tokens.capacity() * std::mem::size_of::<Box<[u32]>>()
      + self.contents.capacity() * 8
  }
}

/// `set` (sorted) with `slot` added.
fn with(set: &[u32], slot: u32) -> Vec<u32> {
  let at = set.partition_point(|&s| s < slot);
  let mut v = Vec::with_capacity(set.len() + 1);
  v.extend_from_slice(&set[..at]);
  v.push(slot);
  v.extend_from_slice(&set[at..]);
  v
}

/// Whether `less` is `set` without `slot` (both sorted, `slot` in `set`).
fn is_without(less: &[u32], set: &[u32], slot: u32) -> bool {
  less.len() + 1 == set.len() && set.iter().filter(|&&s| s != slot).eq(less.iter())
}

/// `a` without the members of `b` (both sorted), in order.
fn minus<'a>(a: &'a [u32], b: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
  let mut j = 0;
  a.iter().copied().filter(move |&x| {
    while j < b.len() && b[j] < x {
      j += 1;
    }
    j == b.len() || b[j] != x
  })
}

/// `set` (sorted) without `slot`.
fn without(set: &[u32], slot: u32) -> Vec<u32> {
  set.iter().copied().filter(|&s| s != slot).collect()
}

#[cfg(test)]
mod tests {
  use super::*;

  /// Every span's `left` is what it says.
  fn check_left(e: &Edge) {
    for k in 0..e.spans.len() {
      let want: Vec<u32> = if k == 0 {
        vec![]
      } else {
        e.spans[k - 1]
          .holders()
          .iter()
          .copied()
          .filter(|h| !e.spans[k].holders().contains(h))
          .collect()
      };
      assert_eq!(e.spans[k].left(), &want[..], "span {k}");
    }
  }

  fn holders(e: &Edge) -> Vec<Vec<u32>> {
    check_left(e);
    (0..e.len() as u32)
      .map(|i| e.holders_at(i).to_vec())
      .collect()
  }

  #[test]
  fn spans_follow_joins_and_leaves_and_stay_merged() {
    let mut e = Edge::new(NONE, 0);
    for k in 0..6 {
      e.push(k, None, None, 1);
    }
    assert_eq!(e.spans.len(), 1);
    e.add(0, 3, 2);
    e.add(2, 5, 3);
    assert_eq!(
      holders(&e),
      vec![
        vec![1, 2],
        vec![1, 2],
        vec![1, 2, 3],
        vec![1, 3],
        vec![1, 3],
        vec![1]
      ]
    );
    assert_eq!(e.spans.len(), 4);
    assert!(e.remove(2, 3));
    assert!(!e.remove(2, 3));
    assert_eq!(e.spans.len(), 3);
    assert!(e.remove(2, 2));
    assert_eq!(holders(&e)[..3], [vec![1, 2], vec![1, 2], vec![1]]);
    e.remove_all(1);
    e.remove_all(3);
    e.remove_all(2);
    assert_eq!(e.spans.len(), 1);
    assert_eq!(e.kept_len(), 0);
  }

  #[test]
  fn blocks_removed_root_side_first_join_the_span_before() {
    let mut e = Edge::new(NONE, 0);
    for k in 0..5 {
      e.push(k, None, None, 4);
    }
    e.add(0, 5, 2);
    e.add(0, 2, 9);
    // Holders: [2, 4, 9] x2, [2, 4] x3. Worker 4 leaves root side first.
    for i in 0..5 {
      assert!(e.remove(i, 4));
      let want: Vec<Vec<u32>> = (0..5)
        .map(|b| {
          let mut h = vec![2];
          if b > i {
            h.push(4);
          }
          if b < 2 {
            h.push(9);
          }
          h
        })
        .collect();
      assert_eq!(holders(&e), want, "after removing block {i}");
    }
    assert_eq!(e.spans.len(), 2);
    assert!(!e.remove(4, 4));
  }

  #[test]
  fn appended_blocks_join_their_holders_run() {
    let mut e = Edge::new(NONE, 0);
    for k in 1..100 {
      e.push(k, None, None, 7);
    }
    assert_eq!(e.spans.len(), 1);
    e.remove(98, 7);
    assert_eq!(e.kept_len(), 98);
    e.truncate(98);
    e.push(99, None, None, 8);
    e.push(100, None, None, 8);
    assert_eq!(e.spans.len(), 2);
    e.remove(99, 8);
    assert_eq!(e.kept_len(), 99);
    e.truncate(99);
    assert_eq!((e.len(), e.spans.len()), (99, 2));
  }

  #[test]
  fn kids_stay_sorted_and_keep_the_blocks_they_hang_from() {
    let mut e = Edge::new(NONE, 0);
    for k in 0..10 {
      e.push(k, None, None, 1);
    }
    for (off, kid) in [(7, 3), (2, 9), (7, 1), (4, 4)] {
      e.add_kid(off, kid);
    }
    assert_eq!(e.kids, vec![(2, 9), (4, 4), (7, 1), (7, 3)]);
    assert!(e.hung_at(7) && e.hung_at(2) && !e.hung_at(3) && !e.hung_at(9));
    e.remove_all(1);
    assert_eq!(e.kept_len(), 8);
    e.remove_kid(7, 1);
    e.remove_kid(7, 3);
    assert_eq!(e.kept_len(), 5);
    e.remove_kid(7, 3);
    assert_eq!(e.kids, vec![(2, 9), (4, 4)]);
  }
}
