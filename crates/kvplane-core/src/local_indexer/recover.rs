//! Recovery answers: the replay log's batches, or a consistent tree dump of the index.

use super::LocalIndexer;
use crate::codec::recover::parse_range;
use crate::stream::{Recovery, RecoveryCut};

/// Batches one `/kv_recover` `Events` answer carries at most (about 2 MiB of msgpack at full
/// batches; each part holds the publisher's lock while its batches are decoded); a longer range
/// is answered in parts, each naming its `next_start`.
pub const RECOVER_BATCHES_PER_ANSWER: usize = 16;

impl LocalIndexer {
  /// `Events`, `TreeDump`, `TooNew` or `InvalidRange` for `start..=end`
  /// (docs/protocol.md#http-kv_recover).
  pub fn get_events(&self, start: Option<u64>, end: Option<u64>) -> Recovery {
    self.stream.recover(start, end, None, || self.index.dump())
  }

  /// The `/kv_recover` answer for its raw `start` / `end` parameters (decimal u64s, either
  /// absent; malformed ones are `InvalidRange`): `get_events`, with at most
  /// `RECOVER_BATCHES_PER_ANSWER` batches.
  pub fn recover_query(&self, start: Option<&str>, end: Option<&str>) -> Recovery {
    self.recover_query_cut(start, end).finish()
  }

  /// `recover_query` as taken under the lock: an `Events` answer's batches are decoded by
  /// `RecoveryCut::finish` after it is released, so a part never holds up publishing.
  pub fn recover_query_cut(&self, start: Option<&str>, end: Option<&str>) -> RecoveryCut {
    match parse_range(start, end) {
      Ok((s, e)) => self
        .stream
        .recover_cut(s, e, Some(RECOVER_BATCHES_PER_ANSWER), || self.index.dump()),
      Err(reason) => RecoveryCut::Done(self.stream.invalid_range(reason)),
    }
  }

  /// The whole index as stored events, with the seq it reflects.
  pub fn tree_dump(&self) -> Recovery {
    self.get_events(None, None)
  }
}
