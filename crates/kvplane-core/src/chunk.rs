//! What the publish queue holds: events in owned columns, one chunk per publish call. Plain
//! stored / removed / cleared events stay columns all the way to the wire (the index applies
//! them and the encoder writes them from the slices); events with more fields travel whole.

use crate::codec::value::Value;
use crate::columns::{check_columns, Columns, KIND_CLEARED, KIND_REMOVED, KIND_STORED};
use crate::error::KvResult;
use crate::event::{EventRef, KvEvent, RemovedView, StoredView};

/// A whole event (the object path), in `EventChunk::events`.
const KIND_EVENT: u8 = 3;

/// What every column event of a chunk shares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attrs {
  pub block_size: u32,
  pub medium: Option<String>,
  pub lora_id: Option<i64>,
  pub lora_name: Option<String>,
  /// The KV cache group of every column event (an engine's decoded payload; host columns have
  /// none).
  pub group_idx: Option<u32>,
  /// Where the stored column events carry `extra_keys` with one nil per block (vLLM without
  /// extra keys): entry `k` is the list of `k` nils. Empty otherwise.
  pub nil_extra_keys: Vec<Value>,
}

impl Attrs {
  /// What the columns' events share.
  pub fn of(c: &Columns<'_>) -> Attrs {
    Attrs {
      block_size: c.block_size,
      medium: c.medium.map(str::to_owned),
      lora_id: c.lora_id,
      lora_name: c.lora_name.map(str::to_owned),
      group_idx: None,
      nil_extra_keys: Vec::new(),
    }
  }
}

/// Events in order, as owned columns plus whole events where columns cannot say it all.
#[derive(Debug, Clone, Default)]
pub struct EventChunk {
  kinds: Vec<u8>,
  hash_counts: Vec<u32>,
  /// Per event: the stored event's parent, where `has_parent` is 1.
  parents: Vec<u64>,
  has_parent: Vec<u8>,
  hashes: Vec<u64>,
  tokens: Vec<u32>,
  attrs: Attrs,
  events: Vec<KvEvent>,
}

impl EventChunk {
  /// Checked columns, copied (`ERR_INVALID_ARG` naming the first inconsistency).
  pub fn from_columns(c: &Columns<'_>) -> KvResult<EventChunk> {
    check_columns(c)?;
    Ok(EventChunk {
      kinds: c.kinds.to_vec(),
      hash_counts: c.hash_counts.to_vec(),
      parents: c.parents.to_vec(),
      has_parent: c.has_parent.to_vec(),
      hashes: c.hashes.to_vec(),
      tokens: c.tokens.to_vec(),
      attrs: Attrs::of(c),
      events: Vec::new(),
    })
  }

  /// Whole events.
  pub fn from_events(events: Vec<KvEvent>) -> EventChunk {
    EventChunk {
      kinds: vec![KIND_EVENT; events.len()],
      hash_counts: vec![0; events.len()],
      parents: vec![0; events.len()],
      has_parent: vec![0; events.len()],
      events,
      ..Default::default()
    }
  }

  pub fn len(&self) -> usize {
    self.kinds.len()
  }

  pub fn is_empty(&self) -> bool {
    self.kinds.is_empty()
  }

  /// The events in order.
  pub fn iter(&self) -> impl Iterator<Item = EventRef<'_>> + '_ {
    self.view().iter()
  }

  /// The chunk, borrowed.
  pub fn view(&self) -> ChunkView<'_> {
    ChunkView {
      kinds: &self.kinds,
      hash_counts: &self.hash_counts,
      parents: &self.parents,
      has_parent: &self.has_parent,
      hashes: &self.hashes,
      tokens: &self.tokens,
      attrs: &self.attrs,
      events: &self.events,
    }
  }

  /// Keeps the first `n` events.
  pub fn truncate(&mut self, n: usize) {
    if n >= self.len() {
      return;
    }
    let (h, t, e) = self.offsets(n);
    self.kinds.truncate(n);
    self.hash_counts.truncate(n);
    self.parents.truncate(n);
    self.has_parent.truncate(n);
    self.hashes.truncate(h);
    self.tokens.truncate(t);
    self.events.truncate(e);
  }

  /// Splits off the first `n` events (the rest stay).
  pub fn split_front(&mut self, n: usize) -> EventChunk {
    let (h, t, e) = self.offsets(n.min(self.len()));
    let n = n.min(self.len());
    EventChunk {
      kinds: self.kinds.drain(..n).collect(),
      hash_counts: self.hash_counts.drain(..n).collect(),
      parents: self.parents.drain(..n).collect(),
      has_parent: self.has_parent.drain(..n).collect(),
      hashes: self.hashes.drain(..h).collect(),
      tokens: self.tokens.drain(..t).collect(),
      attrs: self.attrs.clone(),
      events: self.events.drain(..e).collect(),
    }
  }

  /// Where event `n` starts in `hashes`, `tokens` and `events`.
  fn offsets(&self, n: usize) -> (usize, usize, usize) {
    let bs = self.attrs.block_size as usize;
    let (mut h, mut t, mut e) = (0, 0, 0);
    for i in 0..n {
      let count = self.hash_counts[i] as usize;
      h += count;
      match self.kinds[i] {
        KIND_STORED => t += count * bs,
        KIND_EVENT => e += 1,
        _ => {}
      }
    }
    (h, t, e)
  }
}

/// Builds a chunk one event at a time (a decoder's output): an event goes into the columns when
/// it says no more than they can and shares the chunk's attributes (its medium and cache group
/// with every column event's, its block size and LoRA with every stored one's), and is kept whole
/// otherwise. The attributes are those of the first column event that sets them.
#[derive(Debug, Default)]
pub struct ChunkBuilder {
  chunk: EventChunk,
  /// Whether a column event has set the medium and group, and a stored one the block size and
  /// LoRA.
  medium_set: bool,
  stored_set: bool,
  /// Whether the stored column events carry one nil extra key per block, and their most blocks.
  nil_extra_keys: bool,
  most_blocks: usize,
}

impl ChunkBuilder {
  pub fn with_capacity(events: usize) -> ChunkBuilder {
    let mut c = ChunkBuilder::default();
    c.chunk.kinds.reserve(events);
    c.chunk.hash_counts.reserve(events);
    c.chunk.parents.reserve(events);
    c.chunk.has_parent.reserve(events);
    c
  }

  /// Where the hash and token columns end: what an event read in part rolls back to.
  pub fn mark(&self) -> (usize, usize) {
    (self.chunk.hashes.len(), self.chunk.tokens.len())
  }

  pub fn rollback(&mut self, (h, t): (usize, usize)) {
    self.chunk.hashes.truncate(h);
    self.chunk.tokens.truncate(t);
  }

  /// The hash column, for the event being read to append to.
  pub fn hashes(&mut self) -> &mut Vec<u64> {
    &mut self.chunk.hashes
  }

  /// The token column, for the event being read to append to.
  pub fn tokens(&mut self) -> &mut Vec<u32> {
    &mut self.chunk.tokens
  }

  /// Whether a stored event with these attributes goes into the columns (the first one sets
  /// what the rest must share).
  /// `nil_extra_keys`: the event's `extra_keys` is one nil per block.
  pub fn fits_stored(
    &mut self,
    (block_size, nil_extra_keys): (u32, bool),
    (medium, group_idx): (Option<&str>, Option<u32>),
    lora_id: Option<i64>,
    lora_name: Option<&str>,
  ) -> bool {
    let a = &self.chunk.attrs;
    if (self.medium_set && (a.medium.as_deref() != medium || a.group_idx != group_idx))
      || (self.stored_set
        && (a.block_size != block_size
          || a.lora_id != lora_id
          || a.lora_name.as_deref() != lora_name
          || self.nil_extra_keys != nil_extra_keys))
    {
      return false;
    }
    let a = &mut self.chunk.attrs;
    if !self.medium_set {
      (a.medium, a.group_idx) = (medium.map(str::to_owned), group_idx);
      self.medium_set = true;
    }
    if !self.stored_set {
      (a.block_size, a.lora_id) = (block_size, lora_id);
      a.lora_name = lora_name.map(str::to_owned);
      self.nil_extra_keys = nil_extra_keys;
      self.stored_set = true;
    }
    true
  }

  /// Whether a removed event with this medium and cache group goes into the columns.
  pub fn fits_removed(&mut self, (medium, group_idx): (Option<&str>, Option<u32>)) -> bool {
    let a = &mut self.chunk.attrs;
    if self.medium_set {
      return a.medium.as_deref() == medium && a.group_idx == group_idx;
    }
    (a.medium, a.group_idx) = (medium.map(str::to_owned), group_idx);
    self.medium_set = true;
    true
  }

  /// A stored event whose `count` hashes and their tokens were appended since its mark.
  pub fn push_stored(&mut self, count: u32, parent: Option<u64>) {
    self.most_blocks = self.most_blocks.max(count as usize);
    self.push(KIND_STORED, count, parent);
  }

  /// A removed event whose `count` hashes were appended since its mark.
  pub fn push_removed(&mut self, count: u32) {
    self.push(KIND_REMOVED, count, None);
  }

  pub fn push_cleared(&mut self) {
    self.push(KIND_CLEARED, 0, None);
  }

  /// An event kept whole.
  pub fn push_event(&mut self, e: KvEvent) {
    self.push(KIND_EVENT, 0, None);
    self.chunk.events.push(e);
  }

  fn push(&mut self, kind: u8, count: u32, parent: Option<u64>) {
    let c = &mut self.chunk;
    c.kinds.push(kind);
    c.hash_counts.push(count);
    c.parents.push(parent.unwrap_or(0));
    c.has_parent.push(parent.is_some() as u8);
  }

  pub fn finish(mut self) -> EventChunk {
    if self.nil_extra_keys {
      self.chunk.attrs.nil_extra_keys = (0..=self.most_blocks)
        .map(|k| Value::Array(vec![Value::Nil; k]))
        .collect();
    }
    self.chunk
  }
}

/// Events in columns, borrowed: an `EventChunk`'s, or a host's columns applied where they lie.
#[derive(Debug, Clone, Copy)]
pub struct ChunkView<'a> {
  kinds: &'a [u8],
  hash_counts: &'a [u32],
  parents: &'a [u64],
  has_parent: &'a [u8],
  hashes: &'a [u64],
  tokens: &'a [u32],
  attrs: &'a Attrs,
  events: &'a [KvEvent],
}

impl<'a> ChunkView<'a> {
  /// Checked columns, borrowed, with `attrs` (`Attrs::of` the columns): `ERR_INVALID_ARG`
  /// naming the first inconsistency.
  pub fn of_columns(c: &Columns<'a>, attrs: &'a Attrs) -> KvResult<ChunkView<'a>> {
    check_columns(c)?;
    Ok(ChunkView {
      kinds: c.kinds,
      hash_counts: c.hash_counts,
      parents: c.parents,
      has_parent: c.has_parent,
      hashes: c.hashes,
      tokens: c.tokens,
      attrs,
      events: &[],
    })
  }

  pub fn len(&self) -> usize {
    self.kinds.len()
  }

  pub fn is_empty(&self) -> bool {
    self.kinds.is_empty()
  }

  /// The events in order.
  pub fn iter(self) -> impl Iterator<Item = EventRef<'a>> + 'a {
    let (mut h, mut t, mut e) = (0usize, 0usize, 0usize);
    let bs = self.attrs.block_size as usize;
    (0..self.len()).map(move |i| {
      let count = self.hash_counts[i] as usize;
      let hashes = &self.hashes[h..h + count];
      h += count;
      match self.kinds[i] {
        KIND_STORED => {
          let tokens = &self.tokens[t..t + count * bs];
          t += count * bs;
          EventRef::Stored(StoredView::of_columns(
            hashes,
            (self.has_parent[i] != 0).then_some(self.parents[i]),
            tokens,
            self.attrs,
          ))
        }
        KIND_REMOVED => EventRef::Removed(RemovedView::of_columns(hashes, self.attrs)),
        KIND_CLEARED => EventRef::Cleared,
        _ => {
          e += 1;
          EventRef::of(&self.events[e - 1])
        }
      }
    })
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn sample() -> EventChunk {
    EventChunk::from_columns(&Columns {
      kinds: &[2, 0, 1, 0],
      hash_counts: &[0, 2, 1, 1],
      hashes: &[1, 2, 3, 4],
      parents: &[0, 7, 0, 2],
      has_parent: &[0, 1, 0, 1],
      tokens: &[10, 11, 12, 13, 14, 15],
      block_size: 2,
      medium: Some("GPU"),
      lora_id: None,
      lora_name: None,
    })
    .unwrap()
  }

  fn hashes_of(c: &EventChunk) -> Vec<Vec<u64>> {
    c.iter()
      .map(|e| match e.to_event() {
        KvEvent::Stored(s) => s.block_hashes,
        KvEvent::Removed(r) => r.block_hashes,
        _ => vec![],
      })
      .collect()
  }

  #[test]
  fn yields_the_events_in_order() {
    let ev: Vec<KvEvent> = sample().iter().map(|e| e.to_event()).collect();
    assert_eq!(ev[0], KvEvent::Cleared);
    match &ev[1] {
      KvEvent::Stored(s) => {
        assert_eq!(s.block_hashes, vec![1, 2]);
        assert_eq!(s.parent_block_hash, Some(7));
        assert_eq!(s.token_ids, vec![10, 11, 12, 13]);
        assert_eq!(s.medium.as_deref(), Some("GPU"));
        assert_eq!(s.block_size, 2);
      }
      other => panic!("{other:?}"),
    }
    match &ev[2] {
      KvEvent::Removed(r) => assert_eq!(r.block_hashes, vec![3]),
      other => panic!("{other:?}"),
    }
    match &ev[3] {
      KvEvent::Stored(s) => assert_eq!(
        (s.parent_block_hash, &s.token_ids[..]),
        (Some(2), &[14, 15][..])
      ),
      other => panic!("{other:?}"),
    }
  }

  #[test]
  fn splits_and_truncates_at_event_boundaries() {
    let mut c = sample();
    let front = c.split_front(2);
    assert_eq!(hashes_of(&front), vec![vec![], vec![1, 2]]);
    assert_eq!(hashes_of(&c), vec![vec![3], vec![4]]);
    let mut c = sample();
    c.truncate(3);
    assert_eq!(hashes_of(&c), vec![vec![], vec![1, 2], vec![3]]);
    let mut objs = EventChunk::from_events(vec![
      KvEvent::Cleared,
      sample().iter().nth(2).unwrap().to_event(),
    ]);
    let first = objs.split_front(1);
    assert!(matches!(first.iter().next(), Some(EventRef::Cleared)));
    assert_eq!(hashes_of(&objs), vec![vec![3]]);
  }
}
