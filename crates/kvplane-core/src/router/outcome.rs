//! Engine events counted by how they were applied, as Dynamo's indexer counts them
//! (`dynamo_kvrouter_kv_cache_events_applied{event_type, status}`): the device tier's events that
//! came from an engine's stream, not the router's own clears or recoveries.

use super::{RouterIndex, Tier};
use crate::event::KvEvent;
use crate::index::DropReason;

/// An engine event's kind (`event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
  Stored = 0,
  Removed = 1,
  Cleared = 2,
}

/// How an engine event was applied (`status`): the outcomes kvplane's index has (Dynamo's
/// others, such as `allocation_failed`, never happen here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
  Ok = 0,
  /// A stored event whose parent the worker does not hold (dropped).
  ParentBlockNotFound = 1,
  /// A removed event naming a block the worker does not hold.
  BlockNotFound = 2,
  /// A stored event whose tokens do not split into its blocks (the worker is cleared).
  InvalidBlock = 3,
}

impl EventKind {
  pub const ALL: [EventKind; 3] = [EventKind::Stored, EventKind::Removed, EventKind::Cleared];

  pub const fn name(self) -> &'static str {
    match self {
      EventKind::Stored => "stored",
      EventKind::Removed => "removed",
      EventKind::Cleared => "cleared",
    }
  }
}

impl Outcome {
  pub const ALL: [Outcome; 4] = [
    Outcome::Ok,
    Outcome::ParentBlockNotFound,
    Outcome::BlockNotFound,
    Outcome::InvalidBlock,
  ];

  pub const fn name(self) -> &'static str {
    match self {
      Outcome::Ok => "ok",
      Outcome::ParentBlockNotFound => "parent_block_not_found",
      Outcome::BlockNotFound => "block_not_found",
      Outcome::InvalidBlock => "invalid_block",
    }
  }
}

/// The drops that tell an event's outcome, as they stand: unknown parents and unknown removed
/// blocks in every tier, and events the router does not index. Taken before an event and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lost {
  unknown_parent: u64,
  unknown_removed: u64,
  not_indexed: u64,
}

/// Engine events applied, by kind and outcome.
#[derive(Debug, Default)]
pub(crate) struct Outcomes([[u64; Outcome::ALL.len()]; EventKind::ALL.len()]);

impl Outcomes {
  /// Counts event `ev`, applied (`failed`: refused for its layout) between `before` and `after`.
  /// One the router does not index (another medium, block size or owner: counted in its drops)
  /// is not counted, nor one of a lower tier (Dynamo's indexer applies those apart).
  fn count(&mut self, ev: &KvEvent, before: Lost, after: Lost, failed: bool) {
    if after.not_indexed > before.not_indexed {
      return;
    }
    let medium = match ev {
      KvEvent::Stored(s) => s.medium.as_deref(),
      KvEvent::Removed(r) => r.medium.as_deref(),
      _ => None,
    };
    if Tier::of_medium(medium) != Some(Tier::Device) {
      return;
    }
    let (kind, outcome) = match ev {
      KvEvent::Stored(_) if failed => (EventKind::Stored, Outcome::InvalidBlock),
      KvEvent::Stored(_) if after.unknown_parent > before.unknown_parent => {
        (EventKind::Stored, Outcome::ParentBlockNotFound)
      }
      KvEvent::Stored(_) => (EventKind::Stored, Outcome::Ok),
      KvEvent::Removed(_) if after.unknown_removed > before.unknown_removed => {
        (EventKind::Removed, Outcome::BlockNotFound)
      }
      KvEvent::Removed(_) => (EventKind::Removed, Outcome::Ok),
      KvEvent::Cleared => (EventKind::Cleared, Outcome::Ok),
      _ => return,
    };
    self.0[kind as usize][outcome as usize] += 1;
  }
}

impl RouterIndex {
  /// The drops as they stand (`Lost`).
  pub(crate) fn lost(&self) -> Lost {
    let sum = |r| self.tiers.iter().map(|t| t.dropped(r)).sum();
    Lost {
      unknown_parent: sum(DropReason::UnknownParent),
      unknown_removed: sum(DropReason::UnknownRemoved),
      not_indexed: self.drops.iter().sum(),
    }
  }

  /// Counts an engine event applied since the drops stood at `before`.
  pub(crate) fn count_outcome(&mut self, ev: &KvEvent, before: Lost, failed: bool) {
    let after = self.lost();
    self.outcomes.count(ev, before, after, failed);
  }

  /// Engine events of the device tier applied from payloads, by kind and outcome.
  pub fn outcomes(&self) -> Vec<(EventKind, Outcome, u64)> {
    EventKind::ALL
      .iter()
      .flat_map(|&k| {
        Outcome::ALL
          .iter()
          .map(move |&o| (k, o, self.outcomes.0[k as usize][o as usize]))
      })
      .collect()
  }
}
