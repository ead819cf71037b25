//! One event, borrowed: the view every encoder iterates. A view comes from a whole event
//! (`EventRef::of`) or from column data (`StoredView::of_columns`, `RemovedView::of_columns`):
//! the blocks are slices either way, and the other fields are read from the event, or from the
//! attributes a chunk's column events share (columns carry no more than hashes, parent, tokens,
//! block size, medium and LoRA).

use super::{CreatedEvent, HashBytes, KvEvent, RemovedEvent, StoredEvent, UpdatedEvent};
use crate::chunk::Attrs;
use crate::codec::value::Value;

/// Where a view's fields beyond its blocks come from.
#[derive(Debug)]
enum Source<'a, E> {
  /// What every column event of a chunk shares.
  Chunk(&'a Attrs),
  Event(&'a E),
}

// Not derived: a derive would ask `E: Copy`.
impl<E> Clone for Source<'_, E> {
  fn clone(&self) -> Self {
    *self
  }
}

impl<E> Copy for Source<'_, E> {}

/// One event, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum EventRef<'a> {
  Stored(StoredView<'a>),
  Removed(RemovedView<'a>),
  Cleared,
  /// TRT-LLM only: no effect on the index and no form in the published formats.
  Updated(&'a UpdatedEvent),
  /// TRT-LLM only: no effect on the index and no form in the published formats.
  Created(&'a CreatedEvent),
}

/// Events as the encoders take them: `EventRef`s from a slice (`refs.iter().copied()`), or
/// viewed from whole events as they are written (`events.iter().map(EventRef::of)`, no list of
/// views built first). Iterated twice: the published events are counted first.
pub trait EventRefs<'a>: Iterator<Item = EventRef<'a>> + Clone {}

impl<'a, I: Iterator<Item = EventRef<'a>> + Clone> EventRefs<'a> for I {}

/// A stored event, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct StoredView<'a> {
  pub block_hashes: &'a [u64],
  pub parent_block_hash: Option<u64>,
  pub token_ids: &'a [u32],
  source: Source<'a, StoredEvent>,
}

/// A removed event, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct RemovedView<'a> {
  pub block_hashes: &'a [u64],
  source: Source<'a, RemovedEvent>,
}

impl<'a> EventRef<'a> {
  /// A whole event, borrowed.
  pub fn of(e: &'a KvEvent) -> EventRef<'a> {
    match e {
      KvEvent::Stored(s) => EventRef::Stored(StoredView::of(s)),
      KvEvent::Removed(r) => EventRef::Removed(RemovedView::of(r)),
      KvEvent::Cleared => EventRef::Cleared,
      KvEvent::Updated(u) => EventRef::Updated(u),
      KvEvent::Created(c) => EventRef::Created(c),
    }
  }

  /// Whether the published formats (vLLM, SGLang, SMG) carry the event: `updated` and
  /// `created` have no form in them and are left out.
  pub fn is_published(&self) -> bool {
    !matches!(self, EventRef::Updated(_) | EventRef::Created(_))
  }

  /// The event as the normalized model has it.
  pub fn to_event(&self) -> KvEvent {
    match *self {
      EventRef::Stored(s) => KvEvent::Stored(s.to_event()),
      EventRef::Removed(r) => KvEvent::Removed(r.to_event()),
      EventRef::Cleared => KvEvent::Cleared,
      EventRef::Updated(u) => KvEvent::Updated(u.clone()),
      EventRef::Created(c) => KvEvent::Created(c.clone()),
    }
  }
}

/// A field of a view from a whole event; `None` for a column event.
macro_rules! event_field {
  ($self:ident, |$e:ident| $get:expr) => {
    match $self.source {
      Source::Chunk(_) => None,
      Source::Event($e) => $get,
    }
  };
}

impl<'a> StoredView<'a> {
  pub fn of(s: &'a StoredEvent) -> StoredView<'a> {
    StoredView {
      block_hashes: &s.block_hashes,
      parent_block_hash: s.parent_block_hash,
      token_ids: &s.token_ids,
      source: Source::Event(s),
    }
  }

  /// A column event: its blocks, and what its chunk's events share.
  pub fn of_columns(
    block_hashes: &'a [u64],
    parent_block_hash: Option<u64>,
    token_ids: &'a [u32],
    attrs: &'a Attrs,
  ) -> StoredView<'a> {
    StoredView {
      block_hashes,
      parent_block_hash,
      token_ids,
      source: Source::Chunk(attrs),
    }
  }

  /// The whole event this view borrows; `None` for a column event. An encoder can read a whole
  /// event's fields through `StoredFields` without a branch per field.
  #[inline]
  pub fn event(&self) -> Option<&'a StoredEvent> {
    match self.source {
      Source::Event(e) => Some(e),
      Source::Chunk(_) => None,
    }
  }

  /// The attributes the event shares with the other column events of its chunk (an encoder may
  /// prepare their bytes once per chunk); `None` for a whole event.
  #[inline]
  pub fn chunk_attrs(&self) -> Option<&'a Attrs> {
    match self.source {
      Source::Chunk(a) => Some(a),
      Source::Event(_) => None,
    }
  }

  pub fn to_event(&self) -> StoredEvent {
    match self.source {
      Source::Event(s) => s.clone(),
      Source::Chunk(a) => StoredEvent {
        block_hashes: self.block_hashes.to_vec(),
        parent_block_hash: self.parent_block_hash,
        token_ids: self.token_ids.to_vec(),
        block_size: a.block_size,
        lora_id: a.lora_id,
        lora_name: a.lora_name.clone(),
        medium: a.medium.clone(),
        group_idx: a.group_idx,
        extra_keys: a.nil_extra_keys.get(self.block_hashes.len()).cloned(),
        ..Default::default()
      },
    }
  }
}

impl<'a> RemovedView<'a> {
  pub fn of(r: &'a RemovedEvent) -> RemovedView<'a> {
    RemovedView {
      block_hashes: &r.block_hashes,
      source: Source::Event(r),
    }
  }

  /// A column event: its hashes, and what its chunk's events share (of which a removal keeps
  /// the medium).
  pub fn of_columns(block_hashes: &'a [u64], attrs: &'a Attrs) -> RemovedView<'a> {
    RemovedView {
      block_hashes,
      source: Source::Chunk(attrs),
    }
  }

  /// See [`StoredView::chunk_attrs`].
  #[inline]
  pub fn chunk_attrs(&self) -> Option<&'a Attrs> {
    match self.source {
      Source::Chunk(a) => Some(a),
      Source::Event(_) => None,
    }
  }

  #[inline]
  pub fn medium(&self) -> Option<&'a str> {
    match self.source {
      Source::Chunk(a) => a.medium.as_deref(),
      Source::Event(r) => r.medium.as_deref(),
    }
  }

  #[inline]
  pub fn group_idx(&self) -> Option<u32> {
    match self.source {
      Source::Chunk(a) => a.group_idx,
      Source::Event(r) => r.group_idx,
    }
  }

  #[inline]
  pub fn locality(&self) -> Option<&'a str> {
    event_field!(self, |r| r.locality.as_deref())
  }

  #[inline]
  pub fn ownership(&self) -> Option<&'a str> {
    event_field!(self, |r| r.ownership.as_deref())
  }

  /// Byte-string originals of `block_hashes` (see [`HashBytes`]).
  #[inline]
  pub fn hash_bytes(&self) -> Option<&'a Vec<Vec<u8>>> {
    event_field!(self, |r| r.hash_bytes.as_ref())
  }

  pub fn to_event(&self) -> RemovedEvent {
    match self.source {
      Source::Event(r) => r.clone(),
      Source::Chunk(a) => RemovedEvent {
        block_hashes: self.block_hashes.to_vec(),
        medium: a.medium.clone(),
        group_idx: a.group_idx,
        ..Default::default()
      },
    }
  }
}

/// A stored event's fields as an encoder reads them, from a whole event (direct reads) or from
/// a view (a branch per field on where the view's fields come from).
pub trait StoredFields<'a>: Copy {
  fn block_hashes(self) -> &'a [u64];
  fn parent_block_hash(self) -> Option<u64>;
  fn token_ids(self) -> &'a [u32];
  fn block_size(self) -> u32;
  fn lora_id(self) -> Option<i64>;
  fn lora_name(self) -> Option<&'a str>;
  fn medium(self) -> Option<&'a str>;
  fn group_idx(self) -> Option<u32>;
  fn cache_salt(self) -> Option<&'a str>;
  fn extra_keys(self) -> Option<&'a Value>;
  fn kv_cache_spec_kind(self) -> Option<&'a str>;
  fn kv_cache_spec_sliding_window(self) -> Option<i64>;
  fn locality(self) -> Option<&'a str>;
  fn ownership(self) -> Option<&'a str>;
  fn session_id(self) -> Option<&'a str>;
  fn lookahead_token_ids(self) -> Option<&'a Value>;
  fn hash_bytes(self) -> Option<&'a HashBytes>;
}

/// Implements `StoredFields` by reading each field with `$read` (`|s| expr`).
macro_rules! stored_fields {
  ($ty:ty, |$s:ident| { $($name:ident: $out:ty = $get:expr;)* }) => {
    impl<'a> StoredFields<'a> for $ty {
      $(
        #[inline]
        fn $name(self) -> $out {
          let $s = self;
          $get
        }
      )*
    }
  };
}

stored_fields!(&'a StoredEvent, |s| {
  block_hashes: &'a [u64] = &s.block_hashes;
  parent_block_hash: Option<u64> = s.parent_block_hash;
  token_ids: &'a [u32] = &s.token_ids;
  block_size: u32 = s.block_size;
  lora_id: Option<i64> = s.lora_id;
  lora_name: Option<&'a str> = s.lora_name.as_deref();
  medium: Option<&'a str> = s.medium.as_deref();
  group_idx: Option<u32> = s.group_idx;
  cache_salt: Option<&'a str> = s.cache_salt.as_deref();
  extra_keys: Option<&'a Value> = s.extra_keys.as_ref();
  kv_cache_spec_kind: Option<&'a str> = s.kv_cache_spec_kind.as_deref();
  kv_cache_spec_sliding_window: Option<i64> = s.kv_cache_spec_sliding_window;
  locality: Option<&'a str> = s.locality.as_deref();
  ownership: Option<&'a str> = s.ownership.as_deref();
  session_id: Option<&'a str> = s.session_id.as_deref();
  lookahead_token_ids: Option<&'a Value> = s.lookahead_token_ids.as_ref();
  hash_bytes: Option<&'a HashBytes> = s.hash_bytes.as_deref();
});

// A view reads what a column event has from its chunk's attributes; the rest only whole events have.
stored_fields!(StoredView<'a>, |s| {
  block_hashes: &'a [u64] = s.block_hashes;
  parent_block_hash: Option<u64> = s.parent_block_hash;
  token_ids: &'a [u32] = s.token_ids;
  block_size: u32 = match s.source {
    Source::Chunk(a) => a.block_size,
    Source::Event(e) => e.block_size,
  };
  lora_id: Option<i64> = match s.source {
    Source::Chunk(a) => a.lora_id,
    Source::Event(e) => e.lora_id,
  };
  lora_name: Option<&'a str> = match s.source {
    Source::Chunk(a) => a.lora_name.as_deref(),
    Source::Event(e) => e.lora_name.as_deref(),
  };
  medium: Option<&'a str> = match s.source {
    Source::Chunk(a) => a.medium.as_deref(),
    Source::Event(e) => e.medium.as_deref(),
  };
  group_idx: Option<u32> = match s.source {
    Source::Chunk(a) => a.group_idx,
    Source::Event(e) => e.group_idx,
  };
  cache_salt: Option<&'a str> = event_field!(s, |e| e.cache_salt.as_deref());
  extra_keys: Option<&'a Value> = match s.source {
    Source::Chunk(a) => a.nil_extra_keys.get(s.block_hashes.len()),
    Source::Event(e) => e.extra_keys.as_ref(),
  };
  kv_cache_spec_kind: Option<&'a str> = event_field!(s, |e| e.kv_cache_spec_kind.as_deref());
  kv_cache_spec_sliding_window: Option<i64> = event_field!(s, |e| e.kv_cache_spec_sliding_window);
  locality: Option<&'a str> = event_field!(s, |e| e.locality.as_deref());
  ownership: Option<&'a str> = event_field!(s, |e| e.ownership.as_deref());
  session_id: Option<&'a str> = event_field!(s, |e| e.session_id.as_deref());
  lookahead_token_ids: Option<&'a Value> = event_field!(s, |e| e.lookahead_token_ids.as_ref());
  hash_bytes: Option<&'a HashBytes> = event_field!(s, |e| e.hash_bytes.as_deref());
});
