//! The multi-worker KV block index (docs/architecture.md#index-semantics).
//!
//! Blocks are keyed by their chained `xxh3` content hash, computed here from each stored event's
//! tokens, so routers match any engine without knowing its hash algorithm (`KeyBy::Engine` keys
//! by the engine's hash instead, for hash-only events). Each worker keeps a map from the engine's
//! opaque block hash to the indexed block, for parent lookup and removal.
//!
//! Removing an inner block leaves the worker's descendants of it unreachable for matching (a
//! match counts consecutive leading blocks). They stay indexed and counted
//! (`unreachable_blocks`) until the engine removes them or clears, and that worker is matched by
//! an exact scan until then. Nodes no worker holds are reclaimed as
//! soon as no other node chains from them, so nothing leaks.

mod dump;
mod matching;
mod node;
mod sets;
pub mod table;

pub use dump::{DumpEvent, WorkerDump};
pub use matching::{MatchOptions, Matches};

use crate::error::{KvError, KvResult};
use crate::event::{check_layout, KvEvent, StoredEvent};
use crate::hash::{content_hash_seeded, seq_hash, XXH3_SEED};
use node::{Node, Wide, NONE};
use sets::Sets;
use std::collections::HashMap;
use table::{hash32, TagMap, U64Map};

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

#[derive(Debug, Clone, Copy)]
pub struct IndexConfig {
  pub key_by: KeyBy,
  /// Keep each block's tokens (for tree dumps consumers can content-hash).
  pub retain_tokens: bool,
}

impl Default for IndexConfig {
  fn default() -> Self {
    IndexConfig {
      key_by: KeyBy::Content,
      retain_tokens: true,
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
  /// Engine block hash -> node.
  pub engine: U64Map,
  /// Whether `unreachable` is 0, so every block the worker holds has its parent held too (false
  /// may also mean the count is above the blocks it counts, see there).
  pub prefix_closed: bool,
  pub needs_recovery: bool,
  /// Blocks held whose parent is not (an inner removal orphaned them). Never below their number:
  /// a parent stored again while its orphans are held can leave it above, until a clear. Zero
  /// means prefix-closed.
  pub unreachable: u64,
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
  /// Distinct indexed blocks (nodes).
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
}

impl<'a> StoredBlocks<'a> {
  pub fn of(s: &'a StoredEvent) -> StoredBlocks<'a> {
    StoredBlocks {
      block_hashes: &s.block_hashes,
      parent_block_hash: s.parent_block_hash,
      token_ids: &s.token_ids,
      block_size: s.block_size,
    }
  }
}

pub struct Index {
  cfg: IndexConfig,
  nodes: Vec<Node>,
  /// Free list threaded through the freed nodes' `key`.
  free_head: u32,
  free_len: u32,
  /// Key -> node, by `hash32(key)`; the key itself is in the node.
  by_key: TagMap,
  /// `child_nodes` counters past u16.
  wide_children: Wide,
  sets: Sets,
  tokens: Vec<Box<[u32]>>,
  /// Token ids held in `tokens`, kept as we go so `stats` is O(workers).
  token_words: usize,
  workers: Vec<WorkerState>,
  slots: HashMap<WorkerKey, u32>,
  /// The slot `slot()` found last.
  last_slot: Option<(WorkerKey, u32)>,
  memberships: u64,
  /// Workers that are not prefix-closed (matched by exact scan).
  open_workers: u32,
  drops: [u64; 4],
  /// Reused buffers of `store` and `remove`.
  scratch_keys: Vec<u64>,
  scratch_nodes: Vec<u32>,
}

impl Index {
  pub fn new(cfg: IndexConfig) -> Index {
    Index {
      cfg,
      nodes: Vec::new(),
      free_head: NONE,
      free_len: 0,
      by_key: TagMap::default(),
      wide_children: Wide::default(),
      sets: Sets::default(),
      tokens: Vec::new(),
      token_words: 0,
      workers: Vec::new(),
      slots: HashMap::new(),
      last_slot: None,
      memberships: 0,
      open_workers: 0,
      drops: [0; 4],
      scratch_keys: Vec::new(),
      scratch_nodes: Vec::new(),
    }
  }

  pub fn config(&self) -> IndexConfig {
    self.cfg
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
      engine: U64Map::default(),
      prefix_closed: true,
      needs_recovery: false,
      unreachable: 0,
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
    let n = self.workers[slot as usize].engine.get(eh)?;
    Some(self.nodes[n as usize].key)
  }

  /// Workers known to the index (held blocks or not).
  pub fn workers(&self) -> impl Iterator<Item = WorkerKey> + '_ {
    self.workers.iter().map(|w| w.key)
  }

  /// Applies a removed event given as its block hashes: as `apply` would.
  pub fn remove_blocks(&mut self, w: WorkerKey, block_hashes: &[u64]) {
    let slot = self.slot(w);
    self.remove(slot, block_hashes);
  }

  /// Whether a stored event's tokens split into `block_size` x hashes (`Err` says why not).
  pub fn check_layout(&self, s: &StoredEvent) -> KvResult<()> {
    s.check_layout(self.cfg.key_by == KeyBy::Engine)
  }

  fn store(
    &mut self,
    slot: u32,
    s: StoredBlocks<'_>,
    seed: u64,
    parent_elsewhere: impl FnOnce(u64) -> Option<u64>,
  ) -> KvResult<()> {
    let layout = check_layout(
      s.block_hashes.len(),
      s.token_ids.len(),
      s.block_size,
      self.cfg.key_by == KeyBy::Engine,
    );
    if let Err(e) = layout {
      self.drop_event(DropReason::UnsupportedLayout, 1);
      self.clear_slot(slot);
      self.workers[slot as usize].needs_recovery = true;
      return Err(e);
    }
    let (mut prev, prev_key) = match s.parent_block_hash {
      None => (NONE, None),
      Some(p) => match self.workers[slot as usize].engine.get(p) {
        Some(n) => (n, Some(self.nodes[n as usize].key)),
        None => match parent_elsewhere(p) {
          Some(key) => (NONE, Some(key)),
          None => {
            self.drop_event(DropReason::UnknownParent, 1);
            self.workers[slot as usize].needs_recovery = true;
            return Ok(());
          }
        },
      },
    };
    let bs = s.block_size as usize;
    // Keys first (pure computation), then prefetch every slot this event will probe, so the
    // cache misses overlap instead of queueing one after another.
    let mut keys = std::mem::take(&mut self.scratch_keys);
    keys.clear();
    let mut chain = prev_key;
    for (i, &eh) in s.block_hashes.iter().enumerate() {
      let key = match self.cfg.key_by {
        KeyBy::Engine => eh,
        KeyBy::Content => {
          let tokens = &s.token_ids[i * bs..(i + 1) * bs];
          let c = content_hash_seeded(tokens, seed);
          chain.map_or(c, |p| seq_hash(p, c))
        }
      };
      keys.push(key);
      chain = Some(key);
    }
    for (&eh, &key) in s.block_hashes.iter().zip(&keys) {
      self.workers[slot as usize].engine.prefetch(eh);
      self.by_key.prefetch(hash32(key));
    }
    for (i, (&eh, &key)) in s.block_hashes.iter().zip(&keys).enumerate() {
      let tokens = if s.token_ids.is_empty() {
        &[][..]
      } else {
        &s.token_ids[i * bs..(i + 1) * bs]
      };
      if let Some(existing) = self.workers[slot as usize].engine.get(eh) {
        if self.nodes[existing as usize].key == key {
          self.drop_event(DropReason::DuplicateStore, 1);
          prev = existing;
          continue;
        }
        // The engine reused an id for other content: the old block is gone.
        self.remove_one(slot, eh);
      }
      let node = self.node_for(key, prev);
      if self.cfg.retain_tokens && self.tokens[node as usize].is_empty() && !tokens.is_empty() {
        self.tokens[node as usize] = tokens.into();
        self.token_words += tokens.len();
      }
      if !self.sets.insert(&mut self.nodes[node as usize], node, slot) {
        // The worker already holds this block under another engine id: one membership, one id.
        self.drop_event(DropReason::DuplicateStore, 1);
        prev = node;
        continue;
      }
      self.memberships += 1;
      if prev != NONE {
        self
          .sets
          .bump_kids(&mut self.nodes[prev as usize], prev, slot, true);
      }
      self.workers[slot as usize].engine.insert_absent(eh, node);
      prev = node;
    }
    self.scratch_keys = keys;
    Ok(())
  }

  fn node_for(&mut self, key: u64, parent: u32) -> u32 {
    let next = match self.free_head {
      NONE => self.nodes.len() as u32,
      i => i,
    };
    let nodes = &self.nodes;
    let (idx, created) =
      self
        .by_key
        .get_or_insert_with(hash32(key), |n| nodes[n as usize].key == key, || next);
    if !created {
      return idx;
    }
    let node = Node::new(key, parent);
    if self.free_head != NONE {
      self.free_head = self.nodes[idx as usize].key as u32;
      self.free_len -= 1;
      self.nodes[idx as usize] = node;
    } else {
      self.push_node(node);
    }
    if parent != NONE {
      let p = &mut self.nodes[parent as usize];
      p.child_nodes = self.wide_children.incr(p.child_nodes, parent);
    }
    idx
  }

  /// Appends a node, growing the slab by a sixteenth at a time (not doubling).
  fn push_node(&mut self, node: Node) {
    if self.nodes.len() == self.nodes.capacity() {
      let extra = (self.nodes.capacity() / 16).max(1024);
      self.nodes.reserve_exact(extra);
      if self.cfg.retain_tokens {
        self.tokens.reserve_exact(extra);
      }
    }
    assert!(self.nodes.len() < node::FREED as usize, "index full");
    self.nodes.push(node);
    if self.cfg.retain_tokens {
      self.tokens.push(Box::default());
    }
  }

  /// Frees `n` and then its ancestors while they have no workers and no child nodes.
  fn reclaim(&mut self, mut n: u32) {
    while n != NONE {
      let node = self.nodes[n as usize];
      if node.parent == node::FREED || node.set != node::EMPTY || node.child_nodes != 0 {
        return;
      }
      let removed = self.by_key.remove(hash32(node.key), n);
      debug_assert!(removed);
      if let Some(t) = self.tokens.get_mut(n as usize) {
        self.token_words -= t.len();
        *t = Box::default();
      }
      self.nodes[n as usize] = Node::freed(self.free_head);
      self.free_head = n;
      self.free_len += 1;
      if node.parent != NONE {
        let p = &mut self.nodes[node.parent as usize];
        p.child_nodes = self.wide_children.decr(p.child_nodes, node.parent);
      }
      n = node.parent;
    }
  }

  fn remove(&mut self, slot: u32, block_hashes: &[u64]) {
    // Take every block out of the engine map first (its buckets prefetched together), then
    // prefetch the nodes they name and the key slots reclaim will probe; then remove the blocks
    // in order. Equivalent to removing them one by one: a removal touches no other engine id.
    let engine = &mut self.workers[slot as usize].engine;
    for &eh in block_hashes {
      engine.prefetch(eh);
    }
    let mut nodes = std::mem::take(&mut self.scratch_nodes);
    nodes.clear();
    nodes.extend(
      block_hashes
        .iter()
        .map(|&eh| engine.remove(eh).unwrap_or(NONE)),
    );
    for &n in nodes.iter().filter(|&&n| n != NONE) {
      table::prefetch_read(std::ptr::addr_of!(self.nodes[n as usize]).cast());
    }
    for &n in nodes.iter().filter(|&&n| n != NONE) {
      self.by_key.prefetch(hash32(self.nodes[n as usize].key));
    }
    for &n in &nodes {
      if n == NONE {
        self.drop_event(DropReason::UnknownRemoved, 1);
      } else {
        self.remove_node(slot, n);
      }
    }
    self.scratch_nodes = nodes;
  }

  /// Removes engine id `eh` of the worker; false if it holds no such id.
  fn remove_one(&mut self, slot: u32, eh: u64) -> bool {
    match self.workers[slot as usize].engine.remove(eh) {
      Some(node) => {
        self.remove_node(slot, node);
        true
      }
      None => false,
    }
  }

  /// Takes the worker out of `node`, whose engine id was just removed from its engine map.
  fn remove_node(&mut self, slot: u32, node: u32) {
    let Some(kids) = self.sets.remove(&mut self.nodes[node as usize], node, slot) else {
      debug_assert!(false, "engine map and worker sets disagree");
      return;
    };
    self.memberships -= 1;
    let w = &mut self.workers[slot as usize];
    if kids > 0 {
      w.unreachable += kids as u64;
      if w.prefix_closed {
        w.prefix_closed = false;
        self.open_workers += 1;
      }
    }
    let parent = self.nodes[node as usize].parent;
    let parent_held = parent != NONE
      && self
        .sets
        .bump_kids(&mut self.nodes[parent as usize], parent, slot, false);
    let w = &mut self.workers[slot as usize];
    if parent != NONE && !parent_held {
      // This block was itself unreachable.
      w.unreachable = w.unreachable.saturating_sub(1);
    }
    if !w.prefix_closed && w.unreachable == 0 {
      // Its last unreachable block is gone: prefix-closed again (the count never falls below
      // the blocks held without their parent, so none is left).
      w.prefix_closed = true;
      self.open_workers -= 1;
    }
    self.reclaim(node);
  }

  fn clear_slot(&mut self, slot: u32) {
    let engine = std::mem::take(&mut self.workers[slot as usize].engine);
    for (_, node) in engine.iter() {
      if self
        .sets
        .remove(&mut self.nodes[node as usize], node, slot)
        .is_some()
      {
        self.memberships -= 1;
      }
    }
    for (_, node) in engine.iter() {
      self.reclaim(node);
    }
    let w = &mut self.workers[slot as usize];
    if !w.prefix_closed {
      self.open_workers -= 1;
    }
    w.prefix_closed = true;
    w.needs_recovery = false;
    w.unreachable = 0;
  }

  /// Whether a worker dropped events (unknown parent, unsupported layout) and needs recovery.
  pub fn needs_recovery(&self, w: WorkerKey) -> bool {
    self
      .slots
      .get(&w)
      .is_some_and(|&s| self.workers[s as usize].needs_recovery)
  }

  pub fn worker_blocks(&self, w: WorkerKey) -> u64 {
    self
      .slots
      .get(&w)
      .map_or(0, |&s| self.workers[s as usize].engine.len() as u64)
  }

  pub fn stats(&self) -> IndexStats {
    let node_bytes = self.nodes.capacity() * std::mem::size_of::<Node>()
      + self.wide_children.bytes()
      + self.tokens.capacity() * std::mem::size_of::<Box<[u32]>>()
      + self.token_words * 4;
    let worker_bytes: usize = self
      .workers
      .iter()
      .map(|w| w.engine.bytes() + std::mem::size_of::<WorkerState>())
      .sum();
    IndexStats {
      blocks: (self.nodes.len() - self.free_len as usize) as u64,
      token_bytes: (self.token_words * 4) as u64,
      memberships: self.memberships,
      workers: self.workers.len() as u64,
      bytes: (node_bytes + worker_bytes + self.by_key.bytes() + self.sets.bytes()) as u64,
      drops: DropReason::ALL
        .iter()
        .map(|&r| (r, self.drops[r as usize]))
        .collect(),
      per_worker: self
        .workers
        .iter()
        .map(|w| WorkerStats {
          worker: w.key,
          blocks: w.engine.len() as u64,
          unreachable_blocks: w.unreachable,
          needs_recovery: w.needs_recovery,
        })
        .collect(),
    }
  }
}
