//! The numbered stream an engine node publishes (docs/protocol.md#seqs-and-epochs): dense seqs
//! from 1, the incarnation's epoch, the replay log of encoded batches, the publish queue,
//! subscription cursors and recovery answers. It knows nothing of the index: `LocalIndexer`
//! pairs one with an index.

pub mod batch;
mod cursor;
mod encodings;
pub mod log;
pub mod queue;
mod recovery;

pub use cursor::Cursor;
pub use encodings::Encodings;
pub use recovery::{Recovery, RecoveryCut};

use crate::codec::{self, Dialect, Format};
use crate::error::{KvError, KvResult};
use crate::event::{Batch, EventRef};
use crate::index::WorkerDump;
use log::{Logged, ReplayLog, DEFAULT_BUFFER_STEPS};

#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
  /// Batches retained for replay.
  pub buffer_steps: usize,
  /// This publisher incarnation's epoch.
  pub epoch: u64,
  /// The ZMQ format batches are logged (and published) in: `Vllm`, `VllmLegacy` or `Sglang`.
  pub log_format: Format,
  /// The first batch's seq (at least 1). A publisher takes `clock_first_seq()`, so a restarted
  /// incarnation numbers above every seq an earlier one issued (docs/protocol.md#restarts).
  pub first_seq: u64,
}

impl Default for StreamConfig {
  fn default() -> Self {
    StreamConfig {
      buffer_steps: DEFAULT_BUFFER_STEPS,
      epoch: 0,
      log_format: Format::Vllm,
      first_seq: 1,
    }
  }
}

/// A first seq above every seq an earlier incarnation on this clock can have issued: the time in
/// microseconds since the Unix epoch. An incarnation that started at `t0` has issued at most one
/// seq per batch, and no publisher reaches a million batches per second, so its seqs stay below
/// `now` (about 2^51 today, far from u64's end).
pub fn clock_first_seq() -> u64 {
  let now = std::time::SystemTime::now()
    .duration_since(std::time::UNIX_EPOCH)
    .map_or(0, |d| d.as_micros() as u64);
  now.max(1)
}

pub struct Stream {
  cfg: StreamConfig,
  log: ReplayLog,
  last_seq: u64,
  /// Formats each batch is also encoded in, besides the log's (`SmgProto` for gRPC subscribers).
  also: Vec<Format>,
}

impl Stream {
  /// `Err` if the log format is not a ZMQ msgpack format.
  pub fn new(cfg: StreamConfig) -> KvResult<Stream> {
    if cfg.log_format == Format::SmgProto {
      return Err(KvError::invalid_arg(
        "the replay log holds ZMQ payloads: format vllm, vllm_legacy or sglang",
      ));
    }
    if cfg.first_seq == 0 || cfg.first_seq > u64::MAX / 2 {
      return Err(KvError::invalid_arg(format!(
        "firstSeq {} is out of range: 1..=2^63-1",
        cfg.first_seq
      )));
    }
    Ok(Stream {
      log: ReplayLog::new(cfg.buffer_steps),
      last_seq: cfg.first_seq - 1,
      cfg,
      also: Vec::new(),
    })
  }

  /// The newest seq (`first_seq - 1` before the first batch).
  pub fn last_seq(&self) -> u64 {
    self.last_seq
  }

  /// The seq the next batch takes.
  pub fn next_seq(&self) -> u64 {
    self.last_seq + 1
  }

  pub fn oldest_seq(&self) -> Option<u64> {
    self.log.oldest_seq()
  }

  pub fn retained_batches(&self) -> usize {
    self.log.len()
  }

  /// Payload bytes held by the replay log.
  pub fn log_bytes(&self) -> usize {
    self.log.bytes()
  }

  pub fn log_format(&self) -> Format {
    self.cfg.log_format
  }

  pub fn epoch(&self) -> u64 {
    self.cfg.epoch
  }

  /// Whether batches appended from now on are also encoded in `format` (once per batch, for
  /// every consumer of that format to share). The log's format is always encoded.
  pub fn set_format(&mut self, format: Format, on: bool) {
    self.also.retain(|f| *f != format);
    if on && format != self.cfg.log_format {
      self.also.push(format);
    }
  }

  /// Encodes a batch's events once in every format this stream carries, the log's first.
  pub fn encode(
    &self,
    seq: u64,
    ts: f64,
    events: &[EventRef<'_>],
    dp_rank: Option<i32>,
  ) -> Encodings {
    let formats = std::iter::once(self.cfg.log_format).chain(self.also.iter().copied());
    Encodings::new(
      formats
        .map(|f| (f, codec::encode_events(seq, ts, events, dp_rank, f)))
        .collect(),
    )
  }

  /// Encodes a whole batch (its seq set) once in every format this stream carries.
  pub fn encode_batch(&self, b: &Batch) -> Encodings {
    let formats = std::iter::once(self.cfg.log_format).chain(self.also.iter().copied());
    Encodings::new(formats.map(|f| (f, codec::encode(b, f))).collect())
  }

  /// Appends the next batch: `encodings` (as `encode` built them) under seq `last_seq + 1`.
  pub fn append(&mut self, encodings: &Encodings) -> u64 {
    let seq = self.next_seq();
    self.last_seq = seq;
    self.log.push(Logged {
      seq,
      payload: encodings.logged().clone(),
    });
    seq
  }

  /// Skips one seq: events were lost before they were numbered (a full publish queue), so
  /// consumers must see a gap. The log cannot bridge it and is emptied: a consumer from before
  /// the gap recovers with a tree dump.
  pub fn skip_seq(&mut self) {
    self.last_seq += 1;
    self.log.clear();
  }

  /// Logged batches with seq >= `start` (from the oldest retained if `start` is older, as vLLM's
  /// replay does), at most `max` of them.
  pub fn replay(&self, start: u64, max: usize) -> Vec<Logged> {
    let Some(oldest) = self.log.oldest_seq() else {
      return Vec::new();
    };
    let from = start.max(oldest);
    let to = from
      .saturating_add(max as u64)
      .saturating_sub(1)
      .min(self.last_seq);
    if max == 0 || from > to {
      return Vec::new();
    }
    self.log.range(from, to)
  }

  /// Like [`Self::replay`], re-encoded in `format` (`SmgProto` for gRPC subscribers): the same
  /// bytes the live stream carried for those seqs in that format.
  pub fn replay_as(&self, start: u64, max: usize, format: Format) -> Vec<Logged> {
    if format == self.cfg.log_format {
      return self.replay(start, max);
    }
    self
      .replay(start, max)
      .into_iter()
      .map(|l| Logged {
        seq: l.seq,
        payload: recovery::reencode_logged(&l, self.log_dialect(), format),
      })
      .collect()
  }

  /// Where a subscription from `start` begins: live (0), a replay of the log (`start` within
  /// `oldest..=last_seq + 1`), or an expired cursor (older than the log, or past `last_seq + 1`).
  pub fn cursor(&self, start: u64) -> Cursor {
    if start == 0 {
      return Cursor::Live;
    }
    let next = self.next_seq();
    let oldest = self.log.oldest_seq().unwrap_or(next);
    if start >= oldest && start <= next {
      Cursor::Replay(start)
    } else {
      Cursor::Expired {
        requested: start,
        oldest,
      }
    }
  }

  /// The recovery answer for `start..=end` (docs/protocol.md#http-kv_recover): `Events` from the
  /// log, `TreeDump` (built by `dump`, a consistent cut of the index) when `start` is older than
  /// the log or absent, `TooNew` past the newest batch, `InvalidRange` when `end < start`.
  /// At most `max_batches` batches per `Events` answer when given (`next_start` then says where
  /// to continue), so one request never holds the log's lock for the whole log.
  pub fn recover(
    &self,
    start: Option<u64>,
    end: Option<u64>,
    max_batches: Option<usize>,
    dump: impl FnOnce() -> Vec<WorkerDump>,
  ) -> Recovery {
    self.recover_cut(start, end, max_batches, dump).finish()
  }

  /// `recover`, with an `Events` answer's batches left as the log's shared bytes: what a caller
  /// holding the publisher's lock takes, decoding them (`RecoveryCut::finish`) after releasing it.
  pub fn recover_cut(
    &self,
    start: Option<u64>,
    end: Option<u64>,
    max_batches: Option<usize>,
    dump: impl FnOnce() -> Vec<WorkerDump>,
  ) -> RecoveryCut {
    RecoveryCut::Done(match self.recover_outside_log(start, end, dump) {
      Ok(done) => done,
      Err(start) => {
        let last_seq = self.last_seq;
        let end = end.unwrap_or(last_seq).min(last_seq);
        let bounded =
          max_batches.map_or(end, |m| end.min(start.saturating_add(m.max(1) as u64 - 1)));
        return RecoveryCut::Logged {
          logged: self.log.range(start, bounded).to_vec(),
          dialect: self.log_dialect(),
          last_seq,
          epoch: self.cfg.epoch,
          next_start: (bounded < end).then_some(bounded + 1),
        };
      }
    })
  }

  /// Every answer but `Events`; `Err(start)` when the range is in the log.
  fn recover_outside_log(
    &self,
    start: Option<u64>,
    end: Option<u64>,
    dump: impl FnOnce() -> Vec<WorkerDump>,
  ) -> Result<Recovery, u64> {
    let (last_seq, epoch) = (self.last_seq, self.cfg.epoch);
    if let (Some(s), Some(e)) = (start, end) {
      if e < s {
        return Ok(Recovery::InvalidRange {
          reason: format!("end {e} < start {s}"),
          last_seq,
          epoch,
        });
      }
    }
    let Some(start) = start else {
      return Ok(Recovery::TreeDump {
        workers: dump(),
        last_seq,
        epoch,
      });
    };
    if start > last_seq {
      return Ok(Recovery::TooNew { last_seq, epoch });
    }
    match self.log.oldest_seq() {
      Some(oldest) if start >= oldest => Err(start),
      _ => Ok(Recovery::TreeDump {
        workers: dump(),
        last_seq,
        epoch,
      }),
    }
  }

  /// A malformed recovery request, answered as `InvalidRange`.
  pub fn invalid_range(&self, reason: String) -> Recovery {
    Recovery::InvalidRange {
      reason,
      last_seq: self.last_seq,
      epoch: self.cfg.epoch,
    }
  }

  /// The dialect the log's batches decode with.
  fn log_dialect(&self) -> Dialect {
    dialect_of_log(self.cfg.log_format)
  }
}

/// The dialect a log in `format` (a ZMQ msgpack format) is read back in.
fn dialect_of_log(format: Format) -> Dialect {
  match format {
    Format::Sglang => Dialect::Sglang,
    _ => Dialect::Vllm,
  }
}
