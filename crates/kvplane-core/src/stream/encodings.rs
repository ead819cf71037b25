//! A batch's encodings: one payload per format the stream carries, each encoded once and shared
//! by every consumer of that format (the log and ZMQ take the log's format, gRPC `SmgProto`).

use super::log::Payload;
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

  pub fn iter(&self) -> impl Iterator<Item = &(Format, Payload)> {
    self.0.iter()
  }

  pub fn into_vec(self) -> Vec<(Format, Payload)> {
    self.0
  }
}
