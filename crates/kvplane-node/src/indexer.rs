//! `NativeLocalIndexer`: the core `LocalIndexer` behind a mutex, with its inputs and outputs
//! converted. Matching results cross as parallel typed arrays; dumps are built off the JS thread.

use crate::convert::{bigint_u64, v8_u64s};
use crate::error::{guard, guard_js, to_js, Code};
use crate::hash::{core_options, HashBlocksOptions};
use kvplane_core::event::{Batch, EventKind, KvEvent, RemovedEvent, StoredEvent};
use kvplane_core::hash::{self, tokens_from_f64, Algo, HashOptions};
use kvplane_core::index::{IndexConfig, KeyBy, MatchOptions, WorkerDump, WorkerKey};
use kvplane_core::indexer::{LocalIndexer, LocalIndexerConfig, Recovery};
use kvplane_core::{ErrorCode, KvError, KvResult};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::{Arc, Mutex};

#[napi(object, object_to_js = false)]
pub struct NativeIndexerOptions {
  /// Block size of token queries.
  pub block_size: f64,
  /// With keyBy "engine": the engine's hashing options (its block size is `blockSize`).
  pub engine_hash: Option<HashBlocksOptions>,
  pub worker_id: Option<BigInt>,
  /// "content" (default) or "engine".
  pub key_by: Option<String>,
  pub retain_tokens: Option<bool>,
  pub buffer_steps: Option<f64>,
  pub epoch: Option<BigInt>,
}

#[napi(object, object_to_js = false)]
pub struct EventIn {
  #[napi(js_name = "type")]
  pub kind: String,
  pub block_hashes: Option<Either<BigUint64Array, Vec<BigInt>>>,
  pub parent_block_hash: Option<Either<BigInt, Null>>,
  pub token_ids: Option<Either<Uint32Array, Vec<f64>>>,
  pub block_size: Option<f64>,
  pub lora_id: Option<BigInt>,
  pub lora_name: Option<String>,
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
  pub cache_salt: Option<String>,
}

#[napi(object, object_to_js = false)]
pub struct BatchIn {
  pub seq: Option<BigInt>,
  pub ts: Option<f64>,
  pub dp_rank: Option<Either<i32, Null>>,
  pub events: Vec<EventIn>,
}

#[napi(object)]
pub struct EventOut {
  #[napi(js_name = "type")]
  pub kind: String,
  pub block_hashes: Option<BigUint64Array>,
  pub parent_block_hash: Option<BigInt>,
  pub token_ids: Option<Uint32Array>,
  pub block_size: Option<u32>,
  pub lora_id: Option<BigInt>,
  pub lora_name: Option<String>,
  pub medium: Option<String>,
  pub group_idx: Option<u32>,
  pub cache_salt: Option<String>,
}

#[napi(object)]
pub struct BatchOut {
  pub seq: BigInt,
  pub ts: f64,
  pub dp_rank: Option<i32>,
  pub events: Vec<EventOut>,
}

#[napi(object)]
pub struct WorkerDumpOut {
  pub worker_id: BigInt,
  pub dp_rank: u32,
  pub events: Vec<EventOut>,
}

#[napi(object)]
pub struct RecoveryOut {
  /// "Events", "TreeDump", "TooNew" or "InvalidRange".
  pub kind: String,
  pub last_seq: BigInt,
  pub epoch: BigInt,
  pub batches: Option<Vec<BatchOut>>,
  pub workers: Option<Vec<WorkerDumpOut>>,
  pub reason: Option<String>,
}

#[napi(object)]
pub struct ApplyReportOut {
  pub seq: BigInt,
  /// `code: message` of each event that failed closed.
  pub errors: Vec<ApplyErrorOut>,
}

#[napi(object)]
pub struct ApplyErrorOut {
  pub code: String,
  pub message: String,
}

/// Matching results for `n` workers, packed in one buffer: `n` u64 worker ids, `n` u64 tree
/// sizes, `n` u32 DP ranks, `n` u32 leading-block counts (all little-endian, in that order).
fn pack_matches(m: &kvplane_core::index::Matches) -> Vec<u64> {
  let n = m.scores.len();
  let half = n.div_ceil(2);
  let mut out = vec![0u64; 2 * n + 2 * half];
  for (i, ((w, blocks), (_, size))) in m.scores.iter().zip(&m.tree_sizes).enumerate() {
    out[i] = w.worker_id;
    out[n + i] = *size;
    out[2 * n + i / 2] |= if i % 2 == 0 {
      w.dp_rank as u64
    } else {
      (w.dp_rank as u64) << 32
    };
    out[2 * n + half + i / 2] |= if i % 2 == 0 {
      *blocks as u64
    } else {
      (*blocks as u64) << 32
    };
  }
  out
}

#[napi(object)]
pub struct DropCount {
  pub reason: String,
  pub count: f64,
}

#[napi(object)]
pub struct WorkerStatsOut {
  pub worker_id: BigInt,
  pub dp_rank: u32,
  pub blocks: f64,
  pub unreachable_blocks: f64,
  pub needs_recovery: bool,
}

#[napi(object)]
pub struct IndexerStatsOut {
  pub blocks: f64,
  pub memberships: f64,
  pub workers: f64,
  pub bytes: f64,
  pub token_bytes: f64,
  pub last_seq: BigInt,
  pub oldest_seq: Option<BigInt>,
  pub retained_batches: f64,
  pub drops: Vec<DropCount>,
  pub per_worker: Vec<WorkerStatsOut>,
}

fn hashes_in(v: &Option<Either<BigUint64Array, Vec<BigInt>>>) -> KvResult<Vec<u64>> {
  match v {
    None => Err(KvError::invalid_arg("blockHashes is required")),
    Some(Either::A(a)) => Ok(a.to_vec()),
    Some(Either::B(v)) => v.iter().map(|b| bigint_u64("blockHashes[i]", b)).collect(),
  }
}

fn event_in(e: &EventIn) -> KvResult<KvEvent> {
  Ok(match EventKind::parse(&e.kind)? {
    EventKind::Cleared => KvEvent::Cleared,
    EventKind::Removed => KvEvent::Removed(RemovedEvent {
      block_hashes: hashes_in(&e.block_hashes)?,
      medium: e.medium.clone(),
      group_idx: e.group_idx,
    }),
    EventKind::Stored => KvEvent::Stored(StoredEvent {
      block_hashes: hashes_in(&e.block_hashes)?,
      parent_block_hash: match &e.parent_block_hash {
        Some(Either::A(p)) => Some(bigint_u64("parentBlockHash", p)?),
        _ => None,
      },
      token_ids: match &e.token_ids {
        None => Vec::new(),
        Some(Either::A(t)) => t.to_vec(),
        Some(Either::B(v)) => tokens_from_f64(v)?,
      },
      block_size: match e.block_size {
        None => 0,
        Some(b) => hash::block_size_from_f64(b)? as u32,
      },
      lora_id: e.lora_id.as_ref().map(|v| v.get_i64().0),
      lora_name: e.lora_name.clone(),
      medium: e.medium.clone(),
      group_idx: e.group_idx,
      cache_salt: e.cache_salt.clone(),
    }),
  })
}

fn event_out(e: &KvEvent) -> EventOut {
  let mut out = EventOut {
    kind: e.kind().name().to_string(),
    block_hashes: None,
    parent_block_hash: None,
    token_ids: None,
    block_size: None,
    lora_id: None,
    lora_name: None,
    medium: None,
    group_idx: None,
    cache_salt: None,
  };
  match e {
    KvEvent::Cleared => {}
    KvEvent::Removed(r) => {
      out.block_hashes = Some(BigUint64Array::new(r.block_hashes.clone()));
      out.medium = r.medium.clone();
      out.group_idx = r.group_idx;
    }
    KvEvent::Stored(s) => {
      out.block_hashes = Some(BigUint64Array::new(s.block_hashes.clone()));
      out.parent_block_hash = s.parent_block_hash.map(BigInt::from);
      out.token_ids = Some(Uint32Array::new(s.token_ids.clone()));
      out.block_size = Some(s.block_size);
      out.lora_id = s.lora_id.map(BigInt::from);
      out.lora_name = s.lora_name.clone();
      out.medium = s.medium.clone();
      out.group_idx = s.group_idx;
      out.cache_salt = s.cache_salt.clone();
    }
  }
  out
}

fn dump_out(workers: Vec<WorkerDump>) -> Vec<WorkerDumpOut> {
  workers
    .into_iter()
    .map(|w| WorkerDumpOut {
      worker_id: BigInt::from(w.worker.worker_id),
      dp_rank: w.worker.dp_rank,
      events: w
        .events
        .into_iter()
        .map(|e| event_out(&KvEvent::Stored(e)))
        .collect(),
    })
    .collect()
}

fn recovery_out(r: Recovery) -> RecoveryOut {
  let mut out = RecoveryOut {
    kind: String::new(),
    last_seq: BigInt::from(0u64),
    epoch: BigInt::from(0u64),
    batches: None,
    workers: None,
    reason: None,
  };
  let (kind, last_seq, epoch) = match r {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
    } => {
      out.batches = Some(
        batches
          .iter()
          .map(|b| BatchOut {
            seq: BigInt::from(b.seq),
            ts: b.ts,
            dp_rank: b.dp_rank,
            events: b.events.iter().map(event_out).collect(),
          })
          .collect(),
      );
      ("Events", last_seq, epoch)
    }
    Recovery::TreeDump {
      workers,
      last_seq,
      epoch,
    } => {
      out.workers = Some(dump_out(workers));
      ("TreeDump", last_seq, epoch)
    }
    Recovery::TooNew { last_seq, epoch } => ("TooNew", last_seq, epoch),
    Recovery::InvalidRange {
      reason,
      last_seq,
      epoch,
    } => {
      out.reason = Some(reason);
      ("InvalidRange", last_seq, epoch)
    }
  };
  out.kind = kind.to_string();
  out.last_seq = BigInt::from(last_seq);
  out.epoch = BigInt::from(epoch);
  out
}

type Shared = Arc<Mutex<Option<LocalIndexer>>>;

fn closed() -> KvError {
  KvError::new(ErrorCode::Closed, "the LocalIndexer is closed")
}

fn with<T>(inner: &Shared, f: impl FnOnce(&mut LocalIndexer) -> KvResult<T>) -> KvResult<T> {
  let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
  f(g.as_mut().ok_or_else(closed)?)
}

#[napi]
pub struct NativeLocalIndexer {
  inner: Shared,
}

pub struct DumpTask {
  inner: Shared,
}

impl Task for DumpTask {
  type Output = Recovery;
  type JsValue = RecoveryOut;

  fn compute(&mut self) -> napi::Result<Self::Output> {
    // The dump is a consistent cut: it holds the same lock as apply for its whole build.
    guard(|| with(&self.inner, |ix| Ok(ix.tree_dump())))
      .map_err(|e| napi::Error::new(Status::GenericFailure, e.to_string()))
  }

  fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
    Ok(recovery_out(output))
  }
}

#[napi]
impl NativeLocalIndexer {
  #[napi(constructor)]
  pub fn new(options: NativeIndexerOptions) -> Result<Self, Code> {
    let cfg = guard_js(|| {
      let key_by = options
        .key_by
        .as_deref()
        .map(KeyBy::parse)
        .transpose()?
        .unwrap_or_default();
      let buffer_steps = options
        .buffer_steps
        .map(kvplane_core::log::buffer_steps_from_f64)
        .transpose()?
        .unwrap_or(kvplane_core::log::DEFAULT_BUFFER_STEPS);
      let block_size = hash::block_size_from_f64(options.block_size)?;
      let query_hash = match (&options.engine_hash, key_by) {
        (Some(o), KeyBy::Engine) => HashOptions {
          block_size,
          ..core_options(o)?
        },
        (None, KeyBy::Engine) => {
          return Err(KvError::invalid_arg("keyBy \"engine\" needs engineHash"))
        }
        _ => HashOptions::new(Algo::Xxh3, block_size),
      };
      query_hash.validate()?;
      Ok(LocalIndexerConfig {
        query_hash,
        index: IndexConfig {
          key_by,
          retain_tokens: options.retain_tokens.unwrap_or(true),
        },
        buffer_steps,
        worker_id: options
          .worker_id
          .as_ref()
          .map(|v| bigint_u64("workerId", v))
          .transpose()?
          .unwrap_or(0),
        epoch: options
          .epoch
          .as_ref()
          .map(|v| bigint_u64("epoch", v))
          .transpose()?
          .unwrap_or(0),
      })
    })?;
    Ok(NativeLocalIndexer {
      inner: Arc::new(Mutex::new(Some(LocalIndexer::new(cfg)))),
    })
  }

  #[napi]
  pub fn apply_batch(&self, batch: BatchIn) -> Result<ApplyReportOut, Code> {
    guard_js(|| {
      let events = batch
        .events
        .iter()
        .map(event_in)
        .collect::<KvResult<Vec<_>>>()?;
      let seq = batch
        .seq
        .as_ref()
        .map(|s| bigint_u64("seq", s))
        .transpose()?
        .unwrap_or(0);
      let dp_rank = match batch.dp_rank {
        Some(Either::A(r)) => Some(r),
        _ => None,
      };
      let b = Batch {
        seq,
        ts: batch.ts.unwrap_or(0.0),
        dp_rank,
        events,
      };
      let report = with(&self.inner, |ix| ix.apply_batch(b))?;
      Ok(ApplyReportOut {
        seq: BigInt::from(report.seq),
        errors: report
          .errors
          .into_iter()
          .map(|e| ApplyErrorOut {
            code: e.code.as_str().to_string(),
            message: e.message,
          })
          .collect(),
      })
    })
  }

  /// Scores workers for a request: its tokens (`Uint32Array` or numbers), hashed as the index's keys, or
  /// already its chained block hashes (`BigUint64Array`). Packed result: see `pack_matches`.
  #[napi(ts_return_type = "BigUint64Array")]
  pub fn find_matches<'env>(
    &self,
    env: &'env Env,
    query: Either3<Uint32Array, BigUint64Array, Vec<f64>>,
    workers: Option<Vec<BigInt>>,
    dp_ranks: Option<Vec<u32>>,
    early_exit: Option<bool>,
  ) -> Result<Unknown<'env>, Code> {
    let packed = guard_js(|| {
      let filter = match (workers, dp_ranks) {
        (None, None) => None,
        (Some(ids), Some(ranks)) if ids.len() == ranks.len() => Some(
          ids
            .iter()
            .zip(ranks)
            .map(|(id, dp_rank)| {
              Ok(WorkerKey {
                worker_id: bigint_u64("workers[i].workerId", id)?,
                dp_rank,
              })
            })
            .collect::<KvResult<Vec<_>>>()?,
        ),
        _ => {
          return Err(KvError::invalid_arg(
            "workers and dpRanks must have the same length",
          ))
        }
      };
      let opts = MatchOptions {
        workers: filter,
        early_exit: early_exit.unwrap_or(false),
      };
      let m = with(&self.inner, |ix| match &query {
        Either3::A(tokens) => ix.find_matches_tokens(tokens, &opts),
        Either3::B(keys) => Ok(ix.index().find_matches(keys, &opts)),
        Either3::C(numbers) => ix.find_matches_tokens(&tokens_from_f64(numbers)?, &opts),
      })?;
      Ok(pack_matches(&m))
    })?;
    v8_u64s(env, packed)
  }

  #[napi]
  pub fn get_events(
    &self,
    start: Option<BigInt>,
    end: Option<BigInt>,
  ) -> Result<RecoveryOut, Code> {
    guard_js(|| {
      let start = start.as_ref().map(|v| bigint_u64("start", v)).transpose()?;
      let end = end.as_ref().map(|v| bigint_u64("end", v)).transpose()?;
      Ok(recovery_out(with(&self.inner, |ix| {
        Ok(ix.get_events(start, end))
      })?))
    })
  }

  #[napi(ts_return_type = "Promise<RecoveryOut>")]
  pub fn dump_tree(&self) -> Result<AsyncTask<DumpTask>, Code> {
    with(&self.inner, |_| Ok(())).map_err(to_js)?;
    Ok(AsyncTask::new(DumpTask {
      inner: self.inner.clone(),
    }))
  }

  #[napi]
  pub fn stats(&self) -> Result<IndexerStatsOut, Code> {
    guard_js(|| {
      with(&self.inner, |ix| {
        let s = ix.index().stats();
        Ok(IndexerStatsOut {
          blocks: s.blocks as f64,
          memberships: s.memberships as f64,
          workers: s.workers as f64,
          bytes: s.bytes as f64,
          token_bytes: s.token_bytes as f64,
          last_seq: BigInt::from(ix.last_seq()),
          oldest_seq: ix.oldest_seq().map(BigInt::from),
          retained_batches: ix.retained_batches() as f64,
          drops: s
            .drops
            .iter()
            .map(|(r, n)| DropCount {
              reason: r.name().to_string(),
              count: *n as f64,
            })
            .collect(),
          per_worker: s
            .per_worker
            .iter()
            .map(|w| WorkerStatsOut {
              worker_id: BigInt::from(w.worker.worker_id),
              dp_rank: w.worker.dp_rank,
              blocks: w.blocks as f64,
              unreachable_blocks: w.unreachable_blocks as f64,
              needs_recovery: w.needs_recovery,
            })
            .collect(),
        })
      })
    })
  }

  /// Frees the index; every later call throws ERR_CLOSED.
  #[napi]
  pub fn close(&self) {
    let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
    *g = None;
  }

  #[napi(getter)]
  pub fn closed(&self) -> bool {
    self
      .inner
      .lock()
      .unwrap_or_else(|p| p.into_inner())
      .is_none()
  }
}
