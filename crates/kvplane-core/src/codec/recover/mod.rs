//! `/kv_recover` answers (docs/protocol.md#http-kv_recover) as JSON or msgpack, externally tagged:
//!
//! ```text
//! {"Events":       {"batches": [{"seq", "ts", "dp_rank", "events": [...]}], "next_start"?, "last_seq", "epoch"}}
//! {"TreeDump":     {"workers": [{"worker_id", "dp_rank", "events": [...]}], "last_seq", "epoch"}}
//! {"TooNew":       {"last_seq", "epoch"}}
//! {"InvalidRange": {"reason", "last_seq", "epoch"}}
//! ```
//!
//! Events use vLLM's field names (`type` = `BlockStored` | `BlockRemoved` | `AllBlocksCleared`);
//! in msgpack they are exactly vLLM's map encoding. Every u64 is an exact integer.
//! TRT-LLM-only events (`updated`, `created`) are not part of the published stream and are left
//! out here too.

mod chunks;
mod decode;
mod json;

pub use chunks::{AnswerCursor, CHUNK_BYTES};
pub use decode::from_msgpack;

use crate::stream::Recovery;

/// The whole answer as JSON text.
pub fn to_json(r: &Recovery) -> String {
  let mut cursor = AnswerCursor::new(false);
  let bytes = cursor.next_chunk(r, usize::MAX).unwrap_or_default();
  String::from_utf8(bytes).expect("JSON pieces are written as UTF-8 strings")
}

/// The whole answer as msgpack (same structure; events in vLLM's map encoding).
pub fn to_msgpack(r: &Recovery) -> Vec<u8> {
  AnswerCursor::new(true)
    .next_chunk(r, usize::MAX)
    .unwrap_or_default()
}

/// Parses the raw `start` / `end` parameters of a `/kv_recover` query: decimal u64s, either
/// absent. `Err` holds the reason a malformed one is an `InvalidRange`.
pub fn parse_range(
  start: Option<&str>,
  end: Option<&str>,
) -> Result<(Option<u64>, Option<u64>), String> {
  let parse = |name: &str, v: Option<&str>| match v {
    None => Ok(None),
    Some(t) => match t.parse::<u64>() {
      Ok(n) if !t.starts_with('+') => Ok(Some(n)),
      _ => Err(format!(
        "{name} {t:?} is not a seq (an integer in 0..=2^64-1)"
      )),
    },
  };
  Ok((parse("start", start)?, parse("end", end)?))
}
