//! `NativeLocalIndexer`: the core `LocalIndexer` behind a mutex, with its inputs and outputs
//! converted. Matching results cross as parallel typed arrays; dumps are built off the JS thread.

use crate::convert::{bigint_u64, v8_u64s};
use crate::error::{guard, guard_js, to_js, Code};
use crate::events::{batch_in, batch_out, event_out, BatchIn, BatchOut, EventOut};
use crate::hash::{core_options, HashBlocksOptions};
use crate::queue::{ColumnArgs, ColumnAttrsIn, NativeEventQueue};
use kvplane_core::codec::{recover, Dialect, Format};
use kvplane_core::event::KvEvent;
use kvplane_core::hash::{self, tokens_from_f64, Algo, HashOptions};
use kvplane_core::index::{IndexConfig, KeyBy, MatchOptions, WorkerDump, WorkerKey};
use kvplane_core::indexer::{Cursor, Drained, LocalIndexer, LocalIndexerConfig, Recovery};
use kvplane_core::queue::Taken;
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
  /// The ZMQ format batches are logged and published in: "vllm" (default), "vllm_legacy",
  /// "sglang".
  pub log_format: Option<String>,
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
  pub log_bytes: f64,
  pub drops: Vec<DropCount>,
  pub per_worker: Vec<WorkerStatsOut>,
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
      out.batches = Some(batches.iter().map(batch_out).collect());
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

/// A `/kv_recover` answer, encoded off the JS thread: the answer is taken under the lock (a dump
/// is a consistent cut), then encoded without it.
pub struct RecoverTask {
  inner: Shared,
  range: RecoverRange,
  msgpack: bool,
}

enum RecoverRange {
  Seqs(Option<u64>, Option<u64>),
  /// Raw query parameters.
  Query(Option<String>, Option<String>),
}

#[napi(object)]
pub struct RecoverAnswer {
  /// "Events", "TreeDump", "TooNew" or "InvalidRange".
  pub kind: String,
  pub body: Buffer,
}

fn recovery_kind(r: &Recovery) -> &'static str {
  match r {
    Recovery::Events { .. } => "Events",
    Recovery::TreeDump { .. } => "TreeDump",
    Recovery::TooNew { .. } => "TooNew",
    Recovery::InvalidRange { .. } => "InvalidRange",
  }
}

impl Task for RecoverTask {
  type Output = (&'static str, Vec<u8>);
  type JsValue = RecoverAnswer;

  fn compute(&mut self) -> napi::Result<Self::Output> {
    guard(|| {
      let answer = with(&self.inner, |ix| {
        Ok(match &self.range {
          RecoverRange::Seqs(s, e) => ix.get_events(*s, *e),
          RecoverRange::Query(s, e) => ix.recover_query(s.as_deref(), e.as_deref()),
        })
      })?;
      let body = if self.msgpack {
        recover::to_msgpack(&answer)
      } else {
        recover::to_json(&answer).into_bytes()
      };
      Ok((recovery_kind(&answer), body))
    })
    .map_err(|e| napi::Error::new(Status::GenericFailure, e.to_string()))
  }

  fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
    Ok(RecoverAnswer {
      kind: output.0.to_string(),
      body: output.1.into(),
    })
  }
}

#[napi(object)]
pub struct PublishedOut {
  pub seqs: BigUint64Array,
  /// One encoded payload per seq.
  pub payloads: Vec<Buffer>,
  /// The same batches as SMG protobuf `KvEventBatch`es, when the proto stream is on (else empty).
  pub proto_payloads: Vec<Buffer>,
  /// Events that failed closed.
  pub errors: Vec<ApplyErrorOut>,
  pub events: u32,
  /// Seqs skipped for events the queue dropped.
  pub gaps: u32,
}

fn published_out(d: Drained) -> PublishedOut {
  let mut out = PublishedOut {
    seqs: BigUint64Array::new(d.batches.iter().map(|b| b.seq).collect()),
    payloads: Vec::with_capacity(d.batches.len()),
    proto_payloads: Vec::new(),
    errors: Vec::new(),
    events: d.events as u32,
    gaps: d.gaps as u32,
  };
  for b in d.batches {
    out.payloads.push(b.payload.to_vec().into());
    if let Some(p) = b.proto {
      out.proto_payloads.push(p.into());
    }
    out
      .errors
      .extend(b.errors.into_iter().map(|e| ApplyErrorOut {
        code: e.code.as_str().to_string(),
        message: e.message,
      }));
  }
  out
}

pub struct DrainTask {
  inner: Shared,
  segments: Option<Vec<Taken>>,
  ts: f64,
  dp_rank: Option<i32>,
}

impl Task for DrainTask {
  type Output = Drained;
  type JsValue = PublishedOut;

  fn compute(&mut self) -> napi::Result<Self::Output> {
    let segments = self.segments.take().unwrap_or_default();
    guard(|| {
      with(&self.inner, |ix| {
        ix.publish_segments(segments, self.ts, self.dp_rank)
      })
    })
    .map_err(|e| napi::Error::new(Status::GenericFailure, e.to_string()))
  }

  fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
    Ok(published_out(output))
  }
}

/// Where a subscription begins: `live`, `replay` from `start`, or `expired` (with the status
/// message for the consumer).
#[napi(object)]
pub struct CursorOut {
  pub kind: String,
  pub start: BigInt,
  pub message: Option<String>,
}

#[napi(object)]
pub struct ReplayOut {
  pub seqs: BigUint64Array,
  pub payloads: Vec<Buffer>,
}

#[napi(object)]
pub struct EncodedApplyOut {
  pub batches: Vec<ApplyReportOut>,
  pub events: u32,
  pub unknown_events: u32,
}

fn report_out(report: kvplane_core::indexer::ApplyReport) -> ApplyReportOut {
  ApplyReportOut {
    seq: BigInt::from(report.seq),
    errors: report
      .errors
      .into_iter()
      .map(|e| ApplyErrorOut {
        code: e.code.as_str().to_string(),
        message: e.message,
      })
      .collect(),
  }
}

#[napi]
impl NativeLocalIndexer {
  /// Decodes and applies an encoded payload in one call (no JS object per event).
  #[napi]
  pub fn apply_encoded(&self, bytes: &[u8], dialect: String) -> Result<EncodedApplyOut, Code> {
    guard_js(|| {
      let dialect = Dialect::parse(&dialect)?;
      let r = with(&self.inner, |ix| ix.apply_encoded(bytes, dialect))?;
      Ok(EncodedApplyOut {
        batches: r.batches.into_iter().map(report_out).collect(),
        events: r.events,
        unknown_events: r.unknown_events,
      })
    })
  }

  /// The `/kv_recover` answer for `start..=end`, as JSON (`msgpack` false) or msgpack bytes.
  #[napi(ts_return_type = "Promise<RecoverAnswer>")]
  pub fn recover(
    &self,
    start: Option<BigInt>,
    end: Option<BigInt>,
    msgpack: bool,
  ) -> Result<AsyncTask<RecoverTask>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      let start = start.as_ref().map(|v| bigint_u64("start", v)).transpose()?;
      let end = end.as_ref().map(|v| bigint_u64("end", v)).transpose()?;
      Ok(AsyncTask::new(RecoverTask {
        inner: self.inner.clone(),
        range: RecoverRange::Seqs(start, end),
        msgpack,
      }))
    })
  }

  /// The `/kv_recover` answer for the raw `start` / `end` query parameters (malformed ones are
  /// `InvalidRange`).
  #[napi(ts_return_type = "Promise<RecoverAnswer>")]
  pub fn recover_query(
    &self,
    start: Option<String>,
    end: Option<String>,
    msgpack: bool,
  ) -> Result<AsyncTask<RecoverTask>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      Ok(AsyncTask::new(RecoverTask {
        inner: self.inner.clone(),
        range: RecoverRange::Query(start, end),
        msgpack,
      }))
    })
  }

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
        log_format: options
          .log_format
          .as_deref()
          .map(Format::parse)
          .transpose()?
          .unwrap_or(Format::Vllm),
      })
    })?;
    let ix = guard_js(|| LocalIndexer::new(cfg))?;
    Ok(NativeLocalIndexer {
      inner: Arc::new(Mutex::new(Some(ix))),
    })
  }

  /// Publishes up to `maxEvents` queued events off the JS thread: they are taken from the queue
  /// at once (producers keep enqueuing meanwhile), then packed into batches of at most 1024,
  /// applied, encoded once and logged on a worker thread; a seq is skipped where the queue lost
  /// events.
  #[napi(ts_return_type = "Promise<PublishedOut>")]
  pub fn drain_async(
    &self,
    queue: &NativeEventQueue,
    max_events: u32,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> Result<AsyncTask<DrainTask>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      Ok(AsyncTask::new(DrainTask {
        inner: self.inner.clone(),
        segments: Some(queue.lock().take_segments(max_events as usize)),
        ts,
        dp_rank,
      }))
    })
  }

  /// Where a gRPC subscription from `start` begins (0 = live).
  #[napi]
  pub fn cursor(&self, start: BigInt) -> Result<CursorOut, Code> {
    guard_js(|| {
      let start = bigint_u64("start", &start)?;
      Ok(match with(&self.inner, |ix| Ok(ix.cursor(start)))? {
        Cursor::Live => CursorOut {
          kind: "live".into(),
          start: BigInt::from(0u64),
          message: None,
        },
        Cursor::Replay(s) => CursorOut {
          kind: "replay".into(),
          start: BigInt::from(s),
          message: None,
        },
        Cursor::Expired { requested, oldest } => CursorOut {
          kind: "expired".into(),
          start: BigInt::from(requested),
          message: Some(Cursor::expired_message(requested, oldest)),
        },
      })
    })
  }

  /// Whether batches published from now on also come out as SMG protobuf (`protoPayloads`).
  #[napi]
  pub fn set_proto_stream(&self, on: bool) -> Result<(), Code> {
    guard_js(|| {
      with(&self.inner, |ix| {
        ix.set_proto_stream(on);
        Ok(())
      })
    })
  }

  /// Logged batches from `start` (the oldest retained if older), at most `max`, in the log format
  /// or re-encoded in `format` (`smg_proto` for gRPC subscribers).
  #[napi]
  pub fn replay(&self, start: BigInt, max: u32, format: Option<String>) -> Result<ReplayOut, Code> {
    guard_js(|| {
      let start = bigint_u64("start", &start)?;
      let format = format.as_deref().map(Format::parse).transpose()?;
      let logged = with(&self.inner, |ix| {
        Ok(match format {
          Some(f) => ix.replay_as(start, max as usize, f),
          None => ix.replay(start, max as usize),
        })
      })?;
      Ok(ReplayOut {
        seqs: BigUint64Array::new(logged.iter().map(|l| l.seq).collect()),
        payloads: logged.iter().map(|l| l.payload.to_vec().into()).collect(),
      })
    })
  }

  #[napi]
  pub fn apply_batch(&self, batch: BatchIn) -> Result<ApplyReportOut, Code> {
    guard_js(|| {
      let b = batch_in(&batch)?;
      Ok(report_out(with(&self.inner, |ix| ix.apply_batch(b))?))
    })
  }

  /// Applies events given as columns (see `ColumnArgs`) as the next batches (at most 1024 events
  /// each), in one call: the bulk path, with no JS object per event. Returns the seq of the one
  /// batch when there is one and no event failed (the common case, with nothing to allocate),
  /// else one report per batch.
  #[napi(ts_return_type = "bigint | Array<ApplyReportOut>")]
  #[allow(clippy::too_many_arguments)]
  pub fn apply_columns<'env>(
    &self,
    env: &'env Env,
    kinds: Uint8ArraySlice,
    hash_counts: Uint32ArraySlice,
    hashes: BigUint64ArraySlice,
    parents: BigUint64ArraySlice,
    has_parent: Uint8ArraySlice,
    tokens: Uint32ArraySlice,
    block_size: u32,
    attrs: Option<ColumnAttrsIn>,
    ts: f64,
    dp_rank: Option<i32>,
  ) -> Result<Unknown<'env>, Code> {
    let cols = ColumnArgs {
      kinds,
      hash_counts,
      hashes,
      parents,
      has_parent,
      tokens,
      block_size,
      attrs,
    };
    let d = guard_js(|| {
      let columns = cols.columns()?;
      with(&self.inner, |ix| ix.publish_columns(&columns, ts, dp_rank))
    })?;
    // The batches are applied and logged by now: a failure here is internal, not bad input.
    let built = |e: napi::Error| {
      to_js(KvError::new(
        ErrorCode::Internal,
        format!("cannot build the apply result: {e}"),
      ))
    };
    // SAFETY: converts owned values on the current env.
    unsafe {
      let v = match d.batches.as_slice() {
        [only] if only.errors.is_empty() => {
          ToNapiValue::to_napi_value(env.raw(), BigInt::from(only.seq)).map_err(built)?
        }
        _ => {
          let reports: Vec<ApplyReportOut> = d.batches.into_iter().map(report_out).collect();
          ToNapiValue::to_napi_value(env.raw(), reports).map_err(built)?
        }
      };
      Ok(Unknown::from_raw_unchecked(env.raw(), v))
    }
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
          log_bytes: ix.log_bytes() as f64,
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

  /// The newest seq (0 before the first batch).
  #[napi(getter)]
  pub fn last_seq(&self) -> Result<BigInt, Code> {
    guard_js(|| with(&self.inner, |ix| Ok(BigInt::from(ix.last_seq()))))
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
