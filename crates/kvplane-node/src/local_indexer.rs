//! `NativeLocalIndexer`: the core `LocalIndexer` behind a mutex, its inputs and outputs
//! converted. Matching results cross as one packed typed array (`layout.rs`); dumps, recovery
//! answers and drains run off the JS thread (`tasks.rs`).

use crate::convert::{bigint_u64, v8_u64s};
use crate::error::{guard_js, to_js, Code};
use crate::events::{batch_in, BatchIn};
use crate::layout::pack_matches;
use crate::options::NativeIndexerOptions;
use crate::outputs::{
  published_out, recovery_out, report_out, ApplyReportOut, CursorOut, DropCount, EncodedApplyOut,
  IndexerStatsOut, PublishedOut, RecoveryOut, RelayedIdsOut, ReplayOut, WorkerStatsOut,
};
use crate::queue::{ColumnArgs, ColumnAttrsIn, NativeEventQueue};
use crate::tasks::{with, Coded, Drain, Dump, Recover, RecoverRange, Shared, Snapshot};
use kvplane_core::codec::smg::expired_cursor_message;
use kvplane_core::codec::{Dialect, Format};
use kvplane_core::hash::tokens_from_f64;
use kvplane_core::index::{MatchOptions, WorkerKey};
use kvplane_core::local_indexer::IdBreak;
use kvplane_core::local_indexer::{LocalIndexer, LocalIndexerConfig, Outbox};
use kvplane_core::stream::Cursor;
use kvplane_core::{ErrorCode, KvError, KvResult};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

#[napi]
pub struct NativeLocalIndexer {
  inner: Shared,
  /// Batches relayed on link threads, taken without the indexer's lock.
  outbox: Outbox,
  /// JS has been told that links deferred batches and has not taken them yet (`takeDeferred`):
  /// until it does, links relay without telling it again.
  link_notice: Arc<AtomicBool>,
}

impl NativeLocalIndexer {
  pub(crate) fn shared(&self) -> Shared {
    self.inner.clone()
  }

  pub(crate) fn outbox(&self) -> &Outbox {
    &self.outbox
  }

  pub(crate) fn link_notice(&self) -> &Arc<AtomicBool> {
    &self.link_notice
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

  /// Relays an engine's consecutive payloads: decoded, applied, encoded once per format and
  /// logged in Rust, published under the next seqs (no JS object per event), consecutive batches
  /// of one rank as one (the core's `relay_coalesced`), under DP rank `dp_rank`, or the payloads'
  /// own ranks when it is null.
  #[napi]
  pub fn relay_coalesced(
    &self,
    payloads: Vec<Buffer>,
    dialect: String,
    dp_rank: Option<i32>,
  ) -> Result<PublishedOut, Code> {
    guard_js(|| {
      let dialect = Dialect::parse(&dialect)?;
      let slices: Vec<&[u8]> = payloads.iter().map(|b| b.as_ref()).collect();
      Ok(published_out(with(&self.inner, |ix| {
        let d = ix.relay_coalesced(&slices, dialect, dp_rank)?;
        Ok(ix.after_deferred(d))
      })?))
    })
  }

  /// `relay_encoded` for a payload whose events carry the engine's event ids (TensorRT-LLM's
  /// JSON drain): `ranks[i]` expects event id `next_ids[i]` next; a batch that does not follow is
  /// preceded by a clear of its rank.
  #[napi]
  pub fn relay_with_event_ids(
    &self,
    bytes: &[u8],
    dialect: String,
    ranks: Int32Array,
    next_ids: BigUint64Array,
  ) -> Result<RelayedIdsOut, Code> {
    guard_js(|| {
      let dialect = Dialect::parse(&dialect)?;
      let expected: Vec<(i32, u64)> = ranks
        .iter()
        .copied()
        .zip(next_ids.iter().copied())
        .collect();
      let r = with(&self.inner, |ix| {
        let mut r = ix.relay_with_event_ids(bytes, dialect, &expected)?;
        r.drained = ix.after_deferred(r.drained);
        Ok(r)
      })?;
      Ok(RelayedIdsOut {
        published: published_out(r.drained),
        ranks: Int32Array::new(r.next_ids.iter().map(|(k, _)| *k).collect()),
        next_ids: BigUint64Array::new(r.next_ids.iter().map(|(_, v)| *v).collect()),
        break_ranks: Int32Array::new(r.breaks.iter().map(|(k, _)| *k).collect()),
        break_kinds: r
          .breaks
          .iter()
          .map(|(_, b)| match b {
            IdBreak::Gap => "gap".to_string(),
            IdBreak::Restart => "restart".to_string(),
          })
          .collect(),
      })
    })
  }

  /// Publishes `AllBlocksCleared` for DP rank `dp_rank` as the next batch.
  #[napi]
  pub fn clear_rank(&self, dp_rank: Option<i32>, ts: f64) -> Result<PublishedOut, Code> {
    guard_js(|| {
      Ok(published_out(with(&self.inner, |ix| {
        let d = ix.clear_rank(dp_rank, ts)?;
        Ok(ix.after_deferred(d))
      })?))
    })
  }

  /// The `/kv_recover` answer for `start..=end`, as JSON (`msgpack` false) or msgpack bytes.
  #[napi(ts_return_type = "Promise<RecoverAnswer>")]
  pub fn recover(
    &self,
    start: Option<BigInt>,
    end: Option<BigInt>,
    msgpack: bool,
  ) -> Result<AsyncTask<Coded<Recover>>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      let start = start.as_ref().map(|v| bigint_u64("start", v)).transpose()?;
      let end = end.as_ref().map(|v| bigint_u64("end", v)).transpose()?;
      Ok(Coded::task(Recover {
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
  ) -> Result<AsyncTask<Coded<Recover>>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      Ok(Coded::task(Recover {
        inner: self.inner.clone(),
        range: RecoverRange::Query(start, end),
        msgpack,
      }))
    })
  }

  #[napi(constructor)]
  pub fn new(options: NativeIndexerOptions) -> Result<Self, Code> {
    let ix = guard_js(|| LocalIndexer::new(LocalIndexerConfig::try_from(&options)?))?;
    Ok(NativeLocalIndexer {
      outbox: ix.outbox(),
      link_notice: Arc::new(AtomicBool::new(false)),
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
  ) -> Result<AsyncTask<Coded<Drain>>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      Ok(Coded::task(Drain {
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
      Ok(
        match with(&self.inner, |ix| Ok(ix.stream().cursor(start)))? {
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
            message: Some(expired_cursor_message(requested, oldest)),
          },
        },
      )
    })
  }

  /// Whether batches published from now on also come out in `format` (`smg_proto` for gRPC
  /// subscribers), encoded once per batch, as one more entry of `PublishedOut.encodings`.
  #[napi]
  pub fn set_format(&self, format: String, on: bool) -> Result<(), Code> {
    guard_js(|| {
      let format = Format::parse(&format)?;
      with(&self.inner, |ix| {
        ix.set_format(format, on);
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
          Some(f) => ix.stream().replay_as(start, max as usize, f),
          None => ix.stream().replay(start, max as usize),
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
    query: Either3<Uint32Array, BigUint64Array, Float64Array>,
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
  pub fn dump_tree(&self) -> Result<AsyncTask<Coded<Dump>>, Code> {
    with(&self.inner, |_| Ok(())).map_err(to_js)?;
    Ok(Coded::task(Dump {
      inner: self.inner.clone(),
    }))
  }

  /// The index's state as SMG `KvSnapshotChunk` batches of at most `maxBlocks` blocks
  /// (docs/protocol.md#snapshots); `null` when nothing was published yet. The chunks of rank
  /// `unknownRanks[i]` carry `unknown_before` = `unknownBefore[i]`.
  #[napi(ts_return_type = "Promise<SnapshotOut | null>")]
  pub fn snapshot(
    &self,
    max_blocks: u32,
    ts: f64,
    unknown_ranks: Vec<u32>,
    unknown_before: BigUint64Array,
  ) -> Result<AsyncTask<Coded<Snapshot>>, Code> {
    guard_js(|| {
      with(&self.inner, |_| Ok(()))?;
      if unknown_ranks.len() != unknown_before.len() {
        return Err(KvError::new(
          ErrorCode::InvalidArg,
          "unknownRanks and unknownBefore differ in length",
        ));
      }
      let pairs = unknown_ranks
        .into_iter()
        .zip(unknown_before.iter().copied())
        .collect();
      Ok(Coded::task(Snapshot {
        inner: self.inner.clone(),
        max_blocks: max_blocks as usize,
        ts,
        unknown_before: pairs,
      }))
    })
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
          oldest_seq: ix.stream().oldest_seq().map(BigInt::from),
          retained_batches: ix.stream().retained_batches() as f64,
          log_bytes: ix.stream().log_bytes() as f64,
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

  /// The oldest seq the replay log retains (`null` while it is empty).
  #[napi(getter)]
  pub fn oldest_seq(&self) -> Result<Option<BigInt>, Code> {
    guard_js(|| {
      with(&self.inner, |ix| {
        Ok(ix.stream().oldest_seq().map(BigInt::from))
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
