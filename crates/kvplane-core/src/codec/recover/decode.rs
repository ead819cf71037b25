//! Reading a `/kv_recover` answer in msgpack, as a router recovering from a node does: the four
//! answers back as `Recovery`. Events are vLLM's map encoding, read by the ZMQ stream's own event
//! decoder; events with a tag this version does not know are skipped, as there.

use crate::codec::msgpack::{decode_error, Int, Reader};
use crate::codec::zmq_msgpack::decode_event;
use crate::error::KvResult;
use crate::event::{Batch, KvEvent};
use crate::index::{DumpEvent, WorkerDump, WorkerKey};
use crate::stream::Recovery;

fn u64_of(r: &mut Reader<'_>, what: &str) -> KvResult<u64> {
  match r.read_int()? {
    Int::U(v) => Ok(v),
    v => Err(decode_error(format!("{what} {v:?} is not a u64"))),
  }
}

fn u32_of(r: &mut Reader<'_>, what: &str) -> KvResult<u32> {
  let v = u64_of(r, what)?;
  u32::try_from(v).map_err(|_| decode_error(format!("{what} {v} is not a u32")))
}

/// Events, those with an unknown tag skipped.
fn events(r: &mut Reader<'_>) -> KvResult<Vec<KvEvent>> {
  let n = r.read_array_len()?;
  let mut out = Vec::with_capacity(n);
  for _ in 0..n {
    if let Some(e) = decode_event(r)? {
      out.push(e);
    }
  }
  Ok(out)
}

/// `{seq, ts, dp_rank, events}`.
fn batch(r: &mut Reader<'_>) -> KvResult<Batch> {
  let mut b = Batch {
    seq: 0,
    ts: 0.0,
    dp_rank: None,
    events: Vec::new(),
  };
  for _ in 0..r.read_map_len()? {
    match r.read_str_bytes()? {
      b"seq" => b.seq = u64_of(r, "seq")?,
      b"ts" => b.ts = r.read_f64()?,
      b"dp_rank" if r.try_nil() => b.dp_rank = None,
      b"dp_rank" => {
        let v = r.read_int()?;
        let rank = v.as_i64().and_then(|v| i32::try_from(v).ok());
        b.dp_rank =
          Some(rank.ok_or_else(|| decode_error(format!("dp_rank {v:?} is out of range")))?);
      }
      b"events" => b.events = events(r)?,
      _ => r.skip()?,
    }
  }
  Ok(b)
}

/// `{worker_id, dp_rank, events}`: the worker's stored events.
fn worker(r: &mut Reader<'_>) -> KvResult<WorkerDump> {
  let mut w = WorkerDump {
    worker: WorkerKey {
      worker_id: 0,
      dp_rank: 0,
    },
    events: Vec::new(),
    contents: Vec::new(),
    keys: Vec::new(),
  };
  for _ in 0..r.read_map_len()? {
    match r.read_str_bytes()? {
      b"worker_id" => w.worker.worker_id = u64_of(r, "worker_id")?,
      b"dp_rank" => w.worker.dp_rank = u32_of(r, "dp_rank")?,
      b"events" => {
        w.events = events(r)?
          .into_iter()
          .map(|e| match e {
            KvEvent::Stored(s) => Ok::<DumpEvent, _>(s),
            _ => Err(decode_error("a tree dump holds stored events only")),
          })
          .collect::<KvResult<_>>()?;
      }
      _ => r.skip()?,
    }
  }
  Ok(w)
}

/// An array, each item read by `item`.
fn list<T>(r: &mut Reader<'_>, item: fn(&mut Reader<'_>) -> KvResult<T>) -> KvResult<Vec<T>> {
  let n = r.read_array_len()?;
  let mut out = Vec::with_capacity(n);
  for _ in 0..n {
    out.push(item(r)?);
  }
  Ok(out)
}

/// Reads a whole msgpack `/kv_recover` answer.
pub fn from_msgpack(bytes: &[u8]) -> KvResult<Recovery> {
  let mut r = Reader::new(bytes);
  if r.read_map_len()? != 1 {
    return Err(decode_error(
      "a recovery answer is a map of one key, its kind",
    ));
  }
  let kind = r.read_str()?.to_owned();
  let (mut last_seq, mut epoch, mut next_start) = (None, None, None);
  let (mut batches, mut workers, mut reason) = (None, None, None);
  for _ in 0..r.read_map_len()? {
    match r.read_str_bytes()? {
      b"last_seq" => last_seq = Some(u64_of(&mut r, "last_seq")?),
      b"epoch" => epoch = Some(u64_of(&mut r, "epoch")?),
      b"next_start" if r.try_nil() => next_start = None,
      b"next_start" => next_start = Some(u64_of(&mut r, "next_start")?),
      b"reason" => reason = Some(r.read_str()?.to_owned()),
      b"batches" => batches = Some(list(&mut r, batch)?),
      b"workers" => workers = Some(list(&mut r, worker)?),
      _ => r.skip()?,
    }
  }
  if !r.is_at_end() {
    return Err(decode_error(format!(
      "{} trailing bytes after the answer",
      bytes.len() - r.pos()
    )));
  }
  let missing = |what: &str| decode_error(format!("a {kind} answer without {what}"));
  let last_seq = last_seq.ok_or_else(|| missing("last_seq"))?;
  let epoch = epoch.ok_or_else(|| missing("epoch"))?;
  Ok(match kind.as_str() {
    "Events" => Recovery::Events {
      batches: batches.ok_or_else(|| missing("batches"))?,
      last_seq,
      epoch,
      next_start,
    },
    "TreeDump" => Recovery::TreeDump {
      workers: workers.ok_or_else(|| missing("workers"))?,
      last_seq,
      epoch,
    },
    "TooNew" => Recovery::TooNew { last_seq, epoch },
    "InvalidRange" => Recovery::InvalidRange {
      reason: reason.ok_or_else(|| missing("reason"))?,
      last_seq,
      epoch,
    },
    other => return Err(decode_error(format!("unknown recovery answer {other:?}"))),
  })
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::codec::recover::to_msgpack;
  use crate::event::{RemovedEvent, StoredEvent};

  fn stored(h: u64, parent: Option<u64>) -> StoredEvent {
    StoredEvent {
      block_hashes: vec![h, h + 1],
      parent_block_hash: parent,
      token_ids: (0..8).map(|t| (h as u32) * 8 + t).collect(),
      block_size: 4,
      lora_name: h.is_multiple_of(2).then(|| "adapter".to_string()),
      medium: Some("GPU".into()),
      ..Default::default()
    }
  }

  #[test]
  fn every_answer_reads_back_as_written() {
    let answers = [
      Recovery::Events {
        batches: vec![
          Batch {
            seq: 7,
            ts: 1.5,
            dp_rank: None,
            events: vec![KvEvent::Stored(stored(10, None)), KvEvent::Cleared],
          },
          Batch {
            seq: 8,
            ts: 2.5,
            dp_rank: Some(3),
            events: vec![KvEvent::Removed(RemovedEvent {
              block_hashes: vec![u64::MAX, 1],
              medium: Some("CPU".into()),
              ..Default::default()
            })],
          },
        ],
        last_seq: 9,
        epoch: u64::MAX - 1,
        next_start: Some(9),
      },
      Recovery::Events {
        batches: vec![],
        last_seq: 0,
        epoch: 1,
        next_start: None,
      },
      Recovery::TreeDump {
        workers: vec![
          WorkerDump {
            worker: WorkerKey {
              worker_id: 5,
              dp_rank: 0,
            },
            events: vec![stored(1, None), stored(3, Some(2))],
            contents: Vec::new(),
            keys: Vec::new(),
          },
          WorkerDump {
            worker: WorkerKey {
              worker_id: 5,
              dp_rank: 2,
            },
            events: vec![],
            contents: Vec::new(),
            keys: Vec::new(),
          },
        ],
        last_seq: 40,
        epoch: 2,
      },
      Recovery::TooNew {
        last_seq: 3,
        epoch: 4,
      },
      Recovery::InvalidRange {
        reason: "end 2 is before start 5".into(),
        last_seq: 6,
        epoch: 7,
      },
    ];
    for a in answers {
      assert_eq!(from_msgpack(&to_msgpack(&a)).unwrap(), a);
    }
  }

  #[test]
  fn malformed_answers_are_decode_errors() {
    let good = to_msgpack(&Recovery::TooNew {
      last_seq: 3,
      epoch: 4,
    });
    let mut trailing = good.clone();
    trailing.push(0);
    for bad in [
      &b""[..],
      b"\x80",                            // no kind
      b"\x81\xa4Nope\x80",                // an unknown kind, no fields
      b"\x81\xa6TooNew\x81\xa5epoch\x01", // no last_seq
      &good[..good.len() - 1],            // cut short
      &trailing[..],
    ] {
      let err = from_msgpack(bad).unwrap_err();
      assert_eq!(err.code, crate::error::ErrorCode::Decode, "{bad:?}");
    }
  }
}
