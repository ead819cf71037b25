//! The router's index (docs/architecture.md#router-side): the workers of many engine nodes in one
//! index per storage tier, fed their nodes' encoded batches and recovery answers, and asked which
//! workers hold the longest prefix of a request.
//!
//! Blocks are keyed by the chained `xxh3` content hash of their tokens, under the namespace
//! (LoRA, cache salt) the event names ([`namespace`]); a block stored without a salt inherits its
//! parent's, since engines name the salt on a chain's first block only. A lower tier's block whose
//! parent is held in another tier chains from that block's key, so device, host and disk blocks
//! of one sequence share one key space.

mod namespace;
mod outcome;
mod query;
mod restore;
mod tier;

pub use namespace::{lora_part, salt_part, seed, SALT_KEY_PREFIX};
pub use outcome::{EventKind, Outcome};
pub use query::{QueryAnswer, WorkerScore};
pub use restore::Restored;
pub use tier::Tier;

pub(crate) use outcome::Lost;
use outcome::Outcomes;

use crate::codec::{self, recover, Dialect};
use crate::error::{KvError, KvResult};
use crate::event::{KvEvent, RemovedEvent, StoredEvent};
use crate::index::{
  Index, IndexConfig, IndexStats, Piecewise, StoredBlocks, WorkerDump, WorkerKey,
};
use crate::shared::{ApplyPiece, Shared, Turn, PIECE_BLOCKS};
use crate::stream::Recovery;
use std::collections::HashMap;

/// Why a router dropped an event (beyond the index's own reasons). Every drop is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouterDrop {
  /// A stored event whose `block_size` is not the index's.
  BlockSize,
  /// A medium with no tier.
  Medium,
  /// Not this worker's own main-attention cache: `locality` other than `LOCAL`, an `ownership`,
  /// or a `group_idx` other than 0.
  NotLocalMain,
}

impl RouterDrop {
  pub const ALL: [RouterDrop; 3] = [
    RouterDrop::BlockSize,
    RouterDrop::Medium,
    RouterDrop::NotLocalMain,
  ];

  pub const fn name(self) -> &'static str {
    match self {
      RouterDrop::BlockSize => "block_size",
      RouterDrop::Medium => "medium",
      RouterDrop::NotLocalMain => "not_local_main",
    }
  }
}

/// What applying a payload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
  /// The payload's batch seq (0 for ZMQ payloads: their seq travels in its own frame).
  pub seq: u64,
  pub events: u32,
  /// Events of kinds the decoder does not know, skipped.
  pub unknown_events: u32,
  /// Stored events that failed the layout check: their worker was cleared.
  pub layout_errors: u32,
  /// An SMG snapshot chunk: the chunks of its snapshot still to come (0 otherwise). A stream lost
  /// before they came leaves a partial state that no later seq completes.
  pub snapshot_rest: u64,
}

/// A numbered payload against the seq expected next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbered {
  /// It was the one expected (or the first): applied.
  Applied(Applied),
  /// Older than expected: already applied, skipped.
  Duplicate(u64),
  /// Newer than expected: batches are missing; not applied.
  Gap(u64),
}

/// What applying a recovery answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryApplied {
  pub kind: &'static str,
  pub last_seq: u64,
  pub epoch: u64,
  /// For a bounded `Events` answer, the seq to ask for next.
  pub next_start: Option<u64>,
  pub events: u32,
}

/// One dumped segment of a worker's blocks in one tier.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpSegment {
  pub tier: Tier,
  pub worker: WorkerKey,
  pub parent: Option<u64>,
  pub block_hashes: Vec<u64>,
  /// Each block's own content hash (Dynamo's `tokens_hash`), which its key chains onto its
  /// parent's: when the index keeps them (`RouterIndex::with_content_hashes`), else empty.
  pub content_hashes: Vec<u64>,
  /// Each block's key (empty in a dump read from Dynamo's indexer, which has none).
  pub keys: Vec<u64>,
}

pub struct RouterIndex {
  block_size: u32,
  tiers: [Index; 3],
  /// Salt parts of blocks stored under a cache salt, by worker and engine hash, so children stored
  /// without it inherit it (empty when no salts are used).
  salts: HashMap<(WorkerKey, u64), u64>,
  drops: [u64; 3],
  /// Engine events applied from payloads, by kind and outcome (`outcomes`).
  outcomes: Outcomes,
}

impl RouterIndex {
  pub fn new(block_size: u32) -> KvResult<RouterIndex> {
    RouterIndex::with_content_hashes(block_size, false)
  }

  /// `new`, keeping each block's own content hash when `keep` (8 bytes a block): what a dump
  /// needs for Dynamo's `tokens_hash`.
  pub fn with_content_hashes(block_size: u32, keep: bool) -> KvResult<RouterIndex> {
    if block_size == 0 || block_size as usize > crate::hash::MAX_BLOCK_SIZE {
      return Err(KvError::invalid_arg(format!(
        "blockSize is {block_size}: an integer in 1..={}",
        crate::hash::MAX_BLOCK_SIZE
      )));
    }
    let cfg = IndexConfig {
      retain_tokens: false,
      retain_contents: keep,
      dump_keys: true,
      ..IndexConfig::default()
    };
    Ok(RouterIndex {
      block_size,
      tiers: [Index::new(cfg), Index::new(cfg), Index::new(cfg)],
      salts: HashMap::new(),
      drops: [0; 3],
      outcomes: Outcomes::default(),
    })
  }

  pub fn block_size(&self) -> u32 {
    self.block_size
  }

  pub fn tier(&self, t: Tier) -> &Index {
    &self.tiers[t as usize]
  }

  fn drop_event(&mut self, why: RouterDrop) {
    self.drops[why as usize] += 1;
  }

  /// Decodes a payload of `dialect` and applies its batches to worker `worker_id`, each under its
  /// own DP rank or `rank` when it names none. Nothing is applied if the bytes do not decode.
  pub fn apply_payload(
    &mut self,
    worker_id: u64,
    rank: u32,
    bytes: &[u8],
    dialect: Dialect,
  ) -> KvResult<Applied> {
    let decoded = codec::decode(bytes, dialect)?;
    Ok(self.apply_decoded(worker_id, rank, decoded))
  }

  fn apply_decoded(&mut self, worker_id: u64, rank: u32, decoded: codec::Decoded) -> Applied {
    apply_each(decoded, worker_id, rank, |w, ev| {
      let before = self.lost();
      let r = self.apply(w, ev);
      self.count_outcome(ev, before, r.is_err());
      r
    })
  }

  /// Applies one event of worker `w`; `Err` only for a layout the index cannot hold (the worker
  /// was cleared, as the index does).
  pub fn apply(&mut self, w: WorkerKey, ev: &KvEvent) -> KvResult<()> {
    match ev {
      KvEvent::Stored(s) => self.store(w, s),
      KvEvent::Removed(r) => {
        if let Some(tier) = self.removal_tier(r) {
          self.tiers[tier].remove_blocks(w, &r.block_hashes);
          self.forget_salts(w, &r.block_hashes);
        }
        Ok(())
      }
      KvEvent::Cleared => {
        self.clear(w);
        Ok(())
      }
      KvEvent::Updated(_) | KvEvent::Created(_) => Ok(()),
    }
  }

  fn store(&mut self, w: WorkerKey, s: &StoredEvent) -> KvResult<()> {
    let Some(r) = self.route(w, s) else {
      return Ok(());
    };
    let (here, elsewhere) = split_tier(&mut self.tiers, r.tier, w);
    here.store_chained(w, StoredBlocks::of(s), r.seed, elsewhere)?;
    self.note_salt(w, s, r.salt);
    Ok(())
  }

  /// Where a stored event's blocks go (tier) and how they are keyed (seed, salt); `None` when
  /// the event is not indexed here (counted).
  fn route(&mut self, w: WorkerKey, s: &StoredEvent) -> Option<Routed> {
    let remote = s.locality.as_deref().is_some_and(|l| l != "LOCAL");
    if remote || s.ownership.is_some() || s.group_idx.is_some_and(|g| g != 0) {
      self.drop_event(RouterDrop::NotLocalMain);
      return None;
    }
    let Some(tier) = Tier::of_medium(s.medium.as_deref()) else {
      self.drop_event(RouterDrop::Medium);
      return None;
    };
    if s.block_size != self.block_size {
      self.drop_event(RouterDrop::BlockSize);
      return None;
    }
    let own_salt = namespace::salt_part(namespace::event_salt(s));
    let salt = match (own_salt, s.parent_block_hash) {
      (0, Some(p)) if !self.salts.is_empty() => self.salts.get(&(w, p)).copied().unwrap_or(0),
      _ => own_salt,
    };
    let seed = namespace::seed(namespace::lora_part(s.lora_name.as_deref()), salt);
    Some(Routed {
      tier: tier as usize,
      seed,
      salt,
    })
  }

  /// The tier a removed event's blocks are in; `None` for a medium not indexed here (counted).
  fn removal_tier(&mut self, r: &RemovedEvent) -> Option<usize> {
    let tier = Tier::of_medium(r.medium.as_deref());
    if tier.is_none() {
      self.drop_event(RouterDrop::Medium);
    }
    tier.map(|t| t as usize)
  }

  /// Forgets the salts of removed blocks.
  fn forget_salts(&mut self, w: WorkerKey, block_hashes: &[u64]) {
    if !self.salts.is_empty() {
      for h in block_hashes {
        self.salts.remove(&(w, *h));
      }
    }
  }

  /// Remembers a stored event's salt for its blocks (their children inherit it).
  fn note_salt(&mut self, w: WorkerKey, s: &StoredEvent, salt: u64) {
    if salt != 0 {
      for h in &s.block_hashes {
        self.salts.insert((w, *h), salt);
      }
    }
  }

  /// Applies the next piece of an event (`Piecewise`): as `apply` would, a piece at a time.
  /// False once the event is all applied, or dropped. An engine's event (`Piecewise::counted`)
  /// is counted once it is.
  pub fn apply_piece(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool> {
    if !p.counted {
      return self.apply_piece_of(p);
    }
    let before = *p.lost_before.get_or_insert_with(|| self.lost());
    let r = self.apply_piece_of(p);
    if !matches!(r, Ok(true)) {
      self.count_outcome(p.ev, before, r.is_err());
    }
    r
  }

  fn apply_piece_of(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool> {
    let w = p.w;
    match p.ev {
      KvEvent::Stored(s) => {
        let r = match p.routed {
          Some(r) => r,
          None => match self.route(w, s) {
            Some(r) => *p.routed.insert(r),
            None => return Ok(false),
          },
        };
        let (here, elsewhere) = split_tier(&mut self.tiers, r.tier, w);
        let more = here.apply_piece_chained(p, r.seed, elsewhere)?;
        if !more {
          self.note_salt(w, s, r.salt);
        }
        Ok(more)
      }
      KvEvent::Removed(r) => {
        let Some(tier) = self.removal_tier(r) else {
          return Ok(false);
        };
        let more = self.tiers[tier].apply_piece(p)?;
        if !more {
          self.forget_salts(w, &r.block_hashes);
        }
        Ok(more)
      }
      KvEvent::Cleared => {
        // Each tier's clear a piece at a time, one tier after another, then the salts.
        while p.tier_at < self.tiers.len() {
          if self.tiers[p.tier_at].apply_piece(p)? {
            return Ok(true);
          }
          p.tier_at += 1;
        }
        self.forget_worker_salts(w);
        Ok(false)
      }
      ev => {
        self.apply(w, ev)?;
        Ok(false)
      }
    }
  }

  /// Drops every block of worker `w` in every tier.
  pub fn clear(&mut self, w: WorkerKey) {
    for t in &mut self.tiers {
      t.apply(w, &KvEvent::Cleared)
        .expect("a clear always applies");
    }
    self.forget_worker_salts(w);
  }

  /// Forgets every salt of worker `w`.
  fn forget_worker_salts(&mut self, w: WorkerKey) {
    if !self.salts.is_empty() {
      self.salts.retain(|(k, _), _| *k != w);
    }
  }

  /// Drops every block of every DP rank of `worker_id` (or only `rank`).
  pub fn clear_worker(&mut self, worker_id: u64, rank: Option<u32>) {
    for w in self.ranks_of(worker_id, rank) {
      self.clear(w);
    }
  }

  /// The DP ranks of `worker_id` the index knows (only `rank`, when given), in order.
  pub fn ranks_of(&self, worker_id: u64, rank: Option<u32>) -> Vec<WorkerKey> {
    let mut ranks: Vec<WorkerKey> = self
      .tiers
      .iter()
      .flat_map(|t| t.workers())
      .filter(|w| w.worker_id == worker_id && rank.is_none_or(|r| r == w.dp_rank))
      .collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
  }

  /// Applies a node's `/kv_recover` answer (msgpack) to worker `worker_id`: `Events` batch by
  /// batch; a `TreeDump` replaces every rank of the worker with the dump.
  pub fn apply_recovery_msgpack(
    &mut self,
    worker_id: u64,
    bytes: &[u8],
  ) -> KvResult<RecoveryApplied> {
    let r = recover::from_msgpack(bytes)?;
    Ok(self.apply_recovery(worker_id, r))
  }

  pub fn apply_recovery(&mut self, worker_id: u64, r: Recovery) -> RecoveryApplied {
    recover_each(worker_id, r, |step| match step {
      RecoveryStep::Clear => self.clear_worker(worker_id, None),
      RecoveryStep::Apply(w, ev) => {
        let _ = self.apply(w, ev);
      }
    })
  }

  /// Every worker's blocks per tier, as chain segments (parents before children).
  pub fn dump(&self, worker_id: Option<u64>) -> Vec<DumpSegment> {
    let mut out = Vec::new();
    for t in Tier::ALL {
      for wd in self.tiers[t as usize].dump() {
        if worker_id.is_some_and(|id| id != wd.worker.worker_id) {
          continue;
        }
        let mut contents = wd.contents.into_iter();
        let mut keys = wd.keys.into_iter();
        for ev in wd.events {
          out.push(DumpSegment {
            tier: t,
            worker: wd.worker,
            parent: ev.parent_block_hash,
            block_hashes: ev.block_hashes,
            content_hashes: contents.next().unwrap_or_default(),
            keys: keys.next().unwrap_or_default(),
          });
        }
      }
    }
    out
  }

  pub fn drops(&self) -> Vec<(RouterDrop, u64)> {
    RouterDrop::ALL
      .iter()
      .map(|&d| (d, self.drops[d as usize]))
      .collect()
  }

  pub fn tier_stats(&self) -> Vec<(Tier, IndexStats)> {
    Tier::ALL
      .iter()
      .map(|&t| (t, self.tiers[t as usize].stats()))
      .collect()
  }
}

/// What applying a recovery answer does, in order (`recover_each`).
enum RecoveryStep<'a> {
  /// A tree dump first drops every rank of the worker.
  Clear,
  Apply(WorkerKey, &'a KvEvent),
}

/// Takes a `/kv_recover` answer for worker `worker_id` through `step`: an `Events` answer's
/// events batch by batch, each under its batch's DP rank; a `TreeDump`'s clear of the worker,
/// then its events under each dumped rank.
fn recover_each(
  worker_id: u64,
  r: Recovery,
  mut step: impl FnMut(RecoveryStep<'_>),
) -> RecoveryApplied {
  let mut out = RecoveryApplied {
    kind: r.kind(),
    last_seq: 0,
    epoch: 0,
    next_start: None,
    events: 0,
  };
  match r {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
      next_start,
    } => {
      (out.last_seq, out.epoch, out.next_start) = (last_seq, epoch, next_start);
      for b in batches {
        let w = WorkerKey {
          worker_id,
          dp_rank: b.dp_rank.map_or(0, |r| r.max(0) as u32),
        };
        for ev in &b.events {
          out.events += 1;
          step(RecoveryStep::Apply(w, ev));
        }
      }
    }
    Recovery::TreeDump {
      workers,
      last_seq,
      epoch,
    } => {
      (out.last_seq, out.epoch) = (last_seq, epoch);
      step(RecoveryStep::Clear);
      for WorkerDump { worker, events, .. } in workers {
        let w = WorkerKey {
          worker_id,
          dp_rank: worker.dp_rank,
        };
        for ev in events {
          out.events += 1;
          step(RecoveryStep::Apply(w, &KvEvent::Stored(ev)));
        }
      }
    }
    Recovery::TooNew { last_seq, epoch }
    | Recovery::InvalidRange {
      last_seq, epoch, ..
    } => {
      (out.last_seq, out.epoch) = (last_seq, epoch);
    }
  }
  out
}

/// Applies every event of `decoded` with `apply`, each under its batch's DP rank or `rank`.
fn apply_each(
  decoded: codec::Decoded,
  worker_id: u64,
  rank: u32,
  mut apply: impl FnMut(WorkerKey, &KvEvent) -> KvResult<()>,
) -> Applied {
  let mut out = Applied {
    unknown_events: decoded.unknown_events,
    seq: decoded.batches.first().map_or(0, |b| b.seq),
    ..Applied::default()
  };
  for b in &decoded.batches {
    let w = WorkerKey {
      worker_id,
      dp_rank: b.dp_rank.map_or(rank, |r| r.max(0) as u32),
    };
    for ev in &b.events {
      out.events += 1;
      if apply(w, ev).is_err() {
        out.layout_errors += 1;
      }
    }
  }
  out
}

/// A stored event's tier and keying, worked out on its first piece (`RouterIndex::apply_piece`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routed {
  tier: usize,
  seed: u64,
  salt: u64,
}

/// Tier `tier`'s index, and a lookup of a parent the worker holds in another tier (a block
/// offloaded after its parent) giving its key.
fn split_tier(
  tiers: &mut [Index],
  tier: usize,
  w: WorkerKey,
) -> (&mut Index, impl FnOnce(u64) -> Option<u64> + '_) {
  let (before, rest) = tiers.split_at_mut(tier);
  let (here, after) = rest.split_first_mut().expect("a tier");
  let (before, after): (&[Index], &[Index]) = (before, after);
  let elsewhere = move |p| {
    before
      .iter()
      .chain(after.iter())
      .find_map(|ix| ix.key_of(w, p))
  };
  (here, elsewhere)
}

impl ApplyPiece for RouterIndex {
  fn apply_piece(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool> {
    RouterIndex::apply_piece(self, p)
  }
}

impl Shared<RouterIndex> {
  /// `RouterIndex::apply_payload` with readers alongside: decoded before the lock is taken, then
  /// applied a piece of an event per write lock, so a query never waits for the whole payload.
  pub fn apply_payload(
    &self,
    worker_id: u64,
    rank: u32,
    bytes: &[u8],
    dialect: Dialect,
  ) -> KvResult<Applied> {
    let decoded = codec::decode(bytes, dialect)?;
    Ok(apply_each(decoded, worker_id, rank, |w, ev| {
      self.apply_engine_event(w, ev)
    }))
  }

  /// `apply` for an engine's event: its outcome counted (`RouterIndex::outcomes`).
  fn apply_engine_event(&self, w: WorkerKey, ev: &KvEvent) -> KvResult<()> {
    let turn = self.turn();
    let mut p = Piecewise::new(w, ev, PIECE_BLOCKS).counted();
    while self.piece(&turn).apply_piece(&mut p)? {}
    Ok(())
  }

  /// `apply_payload` for SMG's numbered `KvEventBatch`: applied only when its seq is `expected`
  /// (any seq when `None`).
  pub fn apply_numbered(
    &self,
    worker_id: u64,
    rank: u32,
    bytes: &[u8],
    expected: Option<u64>,
  ) -> KvResult<Numbered> {
    let head = codec::smg::batch_head(bytes)?;
    if let Some(e) = expected {
      if head.seq < e {
        return Ok(Numbered::Duplicate(head.seq));
      }
      if head.seq > e {
        return Ok(Numbered::Gap(head.seq));
      }
    }
    let mut a = self.apply_payload(worker_id, rank, bytes, Dialect::SmgProto)?;
    a.snapshot_rest = head.snapshot_rest.unwrap_or(0);
    Ok(Numbered::Applied(a))
  }

  /// `RouterIndex::apply_recovery_msgpack` with readers alongside: decoded before the lock is
  /// taken, then applied a piece of an event per write lock (a tree dump's clear of the worker
  /// too, a few edges a piece). So a query never waits for a whole recovery; it sees the
  /// worker's blocks come back event by event, as they came when the engine stored them. Writers
  /// wait for the whole answer (it is one writer's turn), as they waited for it under one lock.
  pub fn apply_recovery_msgpack(&self, worker_id: u64, bytes: &[u8]) -> KvResult<RecoveryApplied> {
    let r = recover::from_msgpack(bytes)?;
    // One turn for the whole answer: no other writer (another DP rank's link) comes between the
    // clear and the dump's events.
    let turn = self.turn();
    Ok(recover_each(worker_id, r, |step| match step {
      RecoveryStep::Clear => self.clear_worker_in(&turn, worker_id, None),
      RecoveryStep::Apply(w, ev) => {
        let _ = self.apply_in(&turn, w, ev);
      }
    }))
  }

  /// `RouterIndex::clear_worker` with readers alongside: each rank's clear a piece at a time
  /// (a few edges a piece), all in one writer's turn.
  pub fn clear_worker(&self, worker_id: u64, rank: Option<u32>) {
    self.clear_worker_in(&self.turn(), worker_id, rank);
  }

  /// `clear_worker` in the caller's turn.
  fn clear_worker_in(&self, turn: &Turn<'_>, worker_id: u64, rank: Option<u32>) {
    let ranks = self.read().ranks_of(worker_id, rank);
    for w in ranks {
      self
        .apply_in(turn, w, &KvEvent::Cleared)
        .expect("a clear always applies");
    }
  }

  /// `apply_payload` for payloads that arrived together, in order: all decoded first, so nothing
  /// is applied if one does not decode (the error names which, and the caller may go on one
  /// payload at a time without applying any twice). The events applied.
  pub fn apply_payloads(
    &self,
    worker_id: u64,
    rank: u32,
    payloads: &[&[u8]],
    dialect: Dialect,
  ) -> KvResult<u32> {
    let decoded = codec::decode_all(payloads, dialect)?;
    Ok(
      decoded
        .into_iter()
        .map(|d| apply_each(d, worker_id, rank, |w, ev| self.apply_engine_event(w, ev)).events)
        .sum(),
    )
  }
}

#[cfg(test)]
mod tests;
