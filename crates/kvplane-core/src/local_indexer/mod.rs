//! `LocalIndexer`: an engine node's index and its published stream (docs/architecture.md), behind
//! one lock: every batch is applied to the index, encoded once per format and logged under the
//! next seq. Its `impl` is split by concern: `apply` (batches and encoded payloads), `publish`
//! (events, columns and the publish queue), `recover` (replay, cursors, recovery answers).

mod apply;
mod outbound;
mod publish;
mod recover;

#[cfg(test)]
mod tests;

pub use apply::{IdBreak, RelayedIds};
pub use outbound::{LiveTap, Outbox};

use crate::codec::Format;
use crate::error::{KvError, KvResult};
use crate::hash::{Algo, HashOptions};
use crate::index::{Index, IndexConfig, KeyBy, MatchOptions, Matches, WorkerKey};
use crate::stream::{Encodings, Stream, StreamConfig};

#[derive(Debug, Clone)]
pub struct LocalIndexerConfig {
  pub index: IndexConfig,
  /// How token queries become index keys: the `xxh3` chain (content keys, the default) or the
  /// engine's algorithm (`KeyBy::Engine`). Its block size is the index's block size.
  pub query_hash: HashOptions,
  /// This node's worker id; workers are `(worker_id, dp_rank)`.
  pub worker_id: u64,
  /// The published stream: replay log size, epoch, log format.
  pub stream: StreamConfig,
}

impl Default for LocalIndexerConfig {
  fn default() -> Self {
    LocalIndexerConfig {
      index: IndexConfig::default(),
      query_hash: HashOptions::new(Algo::Xxh3, 16),
      worker_id: 0,
      stream: StreamConfig::default(),
    }
  }
}

impl LocalIndexerConfig {
  /// How token queries are hashed: the content (`xxh3`) chain, or with `KeyBy::Engine` the
  /// engine's own algorithm (`engine`, required then), at `block_size` tokens per block.
  pub fn query_hash_for(
    key_by: KeyBy,
    engine: Option<HashOptions>,
    block_size: usize,
  ) -> KvResult<HashOptions> {
    let h = match (engine, key_by) {
      (Some(o), KeyBy::Engine) => HashOptions { block_size, ..o },
      (None, KeyBy::Engine) => {
        return Err(KvError::invalid_arg("keyBy \"engine\" needs engineHash"))
      }
      _ => HashOptions::new(Algo::Xxh3, block_size),
    };
    h.validate()?;
    Ok(h)
  }
}

/// What applying (or publishing) one batch did.
#[derive(Debug, Clone)]
pub struct ApplyReport {
  /// The seq the batch was logged under.
  pub seq: u64,
  /// The DP rank it was published under (none: rank 0's, written nil).
  pub dp_rank: Option<i32>,
  /// Events that failed closed (unsupported layout); their worker was cleared.
  pub errors: Vec<KvError>,
  /// The batch as published, once per format the stream carries (the log's first).
  pub encodings: Encodings,
}

/// What applying an encoded payload did.
#[derive(Debug, Clone, Default)]
pub struct EncodedApplyReport {
  /// One report per applied batch.
  pub batches: Vec<ApplyReport>,
  /// Events applied.
  pub events: u32,
  /// Events of unknown kinds, skipped by the decoder.
  pub unknown_events: u32,
}

/// What one drain of a publish queue published.
#[derive(Debug, Clone, Default)]
pub struct Drained {
  /// One report per published batch, in seq order.
  pub batches: Vec<ApplyReport>,
  /// Events published.
  pub events: usize,
  /// Seqs skipped for events the queue dropped.
  pub gaps: usize,
}

pub struct LocalIndexer {
  index: Index,
  stream: Stream,
  query_hash: HashOptions,
  worker_id: u64,
  live: Option<Box<dyn LiveTap>>,
  deferred: Outbox,
}

impl LocalIndexer {
  /// `Err` if the log format is not a ZMQ msgpack format.
  pub fn new(cfg: LocalIndexerConfig) -> KvResult<LocalIndexer> {
    Ok(LocalIndexer {
      index: Index::new(cfg.index),
      stream: Stream::new(cfg.stream)?,
      query_hash: cfg.query_hash,
      worker_id: cfg.worker_id,
      live: None,
      deferred: Outbox::default(),
    })
  }

  pub fn index(&self) -> &Index {
    &self.index
  }

  /// The published stream: seqs, epoch, replay log, cursors.
  pub fn stream(&self) -> &Stream {
    &self.stream
  }

  /// Scores workers for a request given as tokens, hashed as the index's keys are.
  pub fn find_matches_tokens(&self, tokens: &[u32], opts: &MatchOptions) -> KvResult<Matches> {
    self
      .index
      .find_matches_tokens(tokens, &self.query_hash, opts)
  }

  pub fn last_seq(&self) -> u64 {
    self.stream.last_seq()
  }

  pub fn epoch(&self) -> u64 {
    self.stream.epoch()
  }

  pub fn worker_id(&self) -> u64 {
    self.worker_id
  }

  /// Whether each batch from now on is also encoded in `format` (`SmgProto` for gRPC
  /// subscribers), once, for every consumer of that format to share.
  pub fn set_format(&mut self, format: Format, on: bool) {
    self.stream.set_format(format, on);
  }

  /// Skips one seq where events were lost before they were numbered (see `Stream::skip_seq`).
  pub fn skip_seq(&mut self) {
    self.stream.skip_seq();
  }

  /// The worker of this node's rank `dp_rank` (none: rank 0).
  fn worker_of(&self, dp_rank: Option<i32>) -> KvResult<WorkerKey> {
    let dp_rank = match dp_rank {
      None => 0,
      Some(r) if r >= 0 => r as u32,
      Some(r) => return Err(KvError::invalid_arg(format!("dpRank {r} is negative"))),
    };
    Ok(WorkerKey {
      worker_id: self.worker_id,
      dp_rank,
    })
  }

  /// Appends an applied batch's encodings as the next seq and reports it.
  fn append(
    &mut self,
    encodings: Encodings,
    errors: Vec<KvError>,
    dp_rank: Option<i32>,
  ) -> ApplyReport {
    let seq = self.stream.append(&encodings);
    self.tap(seq, encodings.logged());
    ApplyReport {
      seq,
      dp_rank,
      errors,
      encodings,
    }
  }
}
