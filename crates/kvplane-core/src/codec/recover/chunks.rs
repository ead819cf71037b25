//! An answer encoded piece by piece: a tree dump of millions of blocks goes out as chunks of
//! about `CHUNK_BYTES`, each encoded when the previous one has been sent, so the encoded answer
//! is never whole in memory.

use super::json::{batch_json, key, published, push_u64, stored_json};
use crate::codec::json::write_str;
use crate::codec::msgpack::Writer;
use crate::codec::zmq_msgpack::vllm::{encode_event, encode_stored};
use crate::event::EventRef;
use crate::stream::Recovery;

/// What one chunk of an answer reaches before it is handed out.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Where the encoding of an answer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
  Head,
  /// `Events`: batch `.0`. `TreeDump`: worker `.0`'s head (`.1` = 0) or its event `.1 - 1`.
  Item(usize, usize),
  Tail,
  Done,
}

/// The encoding position in one answer (JSON or msgpack). The answer itself is passed to each
/// `next_chunk`, so its owner keeps it between chunks.
#[derive(Debug)]
pub struct AnswerCursor {
  msgpack: bool,
  step: Step,
}

/// A chunk being written in one of the two formats.
enum Out {
  Json(String),
  Msgpack(Writer),
}

impl Out {
  fn len(&self) -> usize {
    match self {
      Out::Json(s) => s.len(),
      Out::Msgpack(w) => w.buf.len(),
    }
  }
}

impl AnswerCursor {
  pub fn new(msgpack: bool) -> AnswerCursor {
    AnswerCursor {
      msgpack,
      step: Step::Head,
    }
  }

  pub fn is_done(&self) -> bool {
    self.step == Step::Done
  }

  /// The next piece of `answer` (the same answer on every call), at least `target` bytes unless
  /// it ends the answer; `None` once the answer is complete.
  pub fn next_chunk(&mut self, answer: &Recovery, target: usize) -> Option<Vec<u8>> {
    if self.is_done() {
      return None;
    }
    let mut out = if self.msgpack {
      Out::Msgpack(Writer::new())
    } else {
      Out::Json(String::new())
    };
    while !self.is_done() && out.len() < target {
      self.step = self.emit(answer, &mut out);
    }
    Some(match out {
      Out::Json(s) => s.into_bytes(),
      Out::Msgpack(w) => w.into_inner(),
    })
  }

  /// Writes the current step's piece and returns the step after it.
  fn emit(&self, answer: &Recovery, out: &mut Out) -> Step {
    let items = match answer {
      Recovery::Events { batches, .. } => batches.len(),
      Recovery::TreeDump { workers, .. } => workers.len(),
      _ => 0,
    };
    let after = |i: usize| {
      if i + 1 < items {
        Step::Item(i + 1, 0)
      } else {
        Step::Tail
      }
    };
    match (self.step, answer, out) {
      (Step::Head, _, out) => {
        head(answer, out);
        match answer {
          Recovery::Events { .. } | Recovery::TreeDump { .. } if items > 0 => Step::Item(0, 0),
          Recovery::Events { .. } | Recovery::TreeDump { .. } => Step::Tail,
          _ => Step::Done,
        }
      }
      (Step::Item(i, _), Recovery::Events { batches, .. }, out) => {
        let b = &batches[i];
        match out {
          Out::Json(s) => {
            if i > 0 {
              s.push(',');
            }
            batch_json(b, s);
          }
          Out::Msgpack(w) => {
            w.map_len(4);
            w.str("seq");
            w.uint(b.seq);
            w.str("ts");
            w.f64(b.ts);
            w.str("dp_rank");
            match b.dp_rank {
              Some(d) => w.int(d as i64),
              None => w.nil(),
            }
            w.str("events");
            w.array_len(published(&b.events).count());
            for e in published(&b.events) {
              encode_event(&EventRef::of(e), w);
            }
          }
        }
        after(i)
      }
      (Step::Item(i, k), Recovery::TreeDump { workers, .. }, out) => {
        let wd = &workers[i];
        match out {
          Out::Json(s) if k == 0 => {
            if i > 0 {
              s.push(',');
            }
            s.push_str("{\"worker_id\":");
            push_u64(s, wd.worker.worker_id);
            key(s, "dp_rank");
            push_u64(s, wd.worker.dp_rank as u64);
            key(s, "events");
            s.push('[');
          }
          Out::Json(s) => {
            if k > 1 {
              s.push(',');
            }
            stored_json(&wd.events[k - 1], s);
          }
          Out::Msgpack(w) if k == 0 => {
            w.map_len(3);
            w.str("worker_id");
            w.uint(wd.worker.worker_id);
            w.str("dp_rank");
            w.uint(wd.worker.dp_rank as u64);
            w.str("events");
            w.array_len(wd.events.len());
          }
          Out::Msgpack(w) => encode_stored(&wd.events[k - 1], w),
        }
        if k < wd.events.len() {
          return Step::Item(i, k + 1);
        }
        if let Out::Json(s) = out {
          s.push_str("]}");
        }
        after(i)
      }
      (Step::Tail, _, out) => {
        tail(answer, out);
        Step::Done
      }
      (Step::Item(..) | Step::Done, _, _) => Step::Done,
    }
  }
}

fn seqs(answer: &Recovery) -> (u64, u64) {
  match answer {
    Recovery::Events {
      last_seq, epoch, ..
    }
    | Recovery::TreeDump {
      last_seq, epoch, ..
    }
    | Recovery::TooNew { last_seq, epoch }
    | Recovery::InvalidRange {
      last_seq, epoch, ..
    } => (*last_seq, *epoch),
  }
}

/// The answer's opening; for `TooNew` and `InvalidRange`, the whole answer.
fn head(answer: &Recovery, out: &mut Out) {
  match out {
    Out::Json(s) => {
      s.push_str("{\"");
      s.push_str(answer.kind());
      s.push_str("\":{");
      match answer {
        Recovery::Events { .. } => s.push_str("\"batches\":["),
        Recovery::TreeDump { .. } => s.push_str("\"workers\":["),
        Recovery::TooNew { .. } => {
          s.push_str("\"last_seq\":");
          push_u64(s, seqs(answer).0);
          key(s, "epoch");
          push_u64(s, seqs(answer).1);
          s.push_str("}}");
        }
        Recovery::InvalidRange { reason, .. } => {
          s.push_str("\"reason\":");
          write_str(s, reason);
          json_tail(answer, s);
        }
      }
    }
    Out::Msgpack(w) => {
      w.map_len(1);
      w.str(answer.kind());
      match answer {
        Recovery::Events {
          batches,
          next_start,
          ..
        } => {
          w.map_len(3 + usize::from(next_start.is_some()));
          if let Some(n) = next_start {
            w.str("next_start");
            w.uint(*n);
          }
          w.str("batches");
          w.array_len(batches.len());
        }
        Recovery::TreeDump { workers, .. } => {
          w.map_len(3);
          w.str("workers");
          w.array_len(workers.len());
        }
        Recovery::TooNew { .. } => {
          w.map_len(2);
          msgpack_seqs(answer, w);
        }
        Recovery::InvalidRange { reason, .. } => {
          w.map_len(3);
          w.str("reason");
          w.str(reason);
          msgpack_seqs(answer, w);
        }
      }
    }
  }
}

fn msgpack_seqs(answer: &Recovery, w: &mut Writer) {
  let (last_seq, epoch) = seqs(answer);
  w.str("last_seq");
  w.uint(last_seq);
  w.str("epoch");
  w.uint(epoch);
}

/// The answer's closing after its items (`Events`, `TreeDump`).
fn tail(answer: &Recovery, out: &mut Out) {
  match out {
    Out::Json(s) => {
      s.push(']');
      json_tail(answer, s);
    }
    Out::Msgpack(w) => msgpack_seqs(answer, w),
  }
}

/// `next_start` when there is one, `last_seq`, `epoch`, and the closing braces.
fn json_tail(answer: &Recovery, s: &mut String) {
  let (last_seq, epoch) = seqs(answer);
  if let Recovery::Events {
    next_start: Some(n),
    ..
  } = answer
  {
    key(s, "next_start");
    push_u64(s, *n);
  }
  key(s, "last_seq");
  push_u64(s, last_seq);
  key(s, "epoch");
  push_u64(s, epoch);
  s.push_str("}}");
}
