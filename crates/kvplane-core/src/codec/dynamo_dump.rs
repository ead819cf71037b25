//! The body of Dynamo's indexer `GET /dump` (docs/protocol.md#router-side-kvplane-indexer), read
//! by an indexer recovering from a peer (`--peers`): one entry per index, named
//! `model_name:routing_group`, `{"block_size": u32, "events": [RouterEvent]}`, each event
//! `{"worker_id": u64, "storage_tier"?: "device" | "host_pinned" | "disk", "event": {"dp_rank"?:
//! u32, "data": {"stored": {"parent_hash": u64 | null, "blocks": [{"block_hash": u64,
//! "tokens_hash"?: u64, "kvplane_key"?: u64}]}}}}`: every block of an event with a `tokens_hash`
//! (Dynamo's, and kvplane's when it keeps content hashes), a `kvplane_key` (kvplane's), or both. Fields not named
//! here are ignored; so are events other than stored ones (a dump holds none), stored ones of a
//! tier kvplane does not index, and ones whose blocks have neither: all counted.

use crate::error::{ErrorCode, KvError, KvResult};
use crate::index::WorkerKey;
use crate::router::{DumpSegment, Tier};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;

/// One index of a dump.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpedIndex {
  /// `model_name:routing_group`, as the dump names it.
  pub name: String,
  pub block_size: u32,
  /// Its stored events, in the dump's order (parents before children).
  pub segments: Vec<DumpSegment>,
  /// Events left out: not stored events, or of a tier not indexed.
  pub skipped: u64,
}

#[derive(Deserialize)]
struct IndexJson {
  block_size: u32,
  events: Vec<RouterEventJson>,
}

#[derive(Deserialize)]
struct RouterEventJson {
  worker_id: u64,
  #[serde(default)]
  storage_tier: Option<String>,
  event: EventJson,
}

#[derive(Deserialize)]
struct EventJson {
  #[serde(default)]
  dp_rank: u32,
  data: DataJson,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum DataJson {
  Stored(StoredJson),
  Removed(IgnoredAny),
  Cleared,
}

#[derive(Deserialize)]
struct StoredJson {
  #[serde(default)]
  parent_hash: Option<u64>,
  blocks: Vec<BlockJson>,
}

#[derive(Deserialize)]
struct BlockJson {
  block_hash: u64,
  #[serde(default)]
  tokens_hash: Option<u64>,
  /// kvplane's (`kvplane_key`): the block's key (its content hashes chained), so that kvplane
  /// indexers that keep no content hashes are peers of each other.
  #[serde(default, rename = "kvplane_key")]
  key: Option<u64>,
}

/// Malformed JSON, or a field of the wrong type, is `ERR_DECODE` naming where.
pub fn parse_dynamo_dump(body: &[u8]) -> KvResult<Vec<DumpedIndex>> {
  let all: BTreeMap<String, IndexJson> = serde_json::from_slice(body)
    .map_err(|e| KvError::new(ErrorCode::Decode, format!("a /dump answer: {e}")))?;
  Ok(
    all
      .into_iter()
      .map(|(name, ix)| {
        let mut skipped = 0;
        let segments = ix
          .events
          .into_iter()
          .filter_map(|ev| {
            let tier = tier_of(ev.storage_tier.as_deref());
            match (ev.event.data, tier) {
              (DataJson::Stored(s), Some(tier)) => {
                let every = |f: fn(&BlockJson) -> Option<u64>| -> Vec<u64> {
                  s.blocks
                    .iter()
                    .map(f)
                    .collect::<Option<_>>()
                    .unwrap_or_default()
                };
                let content_hashes = every(|b| b.tokens_hash);
                let keys = every(|b| b.key);
                if !s.blocks.is_empty() && content_hashes.is_empty() && keys.is_empty() {
                  skipped += 1;
                  return None;
                }
                Some(DumpSegment {
                  tier,
                  worker: WorkerKey {
                    worker_id: ev.worker_id,
                    dp_rank: ev.event.dp_rank,
                  },
                  parent: s.parent_hash,
                  block_hashes: s.blocks.iter().map(|b| b.block_hash).collect(),
                  content_hashes,
                  keys,
                })
              }
              _ => {
                skipped += 1;
                None
              }
            }
          })
          .collect();
        DumpedIndex {
          name,
          block_size: ix.block_size,
          segments,
          skipped,
        }
      })
      .collect(),
  )
}

/// Dynamo's names of the tiers kvplane indexes (absent: the device).
fn tier_of(name: Option<&str>) -> Option<Tier> {
  match name.unwrap_or("device") {
    "device" => Some(Tier::Device),
    "host_pinned" => Some(Tier::Host),
    "disk" => Some(Tier::Disk),
    _ => None,
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn reads_a_dump_as_dynamo_and_kvplane_write_it() {
    let body = br#"{"m:default":{"block_size":16,"events":[
      {"worker_id":2,"storage_tier":"device","residency_domain":"worker","event":{"event_id":0,
       "data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[
         {"block_hash":18446744073709551615,"tokens_hash":4557790146463734695,"mm_extra_info":null}]}},"dp_rank":1}},
      {"worker_id":2,"storage_tier":"host_pinned","event":{"event_id":1,
       "data":{"stored":{"parent_hash":18446744073709551615,"blocks":[{"block_hash":7,"tokens_hash":8,"kvplane_key":9}]}}}},
      {"worker_id":2,"event":{"data":{"stored":{"parent_hash":7,"blocks":[{"block_hash":10,"kvplane_key":11}]}}}},
      {"worker_id":2,"event":{"data":{"stored":{"blocks":[{"block_hash":12,"kvplane_key":13},{"block_hash":14}]}}}},
      {"worker_id":3,"storage_tier":"external","event":{"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":2}]}}}},
      {"worker_id":3,"event":{"data":"cleared"}}]},
      "n:g":{"block_size":32,"events":[]}}"#;
    let d = parse_dynamo_dump(body).unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(
      (d[0].name.as_str(), d[0].block_size, d[0].skipped),
      ("m:default", 16, 3)
    );
    let w = |dp_rank| WorkerKey {
      worker_id: 2,
      dp_rank,
    };
    assert_eq!(
      d[0].segments,
      vec![
        DumpSegment {
          tier: Tier::Device,
          worker: w(1),
          parent: None,
          block_hashes: vec![u64::MAX],
          content_hashes: vec![4557790146463734695],
          keys: vec![],
        },
        DumpSegment {
          tier: Tier::Host,
          worker: w(0),
          parent: Some(u64::MAX),
          block_hashes: vec![7],
          content_hashes: vec![8],
          keys: vec![9],
        },
        DumpSegment {
          tier: Tier::Device,
          worker: w(0),
          parent: Some(7),
          block_hashes: vec![10],
          content_hashes: vec![],
          keys: vec![11],
        },
      ]
    );
    assert_eq!(
      (d[1].name.as_str(), d[1].block_size, d[1].segments.len()),
      ("n:g", 32, 0)
    );
  }

  #[test]
  fn refuses_what_is_not_a_dump() {
    for body in [
      &b"[]"[..],
      b"{\"m:default\":{\"events\":[]}}",
      b"{\"m:default\":{\"block_size\":16,\"events\":[{\"worker_id\":-1,\"event\":{\"data\":\"cleared\"}}]}}",
      b"{\"m:default\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{\"data\":{\"stored\":{\"blocks\":[{\"tokens_hash\":1}]}}}}]}}",
      b"{\"m:default\":{\"block_size\":16,\"events\":[]}",
    ] {
      let e = parse_dynamo_dump(body).unwrap_err();
      assert_eq!(e.code, ErrorCode::Decode, "{}", String::from_utf8_lossy(body));
    }
  }
}
