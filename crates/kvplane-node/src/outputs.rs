//! What the native classes return to JS: plain objects, typed arrays and Buffers, converted
//! from the core's reports and answers.

use crate::events::{batch_out, event_out, BatchOut, EventOut};
use kvplane_core::codec::Format;
use kvplane_core::event::KvEvent;
use kvplane_core::index::WorkerDump;
use kvplane_core::local_indexer::{ApplyReport, Drained};
use kvplane_core::stream::log::Payload;
use kvplane_core::stream::Recovery;
use kvplane_core::KvError;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::Arc;

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
  /// `Events` from `/kv_recover` that stop short of the range: the seq to ask for next.
  pub next_start: Option<BigInt>,
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
  /// The DP rank of the batch the event was in (none: rank 0's).
  pub dp_rank: Option<i32>,
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

pub fn dump_out(workers: Vec<WorkerDump>) -> Vec<WorkerDumpOut> {
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

pub fn recovery_out(r: Recovery) -> RecoveryOut {
  let mut out = RecoveryOut {
    kind: String::new(),
    last_seq: BigInt::from(0u64),
    epoch: BigInt::from(0u64),
    batches: None,
    workers: None,
    reason: None,
    next_start: None,
  };
  out.kind = r.kind().to_string();
  let (last_seq, epoch) = match r {
    Recovery::Events {
      batches,
      last_seq,
      epoch,
      next_start,
    } => {
      out.batches = Some(batches.iter().map(batch_out).collect());
      out.next_start = next_start.map(BigInt::from);
      (last_seq, epoch)
    }
    Recovery::TreeDump {
      workers,
      last_seq,
      epoch,
    } => {
      out.workers = Some(dump_out(workers));
      (last_seq, epoch)
    }
    Recovery::TooNew { last_seq, epoch } => (last_seq, epoch),
    Recovery::InvalidRange {
      reason,
      last_seq,
      epoch,
    } => {
      out.reason = Some(reason);
      (last_seq, epoch)
    }
  };
  out.last_seq = BigInt::from(last_seq);
  out.epoch = BigInt::from(epoch);
  out
}

#[napi(object, object_from_js = false)]
pub struct RecoverAnswer {
  /// "Events", "TreeDump", "TooNew" or "InvalidRange".
  pub kind: String,
  /// The answer's first chunk (the whole answer when `rest` is absent).
  pub body: Buffer,
  /// The chunks after `body`, encoded one `next()` at a time.
  pub rest: Option<crate::tasks::RecoverChunks>,
}

/// What `relayWithEventIds` published and where each rank's event ids stand.
#[napi(object)]
pub struct RelayedIdsOut {
  pub published: PublishedOut,
  /// `ranks[i]` expects event id `next_ids[i]` next.
  pub ranks: Int32Array,
  pub next_ids: BigUint64Array,
  /// Ranks cleared before a batch (`break_kinds[i]`: "gap" or "restart"), in order.
  pub break_ranks: Int32Array,
  pub break_kinds: Vec<String>,
}

#[napi(object)]
pub struct PublishedOut {
  pub seqs: BigUint64Array,
  /// The batches once per format the stream carries, the log's format first: `payloads[i]` is
  /// batch `seqs[i]`.
  pub encodings: Vec<EncodingOut>,
  /// Events that failed closed.
  pub errors: Vec<ApplyErrorOut>,
  pub events: u32,
  /// Seqs skipped for events the queue dropped.
  pub gaps: u32,
}

/// One format's payloads of the batches a drain published.
#[napi(object)]
pub struct EncodingOut {
  /// `vllm`, `vllm_legacy`, `sglang` or `smg_proto`.
  pub format: String,
  pub payloads: Vec<Buffer>,
}

/// A payload shared with the replay log is copied into a Buffer; one only this batch holds
/// (a format the log does not keep) is handed over without a copy.
fn buffer_of(p: Payload) -> Buffer {
  match Arc::try_unwrap(p) {
    Ok(bytes) => bytes.into(),
    Err(shared) => shared.to_vec().into(),
  }
}

pub fn published_out(d: Drained) -> PublishedOut {
  published_out_in(d, None)
}

/// `published_out` with only the encodings in `formats` (by name; `None`: all the batches carry),
/// each for every batch (`Drained::into_payloads`): the others are not copied out (a logged
/// payload, shared with the log, is copied into its Buffer).
pub fn published_out_in(mut d: Drained, formats: Option<&[String]>) -> PublishedOut {
  let seqs = BigUint64Array::new(d.batches.iter().map(|b| b.seq).collect());
  let mut errors = Vec::new();
  for b in &mut d.batches {
    let rank = b.dp_rank;
    errors.extend(
      std::mem::take(&mut b.errors)
        .into_iter()
        .map(|e| error_out(e, rank)),
    );
  }
  let (events, gaps) = (d.events as u32, d.gaps as u32);
  let wanted: Option<Vec<Format>> =
    formats.map(|fs| fs.iter().filter_map(|n| Format::parse(n).ok()).collect());
  let encodings = d
    .into_payloads(wanted.as_deref())
    .into_iter()
    .map(|(format, payloads)| EncodingOut {
      format: format.name().to_string(),
      payloads: payloads.into_iter().map(buffer_of).collect(),
    })
    .collect();
  PublishedOut {
    seqs,
    encodings,
    errors,
    events,
    gaps,
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

pub fn error_out(e: KvError, dp_rank: Option<i32>) -> ApplyErrorOut {
  ApplyErrorOut {
    code: e.code.as_str().to_string(),
    message: e.message,
    dp_rank,
  }
}

pub fn report_out(report: ApplyReport) -> ApplyReportOut {
  ApplyReportOut {
    seq: BigInt::from(report.seq),
    errors: report
      .errors
      .into_iter()
      .map(|e| error_out(e, report.dp_rank))
      .collect(),
  }
}
