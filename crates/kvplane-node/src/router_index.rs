//! `NativeRouterIndex`: the core `RouterIndex` for a router on the JS thread, its inputs and
//! outputs converted. Payloads cross as bytes; query results as typed arrays.

use crate::convert::bigint_u64;
use crate::error::{guard_js, Code};
use crate::hash::tokens_of;
use crate::outputs::DropCount;
use kvplane_core::codec::Dialect;
use kvplane_core::router::{Numbered, QueryAnswer, RouterIndex};
use kvplane_core::shared::{RwLockReadGuard, Shared};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::Arc;

#[napi(object)]
pub struct RouterAppliedOut {
  /// `applied`, `duplicate` or `gap`.
  pub outcome: String,
  pub seq: BigInt,
  pub events: u32,
  pub unknown_events: u32,
  pub layout_errors: u32,
  /// An SMG snapshot chunk: the chunks of its snapshot still to come (0 otherwise).
  pub snapshot_rest: f64,
}

#[napi(object)]
pub struct RouterRecoveryOut {
  pub kind: String,
  pub last_seq: BigInt,
  pub epoch: BigInt,
  pub next_start: Option<BigInt>,
  pub events: u32,
}

/// Per worker holding the request's first block in some tier: parallel arrays, in blocks.
#[napi(object)]
pub struct RouterMatchesOut {
  pub worker_ids: BigUint64Array,
  pub dp_ranks: Uint32Array,
  pub device: Uint32Array,
  pub host: Uint32Array,
  pub disk: Uint32Array,
  pub tree_sizes: BigUint64Array,
}

#[napi(object)]
pub struct RouterDumpSegmentOut {
  pub tier: String,
  pub worker_id: BigInt,
  pub dp_rank: u32,
  pub parent: Option<BigInt>,
  pub block_hashes: BigUint64Array,
  /// Each block's own content hash (Dynamo's `tokens_hash`): when the index keeps them.
  pub content_hashes: BigUint64Array,
  /// Each block's key.
  pub keys: BigUint64Array,
}

#[napi(object)]
pub struct RouterTierStatsOut {
  pub tier: String,
  pub blocks: f64,
  pub memberships: f64,
  pub bytes: f64,
}

#[napi(object)]
pub struct RouterWorkerStatsOut {
  pub worker_id: BigInt,
  pub dp_rank: u32,
  pub tier: String,
  pub blocks: f64,
  pub needs_recovery: bool,
}

#[napi(object)]
pub struct RouterStatsOut {
  pub tiers: Vec<RouterTierStatsOut>,
  pub workers: Vec<RouterWorkerStatsOut>,
  pub drops: Vec<DropCount>,
  /// Engine events applied, by kind (`stored`, `removed`, `cleared`) and outcome.
  pub events: Vec<RouterEventCountOut>,
}

#[napi(object)]
pub struct RouterEventCountOut {
  pub kind: String,
  pub outcome: String,
  pub count: f64,
}

fn matches_out(a: QueryAnswer) -> RouterMatchesOut {
  let s = &a.scores;
  RouterMatchesOut {
    worker_ids: BigUint64Array::new(s.iter().map(|w| w.worker.worker_id).collect()),
    dp_ranks: Uint32Array::new(s.iter().map(|w| w.worker.dp_rank).collect()),
    device: Uint32Array::new(s.iter().map(|w| w.device).collect()),
    host: Uint32Array::new(s.iter().map(|w| w.host).collect()),
    disk: Uint32Array::new(s.iter().map(|w| w.disk).collect()),
    tree_sizes: BigUint64Array::new(s.iter().map(|w| w.tree_size).collect()),
  }
}

#[napi]
pub struct NativeRouterIndex {
  /// Shared with the ZMQ links that apply to it on the link thread (`followZmq`). Every apply,
  /// a recovery's too, takes the write lock per piece of an event (`Shared::apply`).
  inner: Arc<Shared<RouterIndex>>,
}

impl NativeRouterIndex {
  fn ix(&self) -> RwLockReadGuard<'_, RouterIndex> {
    self.inner.read()
  }

  pub(crate) fn shared(&self) -> Arc<Shared<RouterIndex>> {
    self.inner.clone()
  }
}

#[napi]
impl NativeRouterIndex {
  /// `keep_content_hashes`: each block's own content hash is kept (8 bytes a block), for dumps.
  #[napi(constructor)]
  pub fn new(block_size: u32, keep_content_hashes: Option<bool>) -> Result<Self, Code> {
    guard_js(|| {
      let keep = keep_content_hashes.unwrap_or(false);
      Ok(NativeRouterIndex {
        inner: Arc::new(Shared::new(RouterIndex::with_content_hashes(
          block_size, keep,
        )?)),
      })
    })
  }

  #[napi(getter)]
  pub fn block_size(&self) -> u32 {
    self.ix().block_size()
  }

  /// Decodes a payload of `dialect` and applies it to worker `worker_id`, under each batch's own
  /// DP rank or `rank`. Nothing is applied if it does not decode.
  #[napi]
  pub fn apply_payload(
    &self,
    worker_id: BigInt,
    rank: u32,
    bytes: &[u8],
    dialect: String,
  ) -> Result<RouterAppliedOut, Code> {
    guard_js(|| {
      let id = bigint_u64("workerId", &worker_id)?;
      let a = self
        .inner
        .apply_payload(id, rank, bytes, Dialect::parse(&dialect)?)?;
      Ok(applied_out("applied", a))
    })
  }

  /// `apply_payload` for several payloads in order (a subscription's batches that arrived
  /// together): the events applied. All are decoded first: one that does not decode is an error
  /// naming it, and nothing was applied.
  #[napi]
  pub fn apply_payloads(
    &self,
    worker_id: BigInt,
    rank: u32,
    payloads: Vec<&[u8]>,
    dialect: String,
  ) -> Result<u32, Code> {
    guard_js(|| {
      let id = bigint_u64("workerId", &worker_id)?;
      self
        .inner
        .apply_payloads(id, rank, &payloads, Dialect::parse(&dialect)?)
    })
  }

  /// An SMG `KvEventBatch`, applied only when its seq is `expected` (any seq when absent).
  #[napi]
  pub fn apply_numbered(
    &self,
    worker_id: BigInt,
    rank: u32,
    bytes: &[u8],
    expected: Option<BigInt>,
  ) -> Result<RouterAppliedOut, Code> {
    guard_js(|| {
      let id = bigint_u64("workerId", &worker_id)?;
      let expected = expected.map(|e| bigint_u64("expected", &e)).transpose()?;
      Ok(
        match self.inner.apply_numbered(id, rank, bytes, expected)? {
          Numbered::Applied(a) => applied_out("applied", a),
          Numbered::Duplicate(seq) => skipped_out("duplicate", seq),
          Numbered::Gap(seq) => skipped_out("gap", seq),
        },
      )
    })
  }

  /// Applies a node's `/kv_recover` answer (msgpack) to worker `worker_id`: decoded outside the
  /// lock, then a write lock per piece of an event (`Shared::<RouterIndex>::apply_recovery_msgpack`).
  #[napi]
  pub fn apply_recovery(&self, worker_id: BigInt, bytes: &[u8]) -> Result<RouterRecoveryOut, Code> {
    guard_js(|| {
      let id = bigint_u64("workerId", &worker_id)?;
      let r = self.inner.apply_recovery_msgpack(id, bytes)?;
      Ok(RouterRecoveryOut {
        kind: r.kind.to_string(),
        last_seq: BigInt::from(r.last_seq),
        epoch: BigInt::from(r.epoch),
        next_start: r.next_start.map(BigInt::from),
        events: r.events,
      })
    })
  }

  /// Drops every block of worker `worker_id` (only DP rank `rank` when given), in every tier.
  #[napi]
  pub fn clear_worker(&self, worker_id: BigInt, rank: Option<u32>) -> Result<(), Code> {
    guard_js(|| {
      let id = bigint_u64("workerId", &worker_id)?;
      self.inner.clear_worker(id, rank);
      Ok(())
    })
  }

  /// Token ids as a `Uint32Array`, or numbers (checked here: integers in 0..=2^32-1).
  #[napi]
  pub fn query(
    &self,
    tokens: Either<Uint32Array, Float64Array>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
  ) -> Result<RouterMatchesOut, Code> {
    guard_js(|| {
      let tokens = tokens_of(&tokens)?;
      Ok(matches_out(self.ix().query(
        &tokens,
        lora_name.as_deref(),
        cache_salt.as_deref(),
      )))
    })
  }

  /// A query given as the blocks' unchained content hashes (namespace included).
  #[napi]
  pub fn query_by_hash(&self, hashes: BigUint64Array) -> Result<RouterMatchesOut, Code> {
    guard_js(|| {
      let keys = self.ix().keys_of_content_hashes(&hashes);
      Ok(matches_out(self.ix().query_keys(&keys)))
    })
  }

  #[napi]
  pub fn dump(&self, worker_id: Option<BigInt>) -> Result<Vec<RouterDumpSegmentOut>, Code> {
    guard_js(|| {
      let id = worker_id.map(|w| bigint_u64("workerId", &w)).transpose()?;
      Ok(
        self
          .ix()
          .dump(id)
          .into_iter()
          .map(|s| RouterDumpSegmentOut {
            tier: s.tier.name().to_string(),
            worker_id: BigInt::from(s.worker.worker_id),
            dp_rank: s.worker.dp_rank,
            parent: s.parent.map(BigInt::from),
            block_hashes: BigUint64Array::new(s.block_hashes),
            content_hashes: BigUint64Array::new(s.content_hashes),
            keys: BigUint64Array::new(s.keys),
          })
          .collect(),
      )
    })
  }

  #[napi]
  pub fn stats(&self) -> Result<RouterStatsOut, Code> {
    guard_js(|| {
      let mut tiers = Vec::new();
      let mut workers = Vec::new();
      let mut drops: Vec<DropCount> = Vec::new();
      for (tier, s) in self.ix().tier_stats() {
        tiers.push(RouterTierStatsOut {
          tier: tier.name().to_string(),
          blocks: s.blocks as f64,
          memberships: s.memberships as f64,
          bytes: s.bytes as f64,
        });
        for w in s
          .per_worker
          .iter()
          .filter(|w| w.blocks > 0 || w.needs_recovery)
        {
          workers.push(RouterWorkerStatsOut {
            worker_id: BigInt::from(w.worker.worker_id),
            dp_rank: w.worker.dp_rank,
            tier: tier.name().to_string(),
            blocks: w.blocks as f64,
            needs_recovery: w.needs_recovery,
          });
        }
        for (reason, n) in s.drops {
          match drops.iter_mut().find(|d| d.reason == reason.name()) {
            Some(d) => d.count += n as f64,
            None => drops.push(DropCount {
              reason: reason.name().to_string(),
              count: n as f64,
            }),
          }
        }
      }
      for (reason, n) in self.ix().drops() {
        drops.push(DropCount {
          reason: reason.name().to_string(),
          count: n as f64,
        });
      }
      let events = self
        .ix()
        .outcomes()
        .into_iter()
        .map(|(k, o, n)| RouterEventCountOut {
          kind: k.name().to_string(),
          outcome: o.name().to_string(),
          count: n as f64,
        })
        .collect();
      Ok(RouterStatsOut {
        tiers,
        workers,
        drops,
        events,
      })
    })
  }
}

fn applied_out(outcome: &str, a: kvplane_core::router::Applied) -> RouterAppliedOut {
  RouterAppliedOut {
    outcome: outcome.to_string(),
    seq: BigInt::from(a.seq),
    events: a.events,
    unknown_events: a.unknown_events,
    layout_errors: a.layout_errors,
    snapshot_rest: a.snapshot_rest as f64,
  }
}

fn skipped_out(outcome: &str, seq: u64) -> RouterAppliedOut {
  RouterAppliedOut {
    outcome: outcome.to_string(),
    seq: BigInt::from(seq),
    events: 0,
    unknown_events: 0,
    layout_errors: 0,
    snapshot_rest: 0.0,
  }
}
