//! A batch's encodings: one payload per format the stream carries, each encoded once and shared
//! by every consumer of that format (the log and ZMQ take the log's format, gRPC `SmgProto`).

use super::log::{Logged, Payload};
use super::{dialect_of_log, recovery};
use crate::codec::Format;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
pub struct Encodings(Vec<(Format, Payload)>);

impl Encodings {
  /// Takes `(format, bytes)` pairs, the log's format first (never empty). The log's payload is
  /// shrunk to fit: the replay log keeps it.
  pub fn new(encoded: Vec<(Format, Vec<u8>)>) -> Encodings {
    debug_assert!(!encoded.is_empty());
    Encodings(
      encoded
        .into_iter()
        .enumerate()
        .map(|(i, (f, mut bytes))| {
          if i == 0 {
            bytes.shrink_to_fit();
          }
          (f, Arc::new(bytes))
        })
        .collect(),
    )
  }

  /// The payload in the log's format (what the replay log keeps).
  pub fn logged(&self) -> &Payload {
    &self.0[0].1
  }

  /// The payload in `format`, if the stream carries it.
  pub fn get(&self, format: Format) -> Option<&Payload> {
    self.0.iter().find(|(f, _)| *f == format).map(|(_, p)| p)
  }

  /// One payload per format of `formats`, in that order: the batch's own encodings, moved out
  /// (a payload only this batch holds is not copied), or, for a format the stream took up after
  /// the batch (seq `seq`) was encoded, its logged payload re-encoded: the bytes a replay in that
  /// format gives.
  pub fn into_formats(self, seq: u64, formats: &[Format]) -> Vec<Payload> {
    let (log_format, logged) = (self.0[0].0, self.0[0].1.clone());
    let mut own = self.0;
    formats
      .iter()
      .map(|&f| match own.iter().position(|(g, _)| *g == f) {
        Some(k) => own.swap_remove(k).1,
        None => {
          let logged = Logged {
            seq,
            payload: logged.clone(),
          };
          recovery::reencode_logged(&logged, dialect_of_log(log_format), f)
        }
      })
      .collect()
  }

  pub fn iter(&self) -> impl Iterator<Item = &(Format, Payload)> {
    self.0.iter()
  }

  pub fn into_vec(self) -> Vec<(Format, Payload)> {
    self.0
  }
}
