//! The multi-worker KV block index (docs/architecture.md#index-semantics).
//!
//! Blocks are keyed by their chained `xxh3` content hash, computed here from each stored event's
//! tokens, so routers match any engine without knowing its hash algorithm (`KeyBy::Engine` keys
//! by the engine's hash instead, for hash-only events). Each worker keeps a map from the engine's
//! opaque block hash to the indexed block, for parent lookup and removal.
//!
//! Blocks are stored as edges, chains of keys side by side with their holders per span
//! (`edge.rs`, docs/architecture.md#index-layout).
//!
//! Removing an inner block leaves the worker's descendants of it unreachable for matching (a
//! match counts consecutive leading blocks). They stay indexed and counted
//! (`unreachable_blocks`) until the engine removes them or clears. Blocks no worker holds are cut
//! off their edge as soon as nothing hangs from them, so nothing leaks.

mod dump;
mod edge;
mod matching;
pub mod table;

pub use dump::{DumpEvent, WorkerDump};
pub use matching::{MatchOptions, Matches};

use crate::error::{KvError, KvResult};
use crate::event::{check_layout, KvEvent, StoredEvent};
use crate::hash::{content_hash_seeded, seq_hash, XXH3_SEED};
use edge::{loc, unloc, Edge, FREED, NONE};
use std::collections::HashMap;
use table::{hash32, LocMap, MixState, TagMap};

/// A worker: one engine instance (`worker_id`) and one of its data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey {
  pub worker_id: u64,
  pub dp_rank: u32,
}

/// What blocks are keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyBy {
  /// The chained `xxh3` content hash of the tokens (engine-independent). The default.
  #[default]
  Content,
  /// The engine's own block hash (hash-only events; matching must hash like the engine).
  Engine,
}

impl KeyBy {
  pub fn parse(name: &str) -> KvResult<KeyBy> {
    match name {
      "content" => Ok(KeyBy::Content),
      "engine" => Ok(KeyBy::Engine),
      other => Err(KvError::invalid_arg(format!(
        "keyBy must be \"content\" or \"engine\", got {other:?}"
      ))),
    }
  }
}

/// A retained content hash that is not known (a block stored by its key alone).
pub(crate) const UNKNOWN_CONTENT: u64 = 0;

#[derive(Debug, Clone, Copy)]
pub struct IndexConfig {
  pub key_by: KeyBy,
  /// Keep each block's tokens (for tree dumps consumers can content-hash).
  pub retain_tokens: bool,
  /// Keep each block's own content hash (8 bytes a block, not a membership), for tree dumps that
  /// carry it in place of the tokens (Dynamo's `tokens_hash`). Content keys only.
  pub retain_contents: bool,
  /// Tree dumps carry each block's key (`WorkerDump::keys`): another index of the same keying
  /// stores them as they are.
  pub dump_keys: bool,
}

impl Default for IndexConfig {
  fn default() -> Self {
    IndexConfig {
      key_by: KeyBy::Content,
      retain_tokens: true,
      retain_contents: false,
      dump_keys: false,
    }
  }
}

/// Why an event (or part of it) was not applied. Every drop is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
  /// A stored event whose parent the worker does not hold: dropped, worker needs recovery.
  UnknownParent,
  /// A removed hash the worker does not hold.
  UnknownRemoved,
  /// A stored block the worker already held (idempotent, not an error).
  DuplicateStore,
  /// A stored event whose tokens do not split into `block_size` x hashes: the worker's state is
  /// cleared and it needs recovery (fail closed).
  UnsupportedLayout,
}

impl DropReason {
  pub const ALL: [DropReason; 4] = [
    DropReason::UnknownParent,
    DropReason::UnknownRemoved,
    DropReason::DuplicateStore,
    DropReason::UnsupportedLayout,
  ];

  pub const fn name(self) -> &'static str {
    match self {
      DropReason::UnknownParent => "unknown_parent",
      DropReason::UnknownRemoved => "unknown_removed",
      DropReason::DuplicateStore => "duplicate_store",
      DropReason::UnsupportedLayout => "unsupported_layout",
    }
  }
}

pub(crate) struct WorkerState {
  pub key: WorkerKey,
  /// Engine block hash -> the block's location (`edge::loc`).
  pub engine: LocMap,
  pub needs_recovery: bool,
  /// A clear of the worker under way (`Index::clear_piece`): its blocks still held are counted
  /// here, and anything else that changes the worker (another event, a store resumed) finishes
  /// it first.
  clearing: Option<Box<Clearing>>,
  /// Pieces applied to the worker (events begun, and each piece of one), wrapping: a store
  /// applied a piece at a time notices anything applied to the worker between its pieces
  /// (`StoreResume::at`).
  changes: u32,
}

impl WorkerState {
  /// The blocks it holds: its engine ids, and those a clear under way has not reached.
  fn blocks(&self) -> u64 {
    self.engine.len() as u64 + self.clearing.as_ref().map_or(0, |c| c.held)
  }
}

impl Clearing {
  /// A clear of a worker begun: its engine map taken out.
  fn of(engine: &mut LocMap) -> Box<Clearing> {
    let map = std::mem::take(engine);
    Box::new(Clearing {
      held: map.len() as u64,
      map,
      next: 0,
      done: Default::default(),
    })
  }
}

/// Per-worker figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStats {
  pub worker: WorkerKey,
  pub blocks: u64,
  pub unreachable_blocks: u64,
  pub needs_recovery: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexStats {
  /// Distinct indexed blocks (held, or kept because an edge hangs from them).
  pub blocks: u64,
  /// (worker, block) memberships.
  pub memberships: u64,
  pub workers: u64,
  /// Heap bytes held by the index.
  pub bytes: u64,
  /// Of which retained tokens.
  pub token_bytes: u64,
  pub drops: Vec<(DropReason, u64)>,
  pub per_worker: Vec<WorkerStats>,
}

/// A stored event's blocks, borrowed: what the index reads of a stored event.
#[derive(Debug, Clone, Copy)]
pub struct StoredBlocks<'a> {
  pub block_hashes: &'a [u64],
  pub parent_block_hash: Option<u64>,
  pub token_ids: &'a [u32],
  pub block_size: u32,
  /// Each block's content hash, given in place of its tokens (a dump that carries them): empty
  /// when the tokens are hashed.
  pub content_hashes: &'a [u64],
  /// Each block's key, given (a dump of an index keyed the same way): stored as it is, neither
  /// hashed nor chained. Empty otherwise.
  pub keys: &'a [u64],
}

impl<'a> StoredBlocks<'a> {
  pub fn of(s: &'a StoredEvent) -> StoredBlocks<'a> {
    StoredBlocks {
      block_hashes: &s.block_hashes,
      parent_block_hash: s.parent_block_hash,
      token_ids: &s.token_ids,
      block_size: s.block_size,
      content_hashes: &[],
      keys: &[],
    }
  }
}

pub struct Index {
  cfg: IndexConfig,
  /// Edges by id (`edge.rs`); freed ones wait in `free_edges`.
  edges: Vec<Edge>,
  free_edges: Vec<u32>,
  /// An edge's first key -> the edge, by `hash32(key)`; the key is the edge's `keys[0]`.
  by_first: TagMap,
  /// Blocks stored: held by a worker, or kept because an edge hangs from them.
  blocks: u64,
  /// Token ids retained, kept as we go so `stats` needs no pass over the tokens.
  token_words: usize,
  workers: Vec<WorkerState>,
  slots: HashMap<WorkerKey, u32, MixState>,
  /// The slot `slot()` found last.
  last_slot: Option<(WorkerKey, u32)>,
  memberships: u64,
  /// Root edges stored after a parent held in another tier (`store_chained`), ever.
  tier_roots: u64,
  /// Such a root edge -> the engine hash of its parent in the other tier, as the worker that
  /// stored it first named it (a dump's segment starting there names it as its parent).
  root_parents: HashMap<u32, u64, MixState>,
  drops: [u64; 4],
  /// Reused buffers of `store`.
  scratch_keys: Vec<u64>,
  scratch_contents: Vec<u64>,
}

/// A block of an edge: (edge, offset).
type Pos = (u32, u32);

/// A store under way: the block its next block goes on from, and every block's key.
pub(crate) struct StoreResume {
  cur: Option<Pos>,
  prev_key: Option<u64>,
  keys: Vec<u64>,
  /// Every block's content hash, when the index retains them (empty otherwise).
  contents: Vec<u64>,
  /// The worker's change count after the store's last piece (`WorkerState::changes`).
  at: u32,
}

/// One event applied a piece at a time, each piece at most `blocks` of its blocks
/// (`Index::apply_piece`). A writer that shares the index with readers takes its lock once per
/// piece (`Shared::<Index>::apply`), so a query waits for one piece at most, not a whole event.
/// Between two pieces a query sees the event's first blocks stored (or removed): the state the
/// engine itself passed through, storing or freeing them one after another. A clear goes through
/// the worker's engine map `CLEAR_LOCS` entries per block of a piece, whole edges at a time.
///
/// The index ends in the state applying the event whole gives, with the same drops counted.
///
/// Once started, an event is meant to be applied to its last piece before anything else is
/// applied for the same worker (`Shared` sees to it with writer turns). A caller that does
/// otherwise still leaves the index whole: anything else applied to a worker whose clear is under
/// way finishes that clear first, and a store whose worker had anything else applied between its
/// pieces goes on from its last block stored if the worker still holds it there, or drops the
/// rest as a store with an unknown parent (what the engine's events in that order would give).
pub struct Piecewise<'e> {
  pub(crate) w: WorkerKey,
  pub(crate) ev: &'e KvEvent,
  blocks: usize,
  /// The next block to apply.
  next: usize,
  started: bool,
  store: Option<StoreResume>,
  /// What the router worked out on the first piece (`RouterIndex::apply_piece`).
  pub(crate) routed: Option<crate::router::Routed>,
  /// Whether this event's clear began in the tier it is in (`Index::clear_piece`).
  clear_begun: bool,
  /// The tier a router's clear is in (`RouterIndex::apply_piece`).
  pub(crate) tier_at: usize,
  /// Engine maps a clear is done with, freed with the `Piecewise`, outside the writer's lock.
  spent: Vec<LocMap>,
  /// An engine's event, whose outcome the router counts (`RouterIndex::outcomes`).
  pub(crate) counted: bool,
  /// The router's drops that tell that outcome, as they stood before its first piece.
  pub(crate) lost_before: Option<crate::router::Lost>,
}

/// A worker's clear applied a piece at a time: its engine ids, taken out of its map, gone through
/// `CLEAR_LOCS` entries of that map per block of a piece; the edges already rid of the worker,
/// and how many blocks it still holds on the others.
struct Clearing {
  map: LocMap,
  next: usize,
  done: std::collections::HashSet<u32, MixState>,
  held: u64,
}

/// Entries of a worker's engine map a piece of its clear goes through, per block of a piece: with
/// 4-block pieces, 64 blocks (and up to 7 more, to the end of a bucket), each edge they are on rid
/// of the worker at once. A piece also stops after 8 places per entry, empty ones included.
const CLEAR_LOCS: usize = 16;

impl<'e> Piecewise<'e> {
  pub fn new(w: WorkerKey, ev: &'e KvEvent, blocks: usize) -> Piecewise<'e> {
    Piecewise {
      w,
      ev,
      blocks: blocks.max(1),
      next: 0,
      started: false,
      store: None,
      routed: None,
      clear_begun: false,
      tier_at: 0,
      spent: Vec::new(),
      counted: false,
      lost_before: None,
    }
  }

  /// An engine's event, its outcome counted by the router it is applied to.
  pub fn counted(mut self) -> Piecewise<'e> {
    self.counted = true;
    self
  }

  /// A clear done with: its map kept to be freed with the `Piecewise`, and the next clear begun
  /// afresh (a router clears a worker in each of its tiers in turn).
  fn clear_done(&mut self, c: Box<Clearing>) {
    self.spent.push(c.map);
    self.clear_begun = false;
  }

  /// The next piece: its blocks out of `len`, moved past.
  fn take(&mut self, len: usize) -> std::ops::Range<usize> {
    let end = (self.next + self.blocks).min(len);
    let r = self.next..end;
    self.next = end;
    r
  }

  /// Whether blocks are left after the last piece.
  fn more(&self, len: usize) -> bool {
    self.next < len
  }
}

impl Index {
  pub fn new(cfg: IndexConfig) -> Index {
    Index {
      cfg,
      edges: Vec::new(),
      free_edges: Vec::new(),
      by_first: TagMap::default(),
      blocks: 0,
      token_words: 0,
      workers: Vec::new(),
      slots: HashMap::default(),
      last_slot: None,
      memberships: 0,
      tier_roots: 0,
      root_parents: HashMap::default(),
      drops: [0; 4],
      scratch_keys: Vec::new(),
      scratch_contents: Vec::new(),
    }
  }

  /// Takes back a finished store's buffers for the next one.
  fn keep_scratch(&mut self, r: &mut StoreResume) {
    self.scratch_keys = std::mem::take(&mut r.keys);
    self.scratch_contents = std::mem::take(&mut r.contents);
  }

  pub fn config(&self) -> IndexConfig {
    self.cfg
  }

  /// Events or blocks dropped for `reason` so far (as `stats` counts them).
  pub fn dropped(&self, reason: DropReason) -> u64 {
    self.drops[reason as usize]
  }

  fn drop_event(&mut self, reason: DropReason, n: u64) {
    self.drops[reason as usize] += n;
  }

  fn slot(&mut self, w: WorkerKey) -> u32 {
    // Slots are never reused, so the last one looked up stays valid (events come in runs of one
    // worker).
    if let Some((k, s)) = self.last_slot {
      if k == w {
        return s;
      }
    }
    if let Some(&s) = self.slots.get(&w) {
      self.last_slot = Some((w, s));
      return s;
    }
    let s = self.workers.len() as u32;
    self.workers.push(WorkerState {
      key: w,
      engine: LocMap::default(),
      needs_recovery: false,
      clearing: None,
      changes: 0,
    });
    self.slots.insert(w, s);
    s
  }

  /// Applies one event for a worker. Events that cannot be applied are counted, never silently
  /// lost; only an unsupported layout is also returned as an error (the worker was cleared).
  pub fn apply(&mut self, w: WorkerKey, ev: &KvEvent) -> KvResult<()> {
    let slot = self.slot(w);
    match ev {
      KvEvent::Stored(s) => self.store(slot, StoredBlocks::of(s), XXH3_SEED, |_| None),
      KvEvent::Removed(r) => {
        self.begin(slot);
        self.remove(slot, &r.block_hashes);
        Ok(())
      }
      KvEvent::Cleared => {
        self.clear_slot(slot);
        Ok(())
      }
      KvEvent::Updated(_) | KvEvent::Created(_) => Ok(()),
    }
  }

  /// Applies the next piece of `p` (see `Piecewise`); false once the event is all applied, or
  /// dropped. An unsupported layout is an error on the first piece, as `apply` returns it.
  pub fn apply_piece(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool> {
    self.apply_piece_chained(p, XXH3_SEED, |_| None)
  }

  /// `apply_piece` with `store_chained`'s seed and parent lookup (used on the first piece).
  pub(crate) fn apply_piece_chained(
    &mut self,
    p: &mut Piecewise<'_>,
    seed: u64,
    parent_elsewhere: impl FnOnce(u64) -> Option<u64>,
  ) -> KvResult<bool> {
    let slot = self.slot(p.w);
    match p.ev {
      KvEvent::Stored(ev) => {
        let s = StoredBlocks::of(ev);
        if !p.started {
          p.started = true;
          p.store = self.store_start(slot, s, seed, parent_elsewhere)?;
        }
        let Some(mut r) = p.store.take() else {
          return Ok(false);
        };
        if r.at != self.workers[slot as usize].changes && !self.resume_store(slot, &mut r, p.next) {
          return Ok(false);
        }
        let range = p.take(s.block_hashes.len());
        self.store_run(slot, s, &mut r, range);
        r.at = self.changed(slot);
        if p.more(s.block_hashes.len()) {
          p.store = Some(r);
          return Ok(true);
        }
        self.keep_scratch(&mut r);
        Ok(false)
      }
      KvEvent::Removed(ev) => {
        // Each piece is a change of the worker (a store in pieces notices it).
        self.begin(slot);
        let range = p.take(ev.block_hashes.len());
        self.remove(slot, &ev.block_hashes[range]);
        Ok(p.more(ev.block_hashes.len()))
      }
      KvEvent::Cleared => Ok(self.clear_piece(slot, p)),
      _ => {
        self.apply(p.w, p.ev)?;
        Ok(false)
      }
    }
  }

  /// The next piece of the worker's clear; false once it is done. The first piece takes the
  /// worker's engine map out of its lookups into the clear under way (or goes on with one left
  /// under way); each piece then goes through `CLEAR_LOCS` of its entries per block of a piece,
  /// so a reader sees the worker's blocks go an edge at a time.
  fn clear_piece(&mut self, slot: u32, p: &mut Piecewise<'_>) -> bool {
    self.changed(slot);
    let ws = &mut self.workers[slot as usize];
    if !p.clear_begun {
      p.clear_begun = true;
      // A clear left under way goes on: its end is this one's.
      if ws.clearing.is_none() {
        ws.clearing = Some(Clearing::of(&mut ws.engine));
      }
    }
    let Some(mut c) = ws.clearing.take() else {
      // Finished by another event of the worker in between.
      p.clear_begun = false;
      return false;
    };
    let more = self.clear_places(slot, &mut c, CLEAR_LOCS * p.blocks);
    if more {
      self.workers[slot as usize].clearing = Some(c);
    } else {
      p.clear_done(c);
    }
    more
  }

  /// An event of the worker begins: a clear of it left under way is finished first (a caller
  /// stopped applying its pieces), and its change count moves on.
  fn begin(&mut self, slot: u32) {
    self.changed(slot);
    self.finish_clear(slot);
  }

  /// Counts a change applied to the worker; the count after it.
  fn changed(&mut self, slot: u32) -> u32 {
    let ws = &mut self.workers[slot as usize];
    ws.changes = ws.changes.wrapping_add(1);
    ws.changes
  }

  /// Finishes the worker's clear left under way, if any.
  fn finish_clear(&mut self, slot: u32) {
    if let Some(mut c) = self.workers[slot as usize].clearing.take() {
      self.clear_places(slot, &mut c, usize::MAX);
    }
  }

  /// A store applied a piece at a time had something else applied to its worker since its last
  /// piece (a clear under way is finished now, before it goes on). It goes on from its last block
  /// stored (block `next - 1`, at `r.cur`) if the worker still holds that block there. False,
  /// the rest dropped as a store with an unknown parent, when it does not.
  fn resume_store(&mut self, slot: u32, r: &mut StoreResume, next: usize) -> bool {
    self.finish_clear(slot);
    r.at = self.workers[slot as usize].changes;
    let held = match (next.checked_sub(1), r.cur) {
      (Some(last), Some((e, o))) => {
        let edge = &self.edges[e as usize];
        edge.parent != FREED
          && (o as usize) < edge.len()
          && edge.keys[o as usize] == r.keys[last]
          && edge.holds(o, slot)
      }
      (None, _) => true,
      (Some(_), None) => false,
    };
    if !held {
      self.drop_event(DropReason::UnknownParent, 1);
      self.workers[slot as usize].needs_recovery = true;
      self.keep_scratch(r);
    }
    held
  }

  /// Goes on with clear `c` through the worker's map, a place at a time, until `locs` entries
  /// (or `8 * locs` places) were gone through: each edge their blocks are on rid of the worker at
  /// once, then cut back. False once the clear is done (the worker's recovery mark dropped): its
  /// blocks all gone, which can be long before the last place.
  fn clear_places(&mut self, slot: u32, c: &mut Clearing, locs: usize) -> bool {
    let places = c.map.places();
    let (mut seen, mut scanned) = (0usize, 0usize);
    let mut touched = Vec::new();
    while c.next < places && c.held > 0 && seen < locs && scanned < locs.saturating_mul(8) {
      for l in c.map.locs_at(c.next..c.next + 1) {
        seen += 1;
        let e = unloc(l).0;
        if c.done.insert(e) {
          let held = self.edges[e as usize].remove_all(slot) as u64;
          self.memberships -= held;
          c.held -= held;
          touched.push(e);
        }
      }
      c.next += 1;
      scanned += 1;
    }
    for e in touched {
      self.reclaim(e);
    }
    // Done once every block is gone: the places left only name edges already rid of it.
    let more = c.held > 0 && c.next < places;
    if !more {
      debug_assert_eq!(c.held, 0, "engine map and holders disagree");
      self.workers[slot as usize].needs_recovery = false;
    }
    more
  }

  /// Applies a stored event given as slices (the publish path's columns): as `apply` would.
  pub fn store_blocks(&mut self, w: WorkerKey, s: StoredBlocks<'_>) -> KvResult<()> {
    let slot = self.slot(w);
    self.store(slot, s, XXH3_SEED, |_| None)
  }

  /// `store_blocks` for a router's namespaces and tiers: each block's content hash is seeded with
  /// `seed`, and a parent this worker does not hold here is looked up with `parent_elsewhere`
  /// (another tier): the chain goes on from that key, as a root of this index.
  pub fn store_chained(
    &mut self,
    w: WorkerKey,
    s: StoredBlocks<'_>,
    seed: u64,
    parent_elsewhere: impl FnOnce(u64) -> Option<u64>,
  ) -> KvResult<()> {
    let slot = self.slot(w);
    self.store(slot, s, seed, parent_elsewhere)
  }

  /// The content key of the block the worker holds under engine hash `eh`.
  pub fn key_of(&self, w: WorkerKey, eh: u64) -> Option<u64> {
    let &slot = self.slots.get(&w)?;
    let (e, o) = unloc(self.workers[slot as usize].engine.get(eh)?);
    Some(self.edges[e as usize].keys[o as usize])
  }

  /// Workers known to the index (held blocks or not).
  pub fn workers(&self) -> impl Iterator<Item = WorkerKey> + '_ {
    self.workers.iter().map(|w| w.key)
  }

  /// Applies a removed event given as its block hashes: as `apply` would.
  pub fn remove_blocks(&mut self, w: WorkerKey, block_hashes: &[u64]) {
    let slot = self.slot(w);
    self.begin(slot);
    self.remove(slot, block_hashes);
  }

  /// Whether a stored event's tokens split into `block_size` x hashes (`Err` says why not).
  pub fn check_layout(&self, s: &StoredEvent) -> KvResult<()> {
    s.check_layout(self.cfg.key_by == KeyBy::Engine)
  }

  /// The edge whose first block is `key`.
  #[inline]
  fn edge_of_first(&self, key: u64) -> Option<u32> {
    let edges = &self.edges;
    self.by_first.get(hash32(key), |e| {
      edges[e as usize].keys.first() == Some(&key)
    })
  }

  /// Where block `key`, the child of `cur` (a root when `None`), is stored, if it is.
  #[inline]
  fn find_child(&self, cur: Option<Pos>, key: u64) -> Option<Pos> {
    if let Some((e, o)) = cur {
      let next = self.edges[e as usize].keys.get(o as usize + 1);
      if next == Some(&key) {
        return Some((e, o + 1));
      }
    }
    self.edge_of_first(key).map(|f| (f, 0))
  }

  /// `find_child` for a block being stored. A chained key follows one parent, so a block
  /// that is not the next of `cur`'s edge can only start an edge hanging from `cur`, or be a root
  /// stored after a parent in another tier: without either, no lookup is needed.
  #[inline]
  fn child_for_store(&self, cur: Option<Pos>, key: u64) -> Option<Pos> {
    if let Some((e, o)) = cur {
      let edge = &self.edges[e as usize];
      let next = edge.keys.get(o as usize + 1) == Some(&key);
      if !next && self.tier_roots == 0 && !edge.hung_at(o) {
        return None;
      }
    }
    self.find_child(cur, key)
  }

  fn store(
    &mut self,
    slot: u32,
    s: StoredBlocks<'_>,
    seed: u64,
    parent_elsewhere: impl FnOnce(u64) -> Option<u64>,
  ) -> KvResult<()> {
    if let Some(mut r) = self.store_start(slot, s, seed, parent_elsewhere)? {
      self.store_run(slot, s, &mut r, 0..s.block_hashes.len());
      self.keep_scratch(&mut r);
    }
    Ok(())
  }

  /// A store's first step: its layout checked, the block it goes on from found and its blocks'
  /// keys computed. `None` when the event is dropped (its parent unknown: counted).
  fn store_start(
    &mut self,
    slot: u32,
    s: StoredBlocks<'_>,
    seed: u64,
    parent_elsewhere: impl FnOnce(u64) -> Option<u64>,
  ) -> KvResult<Option<StoreResume>> {
    self.begin(slot);
    let given = !s.content_hashes.is_empty() || !s.keys.is_empty();
    let miscounted = |n: usize| n != 0 && n != s.block_hashes.len();
    let layout = if miscounted(s.content_hashes.len()) || miscounted(s.keys.len()) {
      Err(KvError::invalid_arg(format!(
        "{} content hashes and {} keys for {} blocks",
        s.content_hashes.len(),
        s.keys.len(),
        s.block_hashes.len()
      )))
    } else {
      check_layout(
        s.block_hashes.len(),
        s.token_ids.len(),
        s.block_size,
        self.cfg.key_by == KeyBy::Engine || given,
      )
    };
    if let Err(e) = layout {
      self.drop_event(DropReason::UnsupportedLayout, 1);
      self.clear_slot(slot);
      self.workers[slot as usize].needs_recovery = true;
      return Err(e);
    }
    let (cur, prev_key): (Option<Pos>, Option<u64>) = match s.parent_block_hash {
      None => (None, None),
      Some(p) => match self.workers[slot as usize].engine.get(p) {
        Some(l) => {
          let (e, o) = unloc(l);
          (Some((e, o)), Some(self.edges[e as usize].keys[o as usize]))
        }
        None => match parent_elsewhere(p) {
          Some(key) => (None, Some(key)),
          None => {
            self.drop_event(DropReason::UnknownParent, 1);
            self.workers[slot as usize].needs_recovery = true;
            return Ok(None);
          }
        },
      },
    };
    let bs = s.block_size as usize;
    let mut keys = std::mem::take(&mut self.scratch_keys);
    keys.clear();
    let mut contents = std::mem::take(&mut self.scratch_contents);
    contents.clear();
    let retain = self.cfg.retain_contents && self.cfg.key_by == KeyBy::Content;
    let mut chain = prev_key;
    for (i, &eh) in s.block_hashes.iter().enumerate() {
      let key = match self.cfg.key_by {
        _ if !s.keys.is_empty() => {
          if retain {
            // Every block of an edge has a content hash while retained, so they stay at their
            // blocks' offsets: 0 where the dump gave none (`UNKNOWN_CONTENT`).
            contents.push(s.content_hashes.get(i).copied().unwrap_or(UNKNOWN_CONTENT));
          }
          s.keys[i]
        }
        KeyBy::Engine => eh,
        KeyBy::Content => {
          let c = match s.content_hashes.get(i) {
            Some(&c) => c,
            None => content_hash_seeded(&s.token_ids[i * bs..(i + 1) * bs], seed),
          };
          if retain {
            contents.push(c);
          }
          chain.map_or(c, |p| seq_hash(p, c))
        }
      };
      keys.push(key);
      chain = Some(key);
    }
    Ok(Some(StoreResume {
      cur,
      prev_key,
      keys,
      contents,
      at: self.workers[slot as usize].changes,
    }))
  }

  /// Stores blocks `range` of a store begun with `store_start`, going on from `r.cur`.
  fn store_run(
    &mut self,
    slot: u32,
    s: StoredBlocks<'_>,
    r: &mut StoreResume,
    range: std::ops::Range<usize>,
  ) {
    let bs = s.block_size as usize;
    let (mut cur, prev_key) = (r.cur, r.prev_key);
    for &eh in &s.block_hashes[range.clone()] {
      self.workers[slot as usize].engine.prefetch(eh);
    }
    // Blocks that exist and that the worker joins, as one range of an edge at a time.
    let mut pending: Option<(u32, u32, u32)> = None;
    // Whether the worker holds a run of blocks of an edge (edge, from, to, held): the span the
    // last lookup found, valid until the index changes (`pending` only changes at a flush).
    let mut run: Option<(u32, u32, u32, bool)> = None;
    for i in range {
      let (eh, key) = (s.block_hashes[i], r.keys[i]);
      let tokens = self.cfg.retain_tokens.then(|| {
        if s.token_ids.is_empty() {
          &[][..]
        } else {
          &s.token_ids[i * bs..(i + 1) * bs]
        }
      });
      // Where the block's engine id goes, found by the lookup that misses it (`None` once the
      // map changed in between).
      let mut vacant = None;
      match self.workers[slot as usize].engine.get_or_vacant(eh) {
        Err(v) => vacant = Some(v),
        Ok(l) => {
          let (e, o) = unloc(l);
          if self.edges[e as usize].keys[o as usize] == key {
            self.drop_event(DropReason::DuplicateStore, 1);
            cur = Some((e, o));
            continue;
          }
          // The engine reused an id for other content: the old block is gone.
          self.flush(slot, &mut pending);
          run = None;
          self.remove_one(slot, eh);
          if let Some((e, o)) = cur {
            let edge = &self.edges[e as usize];
            if edge.parent == FREED || o as usize >= edge.len() {
              // That block was the previous one itself (an engine reusing its own parent's id).
              cur = None;
            }
          }
        }
      }
      let pos = match self.child_for_store(cur, key) {
        Some((e, o)) => {
          let held = match run {
            Some((re, lo, hi, held)) if re == e && lo <= o && o < hi => held,
            _ => {
              let (held, lo, hi) = self.edges[e as usize].holds_run(o, slot);
              run = Some((e, lo, hi, held));
              held
            }
          };
          if held {
            // The worker already holds this block under another engine id: one membership, one
            // id.
            self.drop_event(DropReason::DuplicateStore, 1);
            cur = Some((e, o));
            continue;
          }
          if let Some(t) = tokens.filter(|t| !t.is_empty()) {
            let held = &mut self.edges[e as usize].tokens[o as usize];
            if held.is_empty() {
              *held = t.into();
              self.token_words += t.len();
            }
          }
          match &mut pending {
            Some((pe, _, b)) if *pe == e && *b == o => *b += 1,
            _ => {
              if pending.is_some() {
                self.flush(slot, &mut pending);
                run = None;
              }
              pending = Some((e, o, o + 1));
            }
          }
          (e, o)
        }
        None => {
          self.flush(slot, &mut pending);
          run = None;
          self.blocks += 1;
          self.token_words += tokens.map_or(0, |t| t.len());
          match cur {
            Some((e, o)) if o as usize + 1 == self.edges[e as usize].len() => {
              self.edges[e as usize].push(key, tokens, r.contents.get(i).copied(), slot);
              (e, o + 1)
            }
            _ => {
              let tier_root = cur.is_none() && (i > 0 || prev_key.is_some());
              let f = self.new_edge(cur);
              if tier_root {
                // A root whose key chains a parent (after a parent in another tier): the
                // parent's engine hash, for dumps.
                self.tier_roots += 1;
                let parent = if i == 0 {
                  s.parent_block_hash
                } else {
                  Some(s.block_hashes[i - 1])
                };
                if let Some(p) = parent {
                  self.root_parents.insert(f, p);
                }
              }
              let edge = &mut self.edges[f as usize];
              // The rest of the event likely goes on this edge.
              edge.keys.reserve(s.block_hashes.len() - i);
              if !r.contents.is_empty() {
                edge.contents.reserve(s.block_hashes.len() - i);
              }
              edge.push(key, tokens, r.contents.get(i).copied(), slot);
              let edges = &self.edges;
              self.by_first.get_or_insert_with(
                hash32(key),
                |x| edges[x as usize].keys.first() == Some(&key),
                || f,
              );
              (f, 0)
            }
          }
        }
      };
      self.memberships += 1;
      let engine = &mut self.workers[slot as usize].engine;
      match vacant {
        Some(v) => engine.insert_vacant(v, eh, loc(pos.0, pos.1)),
        None => engine.insert_absent(eh, loc(pos.0, pos.1)),
      }
      cur = Some(pos);
    }
    self.flush(slot, &mut pending);
    r.cur = cur;
  }

  /// Adds the worker to the pending range of blocks.
  fn flush(&mut self, slot: u32, pending: &mut Option<(u32, u32, u32)>) {
    if let Some((e, a, b)) = pending.take() {
      self.edges[e as usize].add(a, b, slot);
    }
  }

  /// A new, empty edge hanging from `parent` (a root when `None`).
  fn new_edge(&mut self, parent: Option<Pos>) -> u32 {
    let (p, off) = parent.unwrap_or((NONE, 0));
    let id = match self.free_edges.pop() {
      Some(id) => {
        self.edges[id as usize].reset(p, off);
        id
      }
      None => {
        assert!(self.edges.len() < FREED as usize, "index full");
        if self.edges.len() == self.edges.capacity() {
          // By a quarter, not double: edges are large.
          self.edges.reserve_exact(self.edges.len() / 4 + 16);
        }
        self.edges.push(Edge::new(p, off));
        (self.edges.len() - 1) as u32
      }
    };
    if p != NONE {
      self.edges[p as usize].add_kid(off, id);
    }
    id
  }

  /// Cuts the blocks no worker holds and nothing hangs from off the end of edge `e`, freeing it
  /// when none is left, and then its parent the same way.
  fn reclaim(&mut self, mut e: u32) {
    loop {
      let edge = &self.edges[e as usize];
      if edge.parent == FREED {
        return;
      }
      let kept = edge.kept_len();
      let len = edge.len();
      if kept >= len {
        return;
      }
      self.blocks -= (len - kept) as u64;
      self.token_words -= edge.tokens[kept.min(edge.tokens.len())..]
        .iter()
        .map(|t| t.len())
        .sum::<usize>();
      if kept > 0 {
        self.edges[e as usize].truncate(kept);
        return;
      }
      let (first, parent, off) = (edge.keys[0], edge.parent, edge.parent_off);
      let removed = self.by_first.remove(hash32(first), e);
      debug_assert!(removed);
      self.edges[e as usize].reset(FREED, 0);
      if !self.root_parents.is_empty() {
        self.root_parents.remove(&e);
      }
      self.free_edges.push(e);
      if parent == NONE {
        return;
      }
      self.edges[parent as usize].remove_kid(off, e);
      e = parent;
    }
  }

  fn remove(&mut self, slot: u32, block_hashes: &[u64]) {
    let engine = &self.workers[slot as usize].engine;
    for &eh in block_hashes {
      engine.prefetch(eh);
    }
    for &eh in block_hashes {
      if !self.remove_one(slot, eh) {
        self.drop_event(DropReason::UnknownRemoved, 1);
      }
    }
  }

  /// Removes engine id `eh` of the worker; false if it holds no such id.
  fn remove_one(&mut self, slot: u32, eh: u64) -> bool {
    let Some(l) = self.workers[slot as usize].engine.remove(eh) else {
      return false;
    };
    let (e, o) = unloc(l);
    let edge = &mut self.edges[e as usize];
    if o > 0 && o as usize + 1 == edge.len() {
      let words = edge.tokens.get(o as usize).map_or(0, |t| t.len());
      if edge.pop_sole(slot) {
        self.blocks -= 1;
        self.token_words -= words;
        self.memberships -= 1;
        self.reclaim(e);
        return true;
      }
    }
    let held = self.edges[e as usize].remove(o, slot);
    debug_assert!(held, "engine map and holders disagree");
    self.memberships -= 1;
    self.reclaim(e);
    true
  }

  /// The worker's clear as one step (a clear a piece at a time is `clear_piece`).
  fn clear_slot(&mut self, slot: u32) {
    self.begin(slot);
    let mut c = Clearing::of(&mut self.workers[slot as usize].engine);
    self.clear_places(slot, &mut c, usize::MAX);
  }

  /// Whether a worker dropped events (unknown parent, unsupported layout) and needs recovery.
  pub fn needs_recovery(&self, w: WorkerKey) -> bool {
    self
      .slots
      .get(&w)
      .is_some_and(|&s| self.workers[s as usize].needs_recovery)
  }

  /// The blocks the worker holds (a clear under way counts those it has not reached).
  pub fn worker_blocks(&self, w: WorkerKey) -> u64 {
    self
      .slots
      .get(&w)
      .map_or(0, |&s| self.workers[s as usize].blocks())
  }

  /// Per worker, the blocks it holds without their parent (an inner removal orphaned them):
  /// only the first block of a span can be one.
  fn unreachable(&self) -> Vec<u64> {
    let mut out = vec![0u64; self.workers.len()];
    for edge in self.edges.iter().filter(|e| e.parent != FREED) {
      for (si, span) in edge.spans.iter().enumerate() {
        let before: &[u32] = if si > 0 {
          edge.spans[si - 1].holders()
        } else if edge.parent != NONE {
          self.edges[edge.parent as usize].holders_at(edge.parent_off)
        } else {
          continue;
        };
        for &h in span.holders() {
          if before.binary_search(&h).is_err() {
            out[h as usize] += 1;
          }
        }
      }
    }
    out
  }

  pub fn stats(&self) -> IndexStats {
    let edge_bytes = self.edges.capacity() * std::mem::size_of::<Edge>()
      + self.edges.iter().map(Edge::bytes).sum::<usize>()
      + self.free_edges.capacity() * 4
      + self.token_words * 4
      // A table's slot: its key, its value and a control byte.
      + self.root_parents.capacity() * 13;
    let worker_bytes: usize = self
      .workers
      .iter()
      .map(|w| {
        let clearing = w.clearing.as_ref().map_or(0, |c| {
          std::mem::size_of::<Clearing>() + c.map.bytes() + c.done.capacity() * 8
        });
        w.engine.bytes() + clearing + std::mem::size_of::<WorkerState>()
      })
      .sum();
    let unreachable = self.unreachable();
    IndexStats {
      blocks: self.blocks,
      token_bytes: (self.token_words * 4) as u64,
      memberships: self.memberships,
      workers: self.workers.len() as u64,
      bytes: (edge_bytes + worker_bytes + self.by_first.bytes()) as u64,
      drops: DropReason::ALL
        .iter()
        .map(|&r| (r, self.drops[r as usize]))
        .collect(),
      per_worker: self
        .workers
        .iter()
        .zip(unreachable)
        .map(|(w, unreachable_blocks)| WorkerStats {
          worker: w.key,
          blocks: w.blocks(),
          unreachable_blocks,
          needs_recovery: w.needs_recovery,
        })
        .collect(),
    }
  }
}
