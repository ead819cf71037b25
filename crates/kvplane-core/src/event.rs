//! The normalized event model (SPEC §2): every codec maps to and from these types.

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
}

/// Blocks removed by the engine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemovedEvent {
  pub block_hashes: Vec<u64>,
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
  Stored(StoredEvent),
  Removed(RemovedEvent),
  /// Every block of that worker is gone.
  Cleared,
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
}

impl EventKind {
  pub fn parse(name: &str) -> crate::KvResult<EventKind> {
    match name {
      "stored" => Ok(EventKind::Stored),
      "removed" => Ok(EventKind::Removed),
      "cleared" => Ok(EventKind::Cleared),
      other => Err(crate::KvError::invalid_arg(format!(
        "unknown event type {other:?}; expected stored, removed or cleared"
      ))),
    }
  }

  pub const fn name(self) -> &'static str {
    match self {
      EventKind::Stored => "stored",
      EventKind::Removed => "removed",
      EventKind::Cleared => "cleared",
    }
  }
}

impl KvEvent {
  pub fn kind(&self) -> EventKind {
    match self {
      KvEvent::Stored(_) => EventKind::Stored,
      KvEvent::Removed(_) => EventKind::Removed,
      KvEvent::Cleared => EventKind::Cleared,
    }
  }
}
