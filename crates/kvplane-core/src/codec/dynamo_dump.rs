//! The body of Dynamo's indexer `GET /dump` (docs/protocol.md#router-side-kvplane-indexer),
//! written by the indexer (`write_events`) and read by one recovering from a peer (`--peers`,
//! `parse_dynamo_dump`): one entry per index, named
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
use std::io::Write;

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
  Tier::ALL
    .into_iter()
    .find(|&t| tier_name(t) == name.unwrap_or("device"))
}

/// A tier as Dynamo's dump names it (`storage_tier`).
fn tier_name(t: Tier) -> &'static str {
  match t {
    Tier::Device => "device",
    Tier::Host => "host_pinned",
    Tier::Disk => "disk",
  }
}

/// An index's dumped segments as the `events` of its `/dump` entry, in pieces of about
/// `piece_blocks` blocks each (whole events), each piece events separated by commas: the caller
/// joins the pieces with commas inside `[` `]`, writing one at a time. Each block has its
/// `kvplane_key`, and its `tokens_hash` when the segment has content hashes.
pub fn write_events(segments: &[DumpSegment], piece_blocks: usize) -> Vec<Vec<u8>> {
  let mut pieces = Vec::new();
  let mut out = Vec::new();
  let mut blocks = 0;
  for s in segments {
    if blocks >= piece_blocks.max(1) {
      pieces.push(std::mem::take(&mut out));
      blocks = 0;
    }
    if !out.is_empty() {
      out.push(b',');
    }
    write_event(s, &mut out);
    blocks += s.block_hashes.len();
  }
  if !out.is_empty() {
    pieces.push(out);
  }
  pieces
}

fn write_event(s: &DumpSegment, out: &mut Vec<u8>) {
  // Writing to a Vec cannot fail.
  let _ = write!(
    out,
    r#"{{"worker_id":{},"storage_tier":"{}","residency_domain":"worker","event":{{"event_id":0,"data":{{"stored":{{"parent_hash":"#,
    s.worker.worker_id,
    tier_name(s.tier)
  );
  match s.parent {
    Some(p) => {
      let _ = write!(out, "{p}");
    }
    None => out.extend_from_slice(b"null"),
  }
  out.extend_from_slice(br#","start_position":null,"blocks":["#);
  let hashed = s.content_hashes.len() == s.block_hashes.len();
  for (i, h) in s.block_hashes.iter().enumerate() {
    if i > 0 {
      out.push(b',');
    }
    let _ = write!(out, r#"{{"block_hash":{h}"#);
    if hashed {
      let _ = write!(out, r#","tokens_hash":{}"#, s.content_hashes[i]);
    }
    out.extend_from_slice(br#","mm_extra_info":null"#);
    if let Some(k) = s.keys.get(i) {
      let _ = write!(out, r#","kvplane_key":{k}"#);
    }
    out.push(b'}');
  }
  let _ = write!(out, r#"]}}}},"dp_rank":{}}}}}"#, s.worker.dp_rank);
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
  fn what_is_written_reads_back() {
    let segments = vec![
      DumpSegment {
        tier: Tier::Device,
        worker: WorkerKey {
          worker_id: u64::MAX,
          dp_rank: 2,
        },
        parent: None,
        block_hashes: vec![1, 2],
        content_hashes: vec![11, 12],
        keys: vec![21, 22],
      },
      DumpSegment {
        tier: Tier::Host,
        worker: WorkerKey {
          worker_id: 5,
          dp_rank: 0,
        },
        parent: Some(2),
        block_hashes: vec![3],
        content_hashes: vec![],
        keys: vec![23],
      },
      DumpSegment {
        tier: Tier::Disk,
        worker: WorkerKey {
          worker_id: 5,
          dp_rank: 0,
        },
        parent: Some(3),
        block_hashes: vec![4],
        content_hashes: vec![14],
        keys: vec![],
      },
    ];
    let pieces = write_events(&segments, 2);
    assert_eq!(pieces.len(), 2);
    let events = pieces.join(&b","[..]);
    let body = [
      &br#"{"m:default":{"block_size":16,"events":["#[..],
      &events,
      b"]}}",
    ]
    .concat();
    let back = parse_dynamo_dump(&body).unwrap();
    assert_eq!(back[0].segments, segments);
    assert_eq!(back[0].skipped, 0);
    // Valid JSON, with Dynamo's fields.
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let first = &v["m:default"]["events"][0];
    assert_eq!(first["residency_domain"], "worker");
    assert!(first["event"]["data"]["stored"]["parent_hash"].is_null());
    assert!(first["event"]["data"]["stored"]["start_position"].is_null());
    assert_eq!(
      first["event"]["data"]["stored"]["blocks"][0]["tokens_hash"],
      11
    );
    assert_eq!(v["m:default"]["events"][1]["storage_tier"], "host_pinned");
    assert!(
      v["m:default"]["events"][1]["event"]["data"]["stored"]["blocks"][0]
        .get("tokens_hash")
        .is_none()
    );
    assert!(write_events(&[], 4).is_empty());
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
