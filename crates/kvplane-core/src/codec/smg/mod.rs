//! SMG's `smg.grpc.common` messages (proto/common.proto; docs/protocol.md#grpc-subscribekvevents):
//! the `KvEventBatch` stream and the `SubscribeKvEventsRequest`, written and read by hand on
//! `codec::protobuf`: fields in number order, proto3 defaults omitted, `optional` fields written
//! when present, repeated scalars packed. That is what the official runtime emits for the same
//! message.

mod decode;
mod encode;
mod load;
mod snapshot;
#[cfg(test)]
mod tests;

pub use decode::{
  batch_head, decode_batch, decode_subscribe_request, DecodedProtoBatch, SubscribeRequest,
};
pub use encode::{encode_batch, encode_health_response, encode_subscribe_request, HealthForm};
pub use load::{
  get_loads_request, EngineLoads, LoadLayout, RecordOpts, SGLANG_LOADS, TOKENSPEED_LOADS,
  VLLM_LOADS,
};
pub use snapshot::{SnapshotChunks, SNAPSHOT_CHUNK_BLOCKS};

// Field numbers, per message (proto/common.proto).

// `SubscribeKvEventsRequest`
const SUBSCRIBE_START_SEQUENCE_NUMBER: u32 = 1;
const SUBSCRIBE_LOAD_RECORDS_EARLY: u32 = 2;

// `KvEventBatch`
const BATCH_SEQUENCE_NUMBER: u32 = 1;
const BATCH_TIMESTAMP: u32 = 2;
const BATCH_EVENTS: u32 = 3;
const BATCH_DP_RANK: u32 = 4;
const BATCH_SNAPSHOT: u32 = 7;

// `KvSnapshotChunk`
const SNAPSHOT_INDEX: u32 = 1;
const SNAPSHOT_COUNT: u32 = 2;
const SNAPSHOT_BLOCKS: u32 = 3;
const SNAPSHOT_UNKNOWN_BEFORE: u32 = 4;

// `KvCacheEvent` (`stored`, `removed` and `cleared` are the `data` oneof)
const EVENT_ID: u32 = 1;
const EVENT_STORED: u32 = 2;
const EVENT_REMOVED: u32 = 3;
const EVENT_CLEARED: u32 = 4;

// `KvBlocksStored`
const STORED_BLOCKS: u32 = 1;
const STORED_PARENT_BLOCK_HASH: u32 = 2;
const STORED_TIER: u32 = 3;
const STORED_MEDIUM: u32 = 4;
const STORED_GROUP_IDX: u32 = 5;
const STORED_KV_CACHE_SPEC_KIND: u32 = 6;
const STORED_KV_CACHE_SPEC_SLIDING_WINDOW: u32 = 7;
const STORED_LOCALITY: u32 = 8;
const STORED_OWNERSHIP: u32 = 9;
const STORED_SESSION_ID: u32 = 10;
const STORED_LORA_NAME: u32 = 11;
const STORED_CACHE_SALT: u32 = 12;

// `KvBlock`
const BLOCK_HASH: u32 = 1;
const BLOCK_TOKEN_IDS: u32 = 2;
const BLOCK_SIZE: u32 = 3;
const BLOCK_LORA_ID: u32 = 4;
const BLOCK_CACHE_LEVEL: u32 = 5;
const BLOCK_EXTRA_KEYS: u32 = 6;

// `KvBlockExtraKey` (a oneof)
const EXTRA_KEY_TEXT: u32 = 1;
const EXTRA_KEY_BLOB: u32 = 2;
const EXTRA_KEY_NUMBER: u32 = 3;
const EXTRA_KEY_MULTIMODAL: u32 = 4;

// `KvMultimodalKey`
const MULTIMODAL_IDENTIFIER: u32 = 1;
const MULTIMODAL_OFFSET: u32 = 2;

// `KvBlocksRemoved`
const REMOVED_BLOCK_HASHES: u32 = 1;
const REMOVED_CACHE_LEVEL: u32 = 2;
const REMOVED_TIER: u32 = 3;
const REMOVED_MEDIUM: u32 = 4;
const REMOVED_GROUP_IDX: u32 = 5;
const REMOVED_LOCALITY: u32 = 6;
const REMOVED_OWNERSHIP: u32 = 7;

/// The status message of an expired cursor, the text SMG's gateway recognizes
/// (docs/protocol.md#grpc-subscribekvevents).
pub fn expired_cursor_message(requested: u64, oldest: u64) -> String {
  format!(
    "expired KV event replay cursor: requested sequence {requested}, oldest available sequence {oldest}"
  )
}

/// The proto `cache_level` of a medium (any case): 0 device, 1 host memory, 2 disk, 3 external
/// pool; other media have no level.
pub fn cache_level_of_medium(medium: Option<&str>) -> Option<i32> {
  const LEVELS: [&[&str]; 4] = [
    &["GPU", "DEVICE"],
    &["CPU", "CPU_PINNED", "CPU_TIER1"],
    &["CPU_TIER2", "DISK", "NVME", "STORAGE", "FS"],
    &["EXTERNAL", "OBJ", "NETWORK", "REMOTE", "SHARED"],
  ];
  let m = medium?;
  LEVELS
    .iter()
    .position(|names| names.iter().any(|n| m.eq_ignore_ascii_case(n)))
    .map(|l| l as i32)
}

/// The medium a proto `cache_level` stands for (the inverse of [`cache_level_of_medium`]).
pub fn medium_of_cache_level(level: i32) -> Option<&'static str> {
  match level {
    0 => Some("GPU"),
    1 => Some("CPU"),
    2 => Some("DISK"),
    3 => Some("EXTERNAL"),
    _ => None,
  }
}

/// `KvCacheTier` of a medium: the cache level + 1 (0 is unspecified).
fn tier_of_medium(medium: Option<&str>) -> Option<i32> {
  cache_level_of_medium(medium).map(|l| l + 1)
}

/// The medium a `KvCacheTier` stands for.
fn medium_of_tier(t: u64) -> Option<&'static str> {
  match t {
    1..=4 => medium_of_cache_level(t as i32 - 1),
    _ => None,
  }
}

/// `KvCacheLocality` of a locality string.
fn locality_enum(l: Option<&str>) -> Option<i32> {
  let l = l?;
  if l.eq_ignore_ascii_case("LOCAL") {
    Some(1)
  } else if l.eq_ignore_ascii_case("REMOTE") {
    Some(2)
  } else {
    None
  }
}

/// The locality string of a `KvCacheLocality`.
fn locality_name(v: u64) -> Option<String> {
  match v {
    1 => Some("LOCAL".to_owned()),
    2 => Some("REMOTE".to_owned()),
    _ => None,
  }
}
