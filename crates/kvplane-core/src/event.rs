//! The normalized event model (docs/protocol.md#events): every codec maps to and from these types.

mod view;

pub use view::{EventRef, EventRefs, RemovedView, StoredFields, StoredView};

use crate::codec::value::Value;
use crate::error::{ErrorCode, KvError, KvResult};

/// Blocks stored by the engine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredEvent {
  /// The engine's block hashes (opaque ids), one per block.
  pub block_hashes: Vec<u64>,
  /// The engine hash of the block this chain continues from; `None` for a root.
  pub parent_block_hash: Option<u64>,
  /// The blocks' tokens: `block_hashes.len() * block_size` of them.
  pub token_ids: Vec<u32>,
  pub block_size: u32,
  pub lora_id: Option<i64>,
  pub lora_name: Option<String>,
  /// Storage tier (`GPU`, `CPU`, `DISK`, ...); unknown values are kept.
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
  pub cache_salt: Option<String>,
  /// vLLM's per-block extra keys, kept opaque for re-encoding.
  pub extra_keys: Option<Value>,
  pub kv_cache_spec_kind: Option<String>,
  pub kv_cache_spec_sliding_window: Option<i64>,
  /// `LOCAL` or `REMOTE` relative to the publisher.
  pub locality: Option<String>,
  /// Secondary offloading tier identifier.
  pub ownership: Option<String>,
  pub session_id: Option<String>,
  /// Tokens beyond each block used in its hash (opaque).
  pub lookahead_token_ids: Option<Value>,
  /// The hashes as the engine sent them when they were byte strings
  /// (docs/protocol.md#events).
  pub hash_bytes: Option<Box<HashBytes>>,
}

/// Byte-string block hashes (vLLM with int hashes off, TRT-LLM V2 hex): `block_hashes` holds
/// their last 8 bytes big-endian; these are the originals, for re-encoding.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HashBytes {
  pub blocks: Vec<Vec<u8>>,
  pub parent: Option<Vec<u8>>,
}

/// The u64 id of a byte-string hash: its last 8 bytes, big-endian (shorter ones zero-extended).
pub fn u64_of_hash_bytes(b: &[u8]) -> u64 {
  let tail = &b[b.len().saturating_sub(8)..];
  tail.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64)
}

impl StoredEvent {
  /// docs/protocol.md#fail-closed-layouts: the tokens must split into `block_size` x hashes.
  /// Null or masked blocks, partial blocks and hash-only placeholders cannot be indexed
  /// losslessly (`Err` says why).
  /// `allow_hash_only` accepts events without tokens (for indexes keyed by the engine's hash).
  pub fn check_layout(&self, allow_hash_only: bool) -> KvResult<()> {
    check_layout(
      self.block_hashes.len(),
      self.token_ids.len(),
      self.block_size,
      allow_hash_only,
    )
  }
}

/// Whether `tokens` tokens split into `blocks` blocks of `block_size` (a stored event's layout);
/// `allow_hash_only` also accepts no tokens at all. `Err(ERR_UNSUPPORTED_LAYOUT)` says why not.
pub fn check_layout(
  blocks: usize,
  tokens: usize,
  block_size: u32,
  allow_hash_only: bool,
) -> KvResult<()> {
  if allow_hash_only && tokens == 0 {
    return Ok(());
  }
  let bs = block_size as usize;
  let want = blocks.saturating_mul(bs);
  if bs != 0 && tokens == want {
    return Ok(());
  }
  let what = if tokens == 0 {
    "a hash-only placeholder"
  } else if bs == 0 {
    "no block size"
  } else if tokens > want {
    "null or masked blocks missing from the hashes"
  } else {
    "partial blocks"
  };
  Err(KvError::new(
    ErrorCode::UnsupportedLayout,
    format!(
      "Unsupported BlockStored layout: {tokens} tokens for {blocks} block hashes of block_size {block_size} ({what} cannot be indexed losslessly)"
    ),
  ))
}

/// Blocks removed by the engine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemovedEvent {
  pub block_hashes: Vec<u64>,
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
  pub locality: Option<String>,
  pub ownership: Option<String>,
  /// Byte-string originals of `block_hashes` (see [`HashBytes`]).
  pub hash_bytes: Option<Vec<Vec<u8>>>,
}

/// A change of one value (TRT-LLM `event_diff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diff {
  pub old: i64,
  pub new: i64,
}

/// TRT-LLM: a block moved between cache levels or changed priority.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdatedEvent {
  pub block_hash: u64,
  pub cache_level: Option<Diff>,
  pub priority: Option<Diff>,
}

/// TRT-LLM: the cache was created with these capacities.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreatedEvent {
  pub num_blocks_per_cache_level: Vec<u32>,
}

/// One KV-cache event.
// Stored events are most of any stream and carry heap data anyway; boxing them would add an
// allocation per event to save space only in removal-heavy batches.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
  Stored(StoredEvent),
  Removed(RemovedEvent),
  /// Every block of that worker is gone.
  Cleared,
  /// TRT-LLM only; no effect on the index and no proto form.
  Updated(UpdatedEvent),
  /// TRT-LLM only; no effect on the index and no proto form.
  Created(CreatedEvent),
}

/// A numbered batch of events from one worker (DP rank).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
  pub seq: u64,
  /// Unix seconds.
  pub ts: f64,
  pub dp_rank: Option<i32>,
  pub events: Vec<KvEvent>,
}

/// Most events one batch may hold.
pub const MAX_BATCH_EVENTS: usize = 1024;

/// Event kinds by their names in the TS API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
  Stored,
  Removed,
  Cleared,
  Updated,
  Created,
}

impl EventKind {
  pub fn parse(name: &str) -> crate::KvResult<EventKind> {
    match name {
      "stored" => Ok(EventKind::Stored),
      "removed" => Ok(EventKind::Removed),
      "cleared" => Ok(EventKind::Cleared),
      "updated" => Ok(EventKind::Updated),
      "created" => Ok(EventKind::Created),
      other => Err(crate::KvError::invalid_arg(format!(
        "unknown event type {other:?}; expected stored, removed, cleared, updated or created"
      ))),
    }
  }

  pub const fn name(self) -> &'static str {
    match self {
      EventKind::Stored => "stored",
      EventKind::Removed => "removed",
      EventKind::Cleared => "cleared",
      EventKind::Updated => "updated",
      EventKind::Created => "created",
    }
  }
}

impl KvEvent {
  pub fn kind(&self) -> EventKind {
    match self {
      KvEvent::Stored(_) => EventKind::Stored,
      KvEvent::Removed(_) => EventKind::Removed,
      KvEvent::Cleared => EventKind::Cleared,
      KvEvent::Updated(_) => EventKind::Updated,
      KvEvent::Created(_) => EventKind::Created,
    }
  }
}
