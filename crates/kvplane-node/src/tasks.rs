//! Work that runs off the JS thread (dumps, `/kv_recover` answers, drains). A task computes a
//! core result; when it fails, the promise rejects with the same coded error a synchronous call
//! throws (`code` = the core's stable code), not a generic failure.

use crate::error::{guard, to_js};
use crate::outputs::{published_out, recovery_out, PublishedOut, RecoverAnswer, RecoveryOut};
use kvplane_core::codec::recover::{AnswerCursor, CHUNK_BYTES};
use kvplane_core::codec::smg::SnapshotChunks;
use kvplane_core::local_indexer::{Drained, LocalIndexer};
use kvplane_core::stream::queue::Taken;
use kvplane_core::stream::{Recovery, RecoveryCut};
use kvplane_core::{ErrorCode, KvError, KvResult};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::{Arc, Mutex};

/// A native class's core object: `None` once closed.
pub type Shared = Arc<Mutex<Option<LocalIndexer>>>;

fn closed() -> KvError {
  KvError::new(ErrorCode::Closed, "the LocalIndexer is closed")
}

/// Runs `f` on the indexer under its lock (`ERR_CLOSED` once closed).
pub fn with<T>(inner: &Shared, f: impl FnOnce(&mut LocalIndexer) -> KvResult<T>) -> KvResult<T> {
  let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
  f(g.as_mut().ok_or_else(closed)?)
}

/// Off-thread work in core terms: `run` on a worker thread, `output` back on the JS thread.
pub trait CoreWork: Send + Sized {
  type Output: Send + 'static;
  type JsValue: ToNapiValue + TypeName;
  fn run(&mut self) -> KvResult<Self::Output>;
  fn output(output: Self::Output) -> Self::JsValue;
}

/// A [`CoreWork`] as an N-API task: panics become `ERR_INTERNAL`, and a failure rejects with
/// its core error's code.
pub struct Coded<W> {
  work: W,
  failure: Option<KvError>,
}

impl<W: CoreWork> Coded<W> {
  pub fn task(work: W) -> AsyncTask<Coded<W>> {
    AsyncTask::new(Coded {
      work,
      failure: None,
    })
  }
}

impl<W: CoreWork> Task for Coded<W> {
  type Output = W::Output;
  type JsValue = W::JsValue;

  fn compute(&mut self) -> napi::Result<Self::Output> {
    guard(|| self.work.run()).map_err(|e| {
      let failed = napi::Error::new(Status::GenericFailure, e.message.clone());
      self.failure = Some(e);
      failed
    })
  }

  fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
    Ok(W::output(output))
  }

  fn reject(&mut self, env: Env, err: napi::Error) -> napi::Result<Self::JsValue> {
    match self.failure.take() {
      Some(e) => Err(napi::Error::from(JsError::from(to_js(e)).into_unknown(env))),
      None => Err(err),
    }
  }
}

/// The whole index as a tree dump: a consistent cut, holding the same lock as apply for its
/// whole build.
pub struct Dump {
  pub inner: Shared,
}

impl CoreWork for Dump {
  type Output = Recovery;
  type JsValue = RecoveryOut;

  fn run(&mut self) -> KvResult<Recovery> {
    with(&self.inner, |ix| Ok(ix.tree_dump()))
  }

  fn output(output: Recovery) -> RecoveryOut {
    recovery_out(output)
  }
}

/// A `/kv_recover` answer: taken under the lock (a dump is a consistent cut; an `Events` part
/// as the log's shared bytes), then decoded and encoded without it.
pub struct Recover {
  pub inner: Shared,
  pub range: RecoverRange,
  pub msgpack: bool,
}

pub enum RecoverRange {
  Seqs(Option<u64>, Option<u64>),
  /// Raw query parameters.
  Query(Option<String>, Option<String>),
}

/// An answer being encoded: the answer and where its encoding stands.
type Encoding = (Recovery, AnswerCursor);

impl CoreWork for Recover {
  type Output = (&'static str, Vec<u8>, Option<Encoding>);
  type JsValue = RecoverAnswer;

  fn run(&mut self) -> KvResult<Self::Output> {
    let cut = with(&self.inner, |ix| {
      Ok(match &self.range {
        RecoverRange::Seqs(s, e) => RecoveryCut::Done(ix.get_events(*s, *e)),
        RecoverRange::Query(s, e) => ix.recover_query_cut(s.as_deref(), e.as_deref()),
      })
    })?;
    let answer = cut.finish();
    let mut cursor = AnswerCursor::new(self.msgpack);
    // An `Events` part is bounded (RECOVER_BATCHES_PER_ANSWER) and goes out whole, which keeps
    // a client walking the log in parts fast; a tree dump, as large as the index, goes in chunks.
    let target = if matches!(answer, Recovery::Events { .. }) {
      usize::MAX
    } else {
      CHUNK_BYTES
    };
    let body = cursor.next_chunk(&answer, target).unwrap_or_default();
    let kind = answer.kind();
    Ok((kind, body, (!cursor.is_done()).then_some((answer, cursor))))
  }

  fn output((kind, body, rest): Self::Output) -> RecoverAnswer {
    RecoverAnswer {
      kind: kind.to_string(),
      body: body.into(),
      rest: rest.map(|e| RecoverChunks {
        encoding: Arc::new(Mutex::new(Some(e))),
      }),
    }
  }
}

/// The rest of a `/kv_recover` answer: each `next()` encodes about `CHUNK_BYTES` more off the
/// JS thread, so a large answer is never whole in memory once encoded.
#[napi]
pub struct RecoverChunks {
  encoding: Arc<Mutex<Option<Encoding>>>,
}

#[napi]
impl RecoverChunks {
  /// The next chunk, or `null` once the answer is complete.
  #[napi(ts_return_type = "Promise<Buffer | null>")]
  pub fn next(&self) -> AsyncTask<Coded<NextChunk<Encoding>>> {
    Coded::task(NextChunk(self.encoding.clone()))
  }

  /// Drops the rest of the answer (a client that went away).
  #[napi]
  pub fn release(&self) {
    release(&self.encoding);
  }
}

/// Something read as a sequence of encoded chunks, one per `next_chunk`, `None` after the last.
pub trait ChunkSource: Send + 'static {
  fn next_chunk(&mut self) -> Option<Vec<u8>>;
}

impl ChunkSource for Encoding {
  fn next_chunk(&mut self) -> Option<Vec<u8>> {
    let (answer, cursor) = self;
    cursor.next_chunk(answer, CHUNK_BYTES)
  }
}

impl ChunkSource for SnapshotChunks {
  fn next_chunk(&mut self) -> Option<Vec<u8>> {
    SnapshotChunks::next_chunk(self).map(|(_, bytes)| bytes)
  }
}

/// Drops what is left of a chunked answer.
fn release<S>(source: &Mutex<Option<S>>) {
  source.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// The next chunk of a shared source, encoded off the JS thread; the source is dropped after its
/// last chunk.
pub struct NextChunk<S: ChunkSource>(Arc<Mutex<Option<S>>>);

impl<S: ChunkSource> CoreWork for NextChunk<S> {
  type Output = Option<Vec<u8>>;
  type JsValue = Option<Buffer>;

  fn run(&mut self) -> KvResult<Self::Output> {
    let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
    let next = g.as_mut().and_then(S::next_chunk);
    if next.is_none() {
      g.take();
    }
    Ok(next)
  }

  fn output(output: Self::Output) -> Option<Buffer> {
    output.map(Buffer::from)
  }
}

/// Publishes segments taken from a publish queue.
pub struct Drain {
  pub inner: Shared,
  pub segments: Option<Vec<Taken>>,
  pub ts: f64,
  pub dp_rank: Option<i32>,
}

impl CoreWork for Drain {
  type Output = Drained;
  type JsValue = PublishedOut;

  fn run(&mut self) -> KvResult<Drained> {
    let segments = self.segments.take().unwrap_or_default();
    with(&self.inner, |ix| {
      let d = ix.publish_segments(segments, self.ts, self.dp_rank)?;
      Ok(ix.after_deferred(d))
    })
  }

  fn output(output: Drained) -> PublishedOut {
    published_out(output)
  }
}

/// An in-stream snapshot for a gRPC subscriber: the tree dump taken under the lock (a consistent
/// cut at the last seq), planned into `KvSnapshotChunk` batches without it.
pub struct Snapshot {
  pub inner: Shared,
  pub max_blocks: usize,
  pub ts: f64,
  /// `(rank, batches)` for `KvSnapshotChunk.unknown_before`.
  pub unknown_before: Vec<(u32, u64)>,
}

impl CoreWork for Snapshot {
  type Output = Option<SnapshotChunks>;
  type JsValue = Option<SnapshotOut>;

  fn run(&mut self) -> KvResult<Self::Output> {
    let dump = with(&self.inner, |ix| Ok(ix.tree_dump()))?;
    let unknown_before = std::mem::take(&mut self.unknown_before);
    Ok(
      SnapshotChunks::of_dump(dump, self.ts, self.max_blocks)
        .map(|s| s.with_unknown_before(unknown_before)),
    )
  }

  fn output(output: Self::Output) -> Option<SnapshotOut> {
    output.map(|s| SnapshotOut {
      last_seq: BigInt::from(s.last_seq()),
      count: s.count(),
      blocks: BigInt::from(s.blocks()),
      chunks: SnapshotStream {
        chunks: Arc::new(Mutex::new(Some(s))),
      },
    })
  }
}

/// A planned snapshot: its size, and its chunks.
#[napi(object, object_from_js = false)]
pub struct SnapshotOut {
  /// The seq the state was taken at: the last chunk's; live batches continue after it.
  pub last_seq: BigInt,
  /// Chunks, numbered `lastSeq - count + 1 ..= lastSeq`.
  pub count: u32,
  /// Live blocks in the snapshot.
  pub blocks: BigInt,
  pub chunks: SnapshotStream,
}

/// A snapshot's `KvEventBatch` chunks, each encoded by `next()` off the JS thread.
#[napi]
pub struct SnapshotStream {
  chunks: Arc<Mutex<Option<SnapshotChunks>>>,
}

#[napi]
impl SnapshotStream {
  /// The next chunk's bytes, or `null` after the last.
  #[napi(ts_return_type = "Promise<Buffer | null>")]
  pub fn next(&self) -> AsyncTask<Coded<NextChunk<SnapshotChunks>>> {
    Coded::task(NextChunk(self.chunks.clone()))
  }

  /// Drops the rest of the snapshot (a subscriber that went away).
  #[napi]
  pub fn release(&self) {
    release(&self.chunks);
  }
}
