//! Recovery answers: the replay log's batches, or a consistent tree dump of the index.

use super::LocalIndexer;
use crate::codec::recover::parse_range;
use crate::stream::Recovery;

impl LocalIndexer {
  /// `Events`, `TreeDump`, `TooNew` or `InvalidRange` for `start..=end`
  /// (docs/protocol.md#http-kv_recover).
  pub fn get_events(&self, start: Option<u64>, end: Option<u64>) -> Recovery {
    self.stream.recover(start, end, || self.index.dump())
  }

  /// `get_events` for the raw `start` / `end` parameters of a `/kv_recover` query (decimal u64s,
  /// either absent); malformed ones are `InvalidRange`.
  pub fn recover_query(&self, start: Option<&str>, end: Option<&str>) -> Recovery {
    match parse_range(start, end) {
      Ok((s, e)) => self.get_events(s, e),
      Err(reason) => self.stream.invalid_range(reason),
    }
  }

  /// The whole index as stored events, with the seq it reflects.
  pub fn tree_dump(&self) -> Recovery {
    self.get_events(None, None)
  }
}
