//! Where a subscription from a start seq begins (docs/protocol.md#grpc-subscribekvevents).

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
  /// Start 0: live from the next batch.
  Live,
  /// Replay the log from this seq, then live (it may be `last_seq + 1`: nothing to replay).
  Replay(u64),
  /// Older than the log, or beyond the newest batch (a consumer of another epoch): the consumer
  /// must clear its state and subscribe from 0.
  Expired { requested: u64, oldest: u64 },
}
