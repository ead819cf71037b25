//! The core index side by side with Dynamo's indexers (`dynamo-kv-router` 1.6.1): its
//! `ConcurrentRadixTreeCompressed` (CRTC) and `RadixTree`, fed the same generated events and asked
//! the same queries, in one process.
//!
//!   cargo bench -p kvplane-index-bench --bench vs_dynamo
//!
//! `VS_DYNAMO_APPLY_ONLY=1` stops each workload after the apply figures (a few seconds: for
//! comparing two builds of the index).
//!
//! Two workloads, 128 workers, 16-token blocks, 8k-token (512-block) queries:
//! - `depths`: 48 shared conversations, each held by the 32 workers of its system prompt to random
//!   depths, plus private chains and churn: a query matches 64 workers at many different depths.
//! - `today`: the core bench's workload (128 workers x 16k blocks, 8 workers holding a shared
//!   conversation at 8 depths), with queries on private conversations too.
//!
//! Measured per index: apply (block ops/s, single-threaded, the median of 5 builds of each index
//! taken in turn), `find_matches` p50/p99 per query (keys given, hashing excluded on both sides),
//! bytes per membership (one counting allocator for all), `find_matches` p99 while another thread
//! applies 1M block ops/s of churn (brought to its steady state first, on both sides), and a check
//! that every index returns the same per-worker counts on every query.
//!
//! Also, kvplane's alone: how long its writer holds the lock for each piece of an event while the
//! index is built from empty (a reader waits at most that long), on each workload and on one
//! worker storing a million blocks, whose table of engine ids grows past 16 MB.
//!
//! Hashing is counted the same way on both sides: one xxh3 per stored block. kvplane hashes a
//! stored block's tokens inside its apply; Dynamo's events carry the hash of the tokens
//! (`tokens_hash`) computed before, so its figure with hashing adds Dynamo's own
//! `compute_block_hash_for_seq` over the same tokens, timed separately.

use criterion::Criterion;
use dynamo_kv_router::indexer::concurrent_radix_tree_compressed::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{RadixTree, SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
  compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent,
  KvCacheEventData, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash,
  OverlapScores, RouterEvent,
};
use kvplane_core::codec::recover;
use kvplane_core::event::{KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::hash::{
  content_hash_seeded, hash_blocks, seq_hash, Algo, HashOptions, XXH3_SEED,
};
use kvplane_core::index::table::{LocMap, MixState};
use kvplane_core::index::{Index, IndexConfig, MatchOptions, Piecewise, WorkerKey};
use kvplane_core::router::{RouterIndex, Tier};
use kvplane_core::shared::{Shared, PIECE_BLOCKS};
use kvplane_core::stream::Recovery;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: usize = 16;
const WORKERS: u32 = 128;
/// Builds of each index per workload for the apply figures (their median is reported).
const APPLY_ROUNDS: usize = 5;
/// Passes over the queries for each reads-during-writes figure (and its idle one): 500 x 1,000
/// queries, about half a second. Ten passes (about 10 ms) gave the writer a window of some 600
/// events, and it read 0.84-0.94 M block ops/s of the 1 M asked, from starting and stopping.
const CONCURRENT_REPS: usize = 500;
/// Blocks of the one worker whose table growth the write-hold measure times.
const BIG_WORKER_BLOCKS: usize = 1 << 20;
/// Blocks of the worker whose recovery the reads-during-recovery measure times.
const RECOVERY_BLOCKS: usize = 1 << 16;

// ---- one counting allocator for every index --------------------------------------------------

/// Live heap bytes, counted only while `COUNTING` is set (a memory pass builds everything it
/// frees inside the pass, so the difference across it is what the index keeps).
static LIVE: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

struct Counting;

unsafe impl GlobalAlloc for Counting {
  unsafe fn alloc(&self, l: Layout) -> *mut u8 {
    let p = unsafe { System.alloc(l) };
    if !p.is_null() && COUNTING.load(Relaxed) {
      LIVE.fetch_add(l.size() as isize, Relaxed);
    }
    p
  }
  unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
    let p = unsafe { System.alloc_zeroed(l) };
    if !p.is_null() && COUNTING.load(Relaxed) {
      LIVE.fetch_add(l.size() as isize, Relaxed);
    }
    p
  }
  unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
    unsafe { System.dealloc(p, l) };
    if COUNTING.load(Relaxed) {
      LIVE.fetch_sub(l.size() as isize, Relaxed);
    }
  }
  unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
    let q = unsafe { System.realloc(p, l, new) };
    if !q.is_null() && COUNTING.load(Relaxed) {
      LIVE.fetch_add(new as isize - l.size() as isize, Relaxed);
    }
    q
  }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes `build` leaves live (everything else it allocates must be freed before it returns).
fn kept_bytes<T>(build: impl FnOnce() -> T) -> (T, i64) {
  let before = LIVE.load(Relaxed);
  COUNTING.store(true, Relaxed);
  let kept = build();
  let bytes = LIVE.load(Relaxed) - before;
  COUNTING.store(false, Relaxed);
  (kept, bytes as i64)
}

// ---- workloads ----------------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
  fn next(&mut self) -> u64 {
    self.0 ^= self.0 << 13;
    self.0 ^= self.0 >> 7;
    self.0 ^= self.0 << 17;
    self.0
  }
  fn below(&mut self, n: u64) -> u64 {
    self.next() % n
  }
  fn tokens(&mut self, blocks: usize) -> Vec<u32> {
    (0..blocks * BS)
      .map(|_| (self.next() % 150_000) as u32)
      .collect()
  }
}

/// A chain of blocks: its tokens and its blocks' engine ids (the same on every worker, as
/// engines with a fixed hash seed give).
struct Chain {
  tokens: Vec<u32>,
  ids: Vec<u64>,
}

impl Chain {
  fn new(rng: &mut Rng, blocks: usize) -> Chain {
    Chain {
      tokens: rng.tokens(blocks),
      ids: (0..blocks).map(|_| rng.next()).collect(),
    }
  }
}

enum Op {
  Store {
    w: u32,
    parent: Option<u64>,
    ids: Vec<u64>,
    tokens: Vec<u32>,
  },
  Remove {
    w: u32,
    ids: Vec<u64>,
  },
}

impl Op {
  fn blocks(&self) -> usize {
    match self {
      Op::Store { ids, .. } | Op::Remove { ids, .. } => ids.len(),
    }
  }
}

struct Workload {
  name: &'static str,
  ops: Vec<Op>,
  queries: Vec<Vec<u32>>,
}

/// Stores `chain[from..to]` for worker `w` under `parent` in events of `chunk` blocks.
fn store_run(
  ops: &mut Vec<Op>,
  w: u32,
  parent: Option<u64>,
  chain: &Chain,
  from: usize,
  to: usize,
  chunk: usize,
) {
  let mut parent = parent;
  let mut at = from;
  while at < to {
    let end = (at + chunk).min(to);
    ops.push(Op::Store {
      w,
      parent,
      ids: chain.ids[at..end].to_vec(),
      tokens: chain.tokens[at * BS..end * BS].to_vec(),
    });
    parent = Some(chain.ids[end - 1]);
    at = end;
  }
}

/// Interleaves per-worker event streams the way a fleet's events arrive: one event of each in
/// turn.
fn interleave(streams: Vec<Vec<Op>>, ops: &mut Vec<Op>) {
  let mut streams: Vec<std::vec::IntoIter<Op>> =
    streams.into_iter().map(|s| s.into_iter()).collect();
  loop {
    let mut any = false;
    for s in &mut streams {
      if let Some(op) = s.next() {
        ops.push(op);
        any = true;
      }
    }
    if !any {
      break;
    }
  }
}

/// Each worker's two system prompts (never the same one twice).
fn prompts_of(w: u32) -> [usize; 2] {
  let a = (w % 8) as usize;
  [a, (a + 1 + (w as usize / 8) % 7) % 8]
}

fn depths() -> Workload {
  let mut rng = Rng(0x5eed_0001);
  let prompts: Vec<Chain> = (0..8).map(|_| Chain::new(&mut rng, 32)).collect();
  let convs: Vec<Chain> = (0..48).map(|_| Chain::new(&mut rng, 480)).collect();
  let mut ops = Vec::new();
  for w in 0..WORKERS {
    for p in prompts_of(w) {
      store_run(&mut ops, w, None, &prompts[p], 0, 32, 32);
    }
  }
  // Every worker holding a conversation's prompt holds a prefix of it, to a random depth, stored
  // turn by turn (32 blocks an event); and 8 private chains of 128 blocks (16 blocks an event).
  let mut streams = Vec::new();
  let mut private: Vec<(u32, Chain, u64)> = Vec::new();
  for w in 0..WORKERS {
    let mut s = Vec::new();
    for (c, conv) in convs.iter().enumerate() {
      let p = c % 8;
      if prompts_of(w).contains(&p) {
        let depth = 1 + rng.below(480) as usize;
        store_run(
          &mut s,
          w,
          Some(*prompts[p].ids.last().unwrap()),
          conv,
          0,
          depth,
          32,
        );
      }
    }
    for _ in 0..8 {
      let p = prompts_of(w)[rng.below(2) as usize];
      let chain = Chain::new(&mut rng, 128);
      let parent = *prompts[p].ids.last().unwrap();
      store_run(&mut s, w, Some(parent), &chain, 0, 128, 16);
      private.push((w, chain, parent));
    }
    streams.push(s);
  }
  interleave(streams, &mut ops);
  // Churn: half the private chains lose their last 32 blocks and grow 32 new ones.
  for (w, chain, _) in private.iter().step_by(2) {
    ops.push(Op::Remove {
      w: *w,
      ids: chain.ids[96..].iter().rev().copied().collect(),
    });
    let grown = Chain::new(&mut rng, 32);
    store_run(&mut ops, *w, Some(chain.ids[95]), &grown, 0, 32, 16);
  }
  let queries = (0..1000)
    .map(|_| {
      let c = rng.below(48) as usize;
      let mut q = prompts[c % 8].tokens.clone();
      q.extend_from_slice(&convs[c].tokens);
      q
    })
    .collect();
  Workload {
    name: "depths",
    ops,
    queries,
  }
}

fn today() -> Workload {
  let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
  let prompts: Vec<Chain> = (0..8).map(|_| Chain::new(&mut rng, 64)).collect();
  let shared = Chain::new(&mut rng, 448);
  let mut ops = Vec::new();
  let mut convs: Vec<(usize, Chain)> = Vec::new();
  for w in 0..WORKERS {
    let mut held = 0;
    for p in prompts_of(w) {
      store_run(&mut ops, w, None, &prompts[p], 0, 64, 64);
      held += 64;
    }
    if w < 64 && w % 8 == 0 {
      // Prefixes of the shared conversation under prompt 0, at different depths.
      let depth = 56 + (w as usize / 8) * 56;
      store_run(
        &mut ops,
        w,
        Some(*prompts[0].ids.last().unwrap()),
        &shared,
        0,
        depth,
        depth,
      );
      held += depth;
    }
    while held < 16_384 {
      let n = (16_384 - held).min(256);
      let p = prompts_of(w)[rng.below(2) as usize];
      let conv = Chain::new(&mut rng, n);
      store_run(
        &mut ops,
        w,
        Some(*prompts[p].ids.last().unwrap()),
        &conv,
        0,
        n,
        16,
      );
      held += n;
      if convs.len() < 4096 && rng.below(8) == 0 {
        convs.push((p, conv));
      }
    }
  }
  let mut shared_request = prompts[0].tokens.clone();
  shared_request.extend_from_slice(&shared.tokens);
  let queries = (0..1000)
    .map(|i| {
      if i % 2 == 0 {
        return shared_request.clone();
      }
      let (p, conv) = &convs[rng.below(convs.len() as u64) as usize];
      let mut q = prompts[*p].tokens.clone();
      q.extend_from_slice(&conv.tokens);
      q.extend(rng.tokens(512 - q.len() / BS));
      q
    })
    .collect();
  Workload {
    name: "today",
    ops,
    queries,
  }
}

// ---- the indexes, fed the same events -----------------------------------------------------------

fn worker_key(w: u32) -> WorkerKey {
  WorkerKey {
    worker_id: w as u64,
    dp_rank: 0,
  }
}

fn kvplane_events(ops: &[Op]) -> Vec<(WorkerKey, KvEvent)> {
  ops
    .iter()
    .map(|op| match op {
      Op::Store {
        w,
        parent,
        ids,
        tokens,
      } => (
        worker_key(*w),
        KvEvent::Stored(StoredEvent {
          block_hashes: ids.clone(),
          parent_block_hash: *parent,
          token_ids: tokens.clone(),
          block_size: BS as u32,
          ..Default::default()
        }),
      ),
      Op::Remove { w, ids } => (
        worker_key(*w),
        KvEvent::Removed(RemovedEvent {
          block_hashes: ids.clone(),
          ..Default::default()
        }),
      ),
    })
    .collect()
}

fn dynamo_hash(tokens: &[u32]) -> Vec<LocalBlockHash> {
  compute_block_hash_for_seq(tokens, BS as u32, BlockHashOptions::default())
}

fn dynamo_events(ops: &[Op]) -> Vec<RouterEvent> {
  ops
    .iter()
    .enumerate()
    .map(|(i, op)| {
      let (w, data) = match op {
        Op::Store {
          w,
          parent,
          ids,
          tokens,
        } => (
          *w,
          KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks: ids
              .iter()
              .zip(dynamo_hash(tokens))
              .map(|(&id, tokens_hash)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(id),
                tokens_hash,
                mm_extra_info: None,
              })
              .collect(),
          }),
        ),
        Op::Remove { w, ids } => (
          *w,
          KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: ids.iter().map(|&h| ExternalSequenceBlockHash(h)).collect(),
          }),
        ),
      };
      RouterEvent::new(
        w as u64,
        KvCacheEvent {
          event_id: i as u64,
          data,
          dp_rank: 0,
        },
      )
    })
    .collect()
}

fn build_kvplane(events: &[(WorkerKey, KvEvent)]) -> Index {
  let mut ix = Index::new(IndexConfig {
    retain_tokens: false,
    ..IndexConfig::default()
  });
  for (w, ev) in events {
    ix.apply(*w, ev).unwrap();
  }
  ix
}

/// A worker's map of engine ids, for `build_floor`.
trait EngineIds: Default {
  fn get(&self, eh: u64) -> Option<u64>;
  /// Adds `eh` unless it is there.
  fn add(&mut self, eh: u64, v: u64);
  fn remove(&mut self, eh: u64);
  /// Hints the CPU to fetch where `eh` is (kvplane's apply does it for an event's blocks).
  fn prefetch(&self, _eh: u64) {}
}

impl EngineIds for LocMap {
  fn get(&self, eh: u64) -> Option<u64> {
    LocMap::get(self, eh)
  }
  fn add(&mut self, eh: u64, v: u64) {
    if let Err(vacant) = self.get_or_vacant(eh) {
      self.insert_vacant(vacant, eh, v);
    }
  }
  fn remove(&mut self, eh: u64) {
    LocMap::remove(self, eh);
  }
  fn prefetch(&self, eh: u64) {
    LocMap::prefetch(self, eh);
  }
}

impl EngineIds for HashMap<u64, u64, MixState> {
  fn get(&self, eh: u64) -> Option<u64> {
    HashMap::get(self, &eh).copied()
  }
  fn add(&mut self, eh: u64, v: u64) {
    self.entry(eh).or_insert(v);
  }
  fn remove(&mut self, eh: u64) {
    HashMap::remove(self, &eh);
  }
}

/// The least an index keyed by engine ids does per block op, with no tree at all: a stored
/// block's content key (xxh3 of its tokens chained onto its parent's key, as kvplane's apply
/// computes it) added to the worker's map of engine ids, a removed block taken out of it. What
/// is left of an index's apply past this is recording who holds which block.
fn build_floor<M: EngineIds>(events: &[(WorkerKey, KvEvent)]) -> Vec<M> {
  let mut maps: Vec<M> = (0..WORKERS).map(|_| M::default()).collect();
  for (w, ev) in events {
    let map = &mut maps[w.worker_id as usize];
    match ev {
      KvEvent::Stored(s) => {
        for &eh in &s.block_hashes {
          map.prefetch(eh);
        }
        let mut prev = s.parent_block_hash.and_then(|p| map.get(p));
        for (eh, tokens) in s.block_hashes.iter().zip(s.token_ids.chunks(BS)) {
          let c = content_hash_seeded(tokens, XXH3_SEED);
          let key = prev.map_or(c, |p| seq_hash(p, c));
          // The map's values keep their high half below u32::MAX.
          map.add(*eh, key >> 1);
          prev = Some(key >> 1);
        }
      }
      KvEvent::Removed(r) => {
        for &eh in &r.block_hashes {
          map.prefetch(eh);
        }
        for &eh in &r.block_hashes {
          map.remove(eh);
        }
      }
      _ => {}
    }
  }
  maps
}

fn build_radix(events: Vec<RouterEvent>) -> RadixTree {
  let mut t = RadixTree::new();
  for ev in events {
    let _ = t.apply_event(ev);
  }
  t
}

/// A CRTC with its event thread (which owns the per-worker lookup tables), as Dynamo's thread
/// pool runs one.
struct Crtc {
  tree: Arc<ConcurrentRadixTreeCompressed>,
  tx: flume::Sender<WorkerTask>,
  thread: Option<std::thread::JoinHandle<()>>,
}

impl Crtc {
  /// Queues `events`, then starts the event thread and waits until it has applied them all.
  fn build(events: Vec<RouterEvent>) -> Crtc {
    let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
    let (tx, rx) = flume::unbounded();
    for ev in events {
      tx.send(WorkerTask::Event(ev)).unwrap();
    }
    let t = tree.clone();
    let thread = std::thread::spawn(move || t.worker(rx, None).unwrap());
    let c = Crtc {
      tree,
      tx,
      thread: Some(thread),
    };
    c.sync();
    c
  }

  /// Returns once every event sent before has been applied.
  fn sync(&self) {
    let (resp, done) = tokio::sync::oneshot::channel();
    let marker = RouterEvent::new(
      u64::MAX,
      KvCacheEvent {
        event_id: 0,
        data: KvCacheEventData::Cleared,
        dp_rank: 0,
      },
    );
    self
      .tx
      .send(WorkerTask::EventWithAck {
        event: marker,
        resp,
      })
      .unwrap();
    let _ = done.blocking_recv();
  }
}

impl Drop for Crtc {
  fn drop(&mut self) {
    let (tx, _) = flume::unbounded();
    drop(std::mem::replace(&mut self.tx, tx));
    if let Some(t) = self.thread.take() {
      t.join().unwrap();
    }
  }
}

// ---- measures -----------------------------------------------------------------------------------

type Scores = BTreeMap<(u64, u32), u32>;

fn kvplane_scores(ix: &Index, keys: &[u64]) -> Scores {
  ix.find_matches(keys, &MatchOptions::default())
    .scores
    .into_iter()
    .filter(|s| s.1 > 0)
    .map(|(w, n)| ((w.worker_id, w.dp_rank), n))
    .collect()
}

fn dynamo_scores(s: OverlapScores) -> Scores {
  s.scores
    .into_iter()
    .filter(|s| s.1 > 0)
    .map(|(w, n)| ((w.worker_id, w.dp_rank), n))
    .collect()
}

/// Bytes each index keeps (kvplane, RadixTree, CRTC): each built again under the counting
/// allocator, then dropped.
fn kept_bytes_each(wl: &Workload) -> [i64; 3] {
  let (kv, kv_bytes) = kept_bytes(|| {
    let evs = kvplane_events(&wl.ops);
    build_kvplane(&evs)
  });
  drop(kv);
  let (radix, radix_bytes) = kept_bytes(|| build_radix(dynamo_events(&wl.ops)));
  drop(radix);
  let (crtc, crtc_bytes) = kept_bytes(|| Crtc::build(dynamo_events(&wl.ops)));
  drop(crtc);
  [kv_bytes, radix_bytes, crtc_bytes]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
  sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// p50 and p99 of `f` over `reps` passes of the queries, in µs.
fn latency(queries: usize, reps: usize, mut f: impl FnMut(usize)) -> (f64, f64) {
  let mut lat = Vec::with_capacity(queries * reps);
  for _ in 0..reps {
    for q in 0..queries {
      let t = Instant::now();
      f(q);
      lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
  }
  lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
  (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

/// Churn events for the concurrent measure: 16-block stores on 64 workers of their own, and
/// removals of the ones stored `resident` events earlier.
struct Churn {
  k: u64,
  resident: u64,
}

impl Churn {
  fn ids(k: u64) -> Vec<u64> {
    (0..16).map(|i| splitmix(k * 16 + i + 1)).collect()
  }
  fn worker(k: u64) -> u32 {
    10_000 + (k % 64) as u32
  }
  fn tokens(k: u64) -> Vec<u32> {
    let base = splitmix(!k);
    (0..16 * BS as u64)
      .map(|j| (base.wrapping_add(j * 0x9E37_79B9_7F4A_7C15) >> 16) as u32)
      .collect()
  }
  /// The next pair: store event `k`, remove event `k - resident` (once there is one).
  fn next(&mut self) -> Vec<Op> {
    let k = self.k;
    self.k += 1;
    let mut out = vec![Op::Store {
      w: Churn::worker(k),
      parent: None,
      ids: Churn::ids(k),
      tokens: Churn::tokens(k),
    }];
    if k >= self.resident {
      let gone = k - self.resident;
      out.push(Op::Remove {
        w: Churn::worker(gone),
        ids: Churn::ids(gone),
      });
    }
    out
  }
}

/// Applies `ev` a piece at a time as `Shared::apply` does, each piece timed (µs, into `holds`).
/// The `Piecewise` (and what a clear took out of the index) is dropped after the last piece, as
/// `Shared` drops it outside the lock.
fn time_pieces(ix: &mut Index, w: WorkerKey, ev: &KvEvent, holds: &mut Vec<f64>) {
  let mut p = Piecewise::new(w, ev, PIECE_BLOCKS);
  loop {
    let t = Instant::now();
    let more = ix.apply_piece(&mut p).unwrap();
    holds.push(t.elapsed().as_secs_f64() * 1e6);
    if !more {
      break;
    }
  }
}

/// Each write-lock hold of building the index from empty the way `Shared::apply` applies events
/// (`PIECE_BLOCKS` blocks a piece), timed alone, in µs and sorted: how long a reader can wait
/// behind the writer while the index grows (its tables grow inside the piece that fills them).
fn piece_holds(events: &[(WorkerKey, KvEvent)]) -> Vec<f64> {
  let mut ix = Index::new(IndexConfig {
    retain_tokens: false,
    ..IndexConfig::default()
  });
  let mut holds = Vec::with_capacity(events.len() * 4);
  for (w, ev) in events {
    time_pieces(&mut ix, *w, ev, &mut holds);
  }
  black_box(&ix);
  holds.sort_by(|a, b| a.partial_cmp(b).unwrap());
  holds
}

/// One worker storing `blocks` blocks (conversations of 256 blocks, 16 blocks an event), as an
/// engine with a large KV cache does: its table of engine ids grows to that size.
fn one_big_worker(blocks: usize) -> Vec<(WorkerKey, KvEvent)> {
  let mut rng = Rng(0xb16_b10c5);
  let mut ops = Vec::new();
  for _ in 0..blocks / 256 {
    store_run(&mut ops, 0, None, &Chain::new(&mut rng, 256), 0, 256, 16);
  }
  kvplane_events(&ops)
}

/// How long a query waits while one worker's tree dump of `blocks` blocks is recovered into a
/// router index already holding it: the recovery as one write (`one_write`) or a piece of an
/// event per write lock (`Shared::apply_recovery_msgpack`). The index also holds 63 other
/// workers of `blocks / 4` blocks each; a reader thread queries it in a loop with the worker's
/// first conversation (keys given). Returns the reader's waits during the recovery (µs, sorted)
/// and the recovery's own time (ms).
fn recovery_waits(blocks: usize, one_write: bool) -> (Vec<f64>, f64) {
  let worker = one_big_worker(blocks);
  let router = Arc::new(Shared::new(RouterIndex::new(BS as u32).unwrap()));
  for (w, ev) in &worker {
    router.apply(*w, ev).unwrap();
  }
  for other in 1..64u64 {
    for (_, ev) in one_big_worker(blocks / 4).iter().skip(other as usize) {
      let w = WorkerKey {
        worker_id: other,
        dp_rank: 0,
      };
      let _ = router.apply(w, ev);
    }
  }
  // The node's dump of the worker: an index of its blocks, tokens kept.
  let mut node = Index::new(IndexConfig::default());
  for (w, ev) in &worker {
    node.apply(*w, ev).unwrap();
  }
  let dump = recover::to_msgpack(&Recovery::TreeDump {
    workers: node.dump(),
    last_seq: 1,
    epoch: 1,
  });
  let KvEvent::Stored(first) = &worker[0].1 else {
    unreachable!()
  };
  let keys = hash_blocks(&first.token_ids, &HashOptions::new(Algo::Xxh3, BS), false)
    .unwrap()
    .hashes;
  let (go, done) = (
    Arc::new(AtomicBool::new(false)),
    Arc::new(AtomicBool::new(false)),
  );
  let reader = {
    let (router, go, done) = (router.clone(), go.clone(), done.clone());
    std::thread::spawn(move || {
      let mut waits = Vec::new();
      while !done.load(Relaxed) {
        let t = Instant::now();
        let answer = router.read().query_keys(&keys);
        let us = t.elapsed().as_secs_f64() * 1e6;
        black_box(answer);
        if go.load(Relaxed) {
          waits.push(us);
        }
      }
      waits
    })
  };
  std::thread::sleep(Duration::from_millis(20));
  go.store(true, Relaxed);
  let t = Instant::now();
  let applied = if one_write {
    router.write().apply_recovery_msgpack(0, &dump).unwrap()
  } else {
    router.apply_recovery_msgpack(0, &dump).unwrap()
  };
  let ms = t.elapsed().as_secs_f64() * 1e3;
  done.store(true, Relaxed);
  let mut waits = reader.join().unwrap();
  assert_eq!(applied.events as usize, blocks / 256);
  assert_eq!(
    router.read().tier(Tier::Device).worker_blocks(worker[0].0),
    blocks as u64
  );
  waits.sort_by(|a, b| a.partial_cmp(b).unwrap());
  (waits, ms)
}

/// The worker of `one_big_worker(blocks)` cleared: each write-lock hold of the clear applied a
/// piece at a time (µs, sorted), and the clear as one write (ms), on two indexes built alike.
fn clear_holds(blocks: usize) -> (Vec<f64>, f64) {
  let events = one_big_worker(blocks);
  let build = || {
    let mut ix = Index::new(IndexConfig {
      retain_tokens: false,
      ..IndexConfig::default()
    });
    for (w, ev) in &events {
      ix.apply(*w, ev).unwrap();
    }
    ix
  };
  let w = events[0].0;
  let mut ix = build();
  let mut holds = Vec::new();
  time_pieces(&mut ix, w, &KvEvent::Cleared, &mut holds);
  assert_eq!(ix.stats().memberships, 0);
  drop(ix);
  let mut ix = build();
  let t = Instant::now();
  ix.apply(w, &KvEvent::Cleared).unwrap();
  let whole = t.elapsed().as_secs_f64() * 1e3;
  assert_eq!(ix.stats().memberships, 0);
  holds.sort_by(|a, b| a.partial_cmp(b).unwrap());
  (holds, whole)
}

/// "p99.99 X us, max Y us (Z holds over 100 us)" of sorted holds.
fn holds_summary(h: &[f64]) -> String {
  let over = h.len() - h.partition_point(|&x| x <= 100.0);
  format!(
    "{} holds, p99 {:.2} us, p99.99 {:.1} us, max {:.0} us ({over} over 100 us)",
    h.len(),
    percentile(h, 0.99),
    percentile(h, 0.9999),
    h[h.len() - 1]
  )
}

fn splitmix(k: u64) -> u64 {
  let mut z = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
  z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
  z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
  z ^ (z >> 31)
}

/// The churn brought to its steady state: `resident` events stored and as many stored and
/// removed again, so the tables it touches have grown to their size before anything is measured
/// (both indexes get the same events).
fn warm_churn(mut apply: impl FnMut(Vec<Op>)) -> Churn {
  let mut churn = Churn {
    k: 0,
    resident: 4096,
  };
  while churn.k < 2 * churn.resident {
    apply(churn.next());
  }
  churn
}

/// Runs `apply` on a thread of its own at `ops_per_sec` block ops until `stop`, going on with
/// `churn`: each millisecond it applies that millisecond's share, then sleeps. Returns the block
/// ops applied and seconds.
fn paced_writer(
  ops_per_sec: f64,
  stop: Arc<AtomicBool>,
  mut churn: Churn,
  mut apply: impl FnMut(Vec<Op>) -> usize + Send + 'static,
) -> std::thread::JoinHandle<(usize, f64)> {
  std::thread::spawn(move || {
    let start = Instant::now();
    let mut done = 0usize;
    while !stop.load(Relaxed) {
      let due = (start.elapsed().as_secs_f64() * ops_per_sec) as usize;
      while done < due {
        done += apply(churn.next());
      }
      std::thread::sleep(Duration::from_micros(500));
    }
    (done, start.elapsed().as_secs_f64())
  })
}

struct Figures {
  apply_mops: f64,
  p50: f64,
  p99: f64,
  bytes_per_membership: f64,
}

fn report(name: &str, index: &str, f: &Figures, extra: &str) {
  println!(
    "REPORT {name} {index:<22} apply {:>6.2} M block ops/s | find_matches p50 {:>7.2} us p99 {:>7.2} us | {:>6.1} B/membership{extra}",
    f.apply_mops, f.p50, f.p99, f.bytes_per_membership
  );
}

/// The queries as kvplane's keys: the chained `xxh3` of each block (what its index is keyed by).
fn query_keys(wl: &Workload) -> Vec<Vec<u64>> {
  let opts = HashOptions::new(Algo::Xxh3, BS);
  wl.queries
    .iter()
    .map(|q| hash_blocks(q, &opts, false).unwrap().hashes)
    .collect()
}

fn run(wl: &Workload, c: &mut Criterion) {
  let name = wl.name;
  let block_ops: usize = wl.ops.iter().map(Op::blocks).sum();
  let keys = query_keys(wl);
  let locals: Vec<Vec<LocalBlockHash>> = wl.queries.iter().map(|q| dynamo_hash(q)).collect();

  // Apply, timed: kvplane (hashing inside), Dynamo's hashing, RadixTree, CRTC (events given
  // their tokens_hash). Each is built APPLY_ROUNDS times, the four in turn, and the median time
  // of each is kept: one build apiece swung the ratio by half on this VM. The last builds are
  // the ones queried.
  let kv_events = kvplane_events(&wl.ops);
  let (mut kv_t, mut hash_t, mut radix_t, mut crtc_t) = (vec![], vec![], vec![], vec![]);
  let (mut floor_t, mut floor_std_t) = (vec![], vec![]);
  let (mut kv, mut radix, mut crtc) = (None, None, None);
  for _ in 0..APPLY_ROUNDS {
    drop(kv.take());
    let t = Instant::now();
    kv = Some(build_kvplane(&kv_events));
    kv_t.push(t.elapsed().as_secs_f64());
    let t = Instant::now();
    for op in &wl.ops {
      if let Op::Store { tokens, .. } = op {
        black_box(dynamo_hash(tokens));
      }
    }
    hash_t.push(t.elapsed().as_secs_f64());
    drop(radix.take());
    let events = dynamo_events(&wl.ops);
    let t = Instant::now();
    radix = Some(build_radix(events));
    radix_t.push(t.elapsed().as_secs_f64());
    drop(crtc.take());
    let events = dynamo_events(&wl.ops);
    let t = Instant::now();
    crtc = Some(Crtc::build(events));
    crtc_t.push(t.elapsed().as_secs_f64());
    let t = Instant::now();
    black_box(build_floor::<LocMap>(&kv_events));
    floor_t.push(t.elapsed().as_secs_f64());
    let t = Instant::now();
    black_box(build_floor::<HashMap<u64, u64, MixState>>(&kv_events));
    floor_std_t.push(t.elapsed().as_secs_f64());
  }
  let [kv_secs, hash_secs, radix_secs, crtc_secs, floor_secs, floor_std_secs] =
    [kv_t, hash_t, radix_t, crtc_t, floor_t, floor_std_t].map(|mut v| {
      v.sort_by(|a, b| a.partial_cmp(b).unwrap());
      v[v.len() / 2]
    });
  let best_apply = (block_ops as f64 / (radix_secs + hash_secs))
    .max(block_ops as f64 / (crtc_secs + hash_secs))
    / 1e6;
  let memberships = kv.as_ref().unwrap().stats().memberships;
  let floor_mops = [floor_secs, floor_std_secs].map(|t| block_ops as f64 / t / 1e6);
  let floor_bytes = [
    kept_bytes(|| build_floor::<LocMap>(&kv_events)).1,
    kept_bytes(|| build_floor::<HashMap<u64, u64, MixState>>(&kv_events)).1,
  ]
  .map(|b| b as f64 / memberships as f64);
  let holds = holds_summary(&piece_holds(&kv_events));
  drop(kv_events);
  println!(
    "REPORT {name} floor (content keys + one engine-map op per block, no tree): kvplane's map {:.2} M block ops/s ({:.2}x best dynamo), {:.1} B/membership; std's HashMap {:.2} M ({:.2}x), {:.1} B/membership",
    floor_mops[0],
    floor_mops[0] / best_apply,
    floor_bytes[0],
    floor_mops[1],
    floor_mops[1] / best_apply,
    floor_bytes[1]
  );
  println!("REPORT {name} kvplane write holds while building from empty: {holds}");
  if std::env::var_os("VS_DYNAMO_APPLY_ONLY").is_some() {
    let kv_mops = block_ops as f64 / kv_secs / 1e6;
    drop((kv, radix, crtc));
    let [kv_bytes, radix_bytes, crtc_bytes] = kept_bytes_each(wl);
    println!(
      "REPORT {name} apply only: kvplane {kv_mops:.2} M block ops/s, best dynamo with hashing {best_apply:.2}: {:.2}x; memory {:.3}x",
      kv_mops / best_apply,
      kv_bytes as f64 / radix_bytes.min(crtc_bytes) as f64
    );
    return;
  }
  let (kv, radix, crtc) = (kv.unwrap(), radix.unwrap(), crtc.unwrap());

  // The same per-worker counts on every query, and how many depths they span.
  let mut depths = std::collections::HashSet::new();
  let mut matched = 0usize;
  for (k, l) in keys.iter().zip(&locals) {
    let a = kvplane_scores(&kv, k);
    let b = dynamo_scores(SyncIndexer::find_matches(&*crtc.tree, l, false));
    let r = dynamo_scores(radix.find_matches(l.clone(), false));
    assert_eq!(a, b, "{name}: kvplane and CRTC differ");
    assert_eq!(a, r, "{name}: kvplane and RadixTree differ");
    matched += a.len();
    depths.extend(a.values().copied());
  }
  println!(
    "REPORT {name}: {} events, {block_ops} block ops, {memberships} memberships; {} queries, same per-worker counts on all three indexes; {:.1} workers matched a query, at {} distinct depths",
    wl.ops.len(),
    keys.len(),
    matched as f64 / keys.len() as f64,
    depths.len()
  );

  // find_matches latency, keys given.
  let opts = MatchOptions::default();
  let kv_lat = latency(keys.len(), 20, |q| {
    black_box(kv.find_matches(&keys[q], &opts));
  });
  let crtc_lat = latency(locals.len(), 20, |q| {
    black_box(SyncIndexer::find_matches(&*crtc.tree, &locals[q], false));
  });
  let mut given: Vec<Vec<LocalBlockHash>> = Vec::new();
  let radix_lat = {
    let mut lat = Vec::new();
    for _ in 0..20 {
      given.clone_from(&locals);
      for q in given.drain(..) {
        let t = Instant::now();
        black_box(radix.find_matches(q, false));
        lat.push(t.elapsed().as_secs_f64() * 1e6);
      }
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
  };
  drop(radix);

  // Reads while another thread applies 1M block ops/s.
  let shared = Arc::new(Shared::new(kv));
  let churn = warm_churn(|ops| {
    for (w, ev) in kvplane_events(&ops) {
      shared.write().apply(w, &ev).unwrap();
    }
  });
  let idle = latency(keys.len(), CONCURRENT_REPS, |q| {
    black_box(shared.read().find_matches(&keys[q], &opts));
  });
  let stop = Arc::new(AtomicBool::new(false));
  let writer = {
    let shared = shared.clone();
    paced_writer(1e6, stop.clone(), churn, move |ops| {
      let mut n = 0;
      for (w, ev) in kvplane_events(&ops) {
        n += match &ev {
          KvEvent::Stored(s) => s.block_hashes.len(),
          KvEvent::Removed(r) => r.block_hashes.len(),
          _ => 0,
        };
        shared.apply(w, &ev).unwrap();
      }
      n
    })
  };
  let busy = latency(keys.len(), CONCURRENT_REPS, |q| {
    black_box(shared.read().find_matches(&keys[q], &opts));
  });
  stop.store(true, Relaxed);
  let (ops, secs) = writer.join().unwrap();
  println!(
    "REPORT {name} kvplane reads during writes: writer {:.2} M block ops/s; find_matches p50 {:.2} us p99 {:.2} us, idle p99 {:.2} us: {:.2}x idle (target <= 2)",
    ops as f64 / secs / 1e6,
    busy.0,
    busy.1,
    idle.1,
    busy.1 / idle.1
  );
  let churn = warm_churn(|ops| {
    for ev in dynamo_events(&ops) {
      crtc.tx.send(WorkerTask::Event(ev)).unwrap();
    }
  });
  crtc.sync();
  let crtc_idle = latency(locals.len(), CONCURRENT_REPS, |q| {
    black_box(SyncIndexer::find_matches(&*crtc.tree, &locals[q], false));
  });
  let stop = Arc::new(AtomicBool::new(false));
  let writer = {
    let tx = crtc.tx.clone();
    paced_writer(1e6, stop.clone(), churn, move |ops| {
      let n = ops.iter().map(Op::blocks).sum();
      for ev in dynamo_events(&ops) {
        tx.send(WorkerTask::Event(ev)).unwrap();
      }
      n
    })
  };
  let crtc_busy = latency(locals.len(), CONCURRENT_REPS, |q| {
    black_box(SyncIndexer::find_matches(&*crtc.tree, &locals[q], false));
  });
  stop.store(true, Relaxed);
  let (ops, secs) = writer.join().unwrap();
  crtc.sync();
  println!(
    "REPORT {name} dynamo CRTC reads during writes: writer {:.2} M block ops/s; find_matches p50 {:.2} us p99 {:.2} us, idle p99 {:.2} us: {:.2}x idle",
    ops as f64 / secs / 1e6,
    crtc_busy.0,
    crtc_busy.1,
    crtc_idle.1,
    crtc_busy.1 / crtc_idle.1
  );

  // Criterion: the same queries in turn.
  let mut g = c.benchmark_group(format!("find_matches/{name}"));
  let mut i = 0;
  g.bench_function("kvplane", |b| {
    b.iter(|| {
      i = (i + 1) % keys.len();
      black_box(shared.read().find_matches(&keys[i], &opts))
    })
  });
  g.bench_function("dynamo_crtc", |b| {
    b.iter(|| {
      i = (i + 1) % locals.len();
      black_box(SyncIndexer::find_matches(&*crtc.tree, &locals[i], false))
    })
  });
  g.finish();

  drop((shared, crtc));

  let [kv_bytes, radix_bytes, crtc_bytes] = kept_bytes_each(wl);

  let per = |b: i64| b as f64 / memberships as f64;
  let kv_f = Figures {
    apply_mops: block_ops as f64 / kv_secs / 1e6,
    p50: kv_lat.0,
    p99: kv_lat.1,
    bytes_per_membership: per(kv_bytes),
  };
  let radix_f = Figures {
    apply_mops: block_ops as f64 / radix_secs / 1e6,
    p50: radix_lat.0,
    p99: radix_lat.1,
    bytes_per_membership: per(radix_bytes),
  };
  let crtc_f = Figures {
    apply_mops: block_ops as f64 / crtc_secs / 1e6,
    p50: crtc_lat.0,
    p99: crtc_lat.1,
    bytes_per_membership: per(crtc_bytes),
  };
  let with_hash = |secs: f64| {
    format!(
      " | apply with hashing {:.2} M/s",
      block_ops as f64 / (secs + hash_secs) / 1e6
    )
  };
  report(name, "kvplane", &kv_f, " (hashing inside)");
  report(name, "dynamo RadixTree", &radix_f, &with_hash(radix_secs));
  report(name, "dynamo CRTC", &crtc_f, &with_hash(crtc_secs));
  println!(
    "REPORT {name} ratios: find_matches p99 kvplane/best dynamo {:.2}x (target <= 1); apply kvplane/best dynamo with hashing {:.2}x (target >= 1.5); memory kvplane/best dynamo {:.2}x (target <= 0.5)",
    kv_f.p99 / radix_f.p99.min(crtc_f.p99),
    kv_f.apply_mops / best_apply,
    kv_f.bytes_per_membership / radix_f.bytes_per_membership.min(crtc_f.bytes_per_membership),
  );
}

/// `VS_DYNAMO_PROFILE=find|apply|churn|holds|recovery|floor|floor_std[_today]`: only kvplane's side of one measure
/// (or the floor, with kvplane's map or std's) on the `depths` workload (`today` with the
/// suffix), in a loop for a profiler, with its rate.
fn profile(what: &str) {
  let (what, wl) = match what.strip_suffix("_today") {
    Some(w) => (w, today()),
    None => (what, depths()),
  };
  let keys = query_keys(&wl);
  let evs = kvplane_events(&wl.ops);
  let block_ops: usize = wl.ops.iter().map(Op::blocks).sum();
  if what == "floor" || what == "floor_std" {
    let (t, mut builds) = (Instant::now(), 0);
    while t.elapsed() < Duration::from_secs(6) {
      if what == "floor" {
        black_box(build_floor::<LocMap>(&evs));
      } else {
        black_box(build_floor::<HashMap<u64, u64, MixState>>(&evs));
      }
      builds += 1;
    }
    eprintln!(
      "{what}: {:.2} M block ops/s",
      (builds * block_ops) as f64 / t.elapsed().as_secs_f64() / 1e6
    );
    return;
  }
  if what == "recovery" {
    for _ in 0..3 {
      for one_write in [true, false] {
        let (waits, ms) = recovery_waits(RECOVERY_BLOCKS, one_write);
        eprintln!(
          "recovery ({ms:.1} ms, one write {one_write}): {} queries, p99 {:.1} us, max {:.0} us",
          waits.len(),
          percentile(&waits, 0.99),
          waits[waits.len() - 1]
        );
      }
    }
    return;
  }
  if what == "holds" {
    for _ in 0..3 {
      eprintln!("holds: {}", holds_summary(&piece_holds(&evs)));
    }
    let big = one_big_worker(BIG_WORKER_BLOCKS);
    for _ in 0..3 {
      eprintln!(
        "holds, one big worker: {}",
        holds_summary(&piece_holds(&big))
      );
    }
    for _ in 0..3 {
      let (holds, whole) = clear_holds(BIG_WORKER_BLOCKS);
      eprintln!(
        "its clear: as one write {whole:.1} ms; in pieces {}",
        holds_summary(&holds)
      );
    }
    return;
  }
  let (t, mut builds) = (Instant::now(), 1);
  let mut kv = build_kvplane(&evs);
  while what == "apply" && t.elapsed() < Duration::from_secs(6) {
    kv = build_kvplane(&evs);
    builds += 1;
  }
  if what == "churn" {
    // The events of the reads-during-writes measure, each timed alone: how long a reader can
    // wait behind one.
    let mut churn = warm_churn(|ops| {
      for (w, ev) in kvplane_events(&ops) {
        kv.apply(w, &ev).unwrap();
      }
    });
    let (mut store, mut remove) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(6) {
      for (w, ev) in kvplane_events(&churn.next()) {
        let s = Instant::now();
        kv.apply(w, &ev).unwrap();
        let us = s.elapsed().as_secs_f64() * 1e6;
        match ev {
          KvEvent::Stored(_) => store.push(us),
          _ => remove.push(us),
        }
      }
    }
    for (name, v) in [("store", &mut store), ("remove", &mut remove)] {
      v.sort_by(|a, b| a.partial_cmp(b).unwrap());
      eprintln!(
        "churn {name}: {} events, p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.1} us",
        v.len(),
        percentile(v, 0.5),
        percentile(v, 0.99),
        percentile(v, 0.999),
        v[v.len() - 1]
      );
    }
    return;
  }
  if what == "apply" {
    eprintln!(
      "apply: {:.2} M block ops/s ({} block ops)",
      (builds * block_ops) as f64 / t.elapsed().as_secs_f64() / 1e6,
      builds * block_ops
    );
    return;
  }
  let opts = MatchOptions::default();
  let (t, mut n) = (Instant::now(), 0);
  while t.elapsed() < Duration::from_secs(10) {
    for k in &keys {
      black_box(kv.find_matches(k, &opts));
    }
    n += keys.len();
  }
  eprintln!(
    "find_matches: {:.2} us a query",
    t.elapsed().as_secs_f64() * 1e6 / n as f64
  );
  let shared = Shared::new(kv);
  let (t, mut n) = (Instant::now(), 0);
  while t.elapsed() < Duration::from_secs(5) {
    for k in &keys {
      black_box(shared.read().find_matches(k, &opts));
    }
    n += keys.len();
  }
  eprintln!(
    "find_matches through Shared: {:.2} us a query",
    t.elapsed().as_secs_f64() * 1e6 / n as f64
  );
}

fn main() {
  if let Ok(what) = std::env::var("VS_DYNAMO_PROFILE") {
    return profile(&what);
  }
  let mut c = Criterion::default()
    .sample_size(10)
    .measurement_time(Duration::from_secs(2))
    .warm_up_time(Duration::from_millis(500))
    .configure_from_args();
  for make in [depths as fn() -> Workload, today] {
    let t = Instant::now();
    let wl = make();
    eprintln!(
      "{}: generated in {:.1}s",
      wl.name,
      t.elapsed().as_secs_f64()
    );
    run(&wl, &mut c);
  }
  let big = one_big_worker(BIG_WORKER_BLOCKS);
  println!(
    "REPORT one worker storing {BIG_WORKER_BLOCKS} blocks, write holds: {}",
    holds_summary(&piece_holds(&big))
  );
  let (holds, whole) = clear_holds(BIG_WORKER_BLOCKS);
  println!(
    "REPORT that worker cleared: as one write {whole:.1} ms; a piece at a time, write holds: {}",
    holds_summary(&holds)
  );
  for one_write in [true, false] {
    let (waits, ms) = recovery_waits(RECOVERY_BLOCKS, one_write);
    println!(
      "REPORT recovering one worker's tree dump of {RECOVERY_BLOCKS} blocks ({ms:.1} ms) {}: a query's wait meanwhile: {} queries, p99 {:.1} us, max {:.0} us",
      if one_write { "as one write" } else { "a piece per write" },
      waits.len(),
      percentile(&waits, 0.99),
      waits[waits.len() - 1]
    );
  }
  c.final_summary();
}
