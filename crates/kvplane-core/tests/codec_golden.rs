//! Every fixture of fixtures/codec.json (made by msgspec with each generation's structs, the
//! official protobuf runtime with SMG's messages, and TensorRT-LLM's JSON shape): decodes to the
//! expected normalized events or fails with the expected code; "reencode" cases come back byte
//! for byte from kvplane's encoder.

use kvplane_core::codec::value::Value;
use kvplane_core::codec::{self, Dialect, Format};
use kvplane_core::event::{Batch, KvEvent};
use serde_json::{json, Map, Value as J};

fn fixtures() -> J {
  let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/codec.json");
  serde_json::from_str(&std::fs::read_to_string(path).expect("fixtures/codec.json")).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
  (0..s.len())
    .step_by(2)
    .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
    .collect()
}

fn hex(b: &[u8]) -> String {
  b.iter().map(|x| format!("{x:02x}")).collect()
}

fn value_json(v: &Value) -> J {
  match v {
    Value::Nil => J::Null,
    Value::Bool(b) => json!(b),
    Value::Uint(u) => json!(u),
    Value::Int(i) => json!(i),
    Value::Float(f) => json!(f),
    Value::Str(s) => json!(s),
    Value::Bin(b) => json!({ "$bin": hex(b) }),
    Value::Array(a) => J::Array(a.iter().map(value_json).collect()),
    Value::Map(m) => J::Object(
      m.iter()
        .map(|(k, v)| match k {
          Value::Str(s) => (s.clone(), value_json(v)),
          other => (format!("{other:?}"), value_json(v)),
        })
        .collect(),
    ),
  }
}

fn strs(v: &[u64]) -> J {
  J::Array(v.iter().map(|h| json!(h.to_string())).collect())
}

fn put<T: Into<J>>(m: &mut Map<String, J>, k: &str, v: Option<T>) {
  if let Some(v) = v {
    m.insert(k.to_owned(), v.into());
  }
}

/// The normalized model as the generator writes it (u64 values as decimal strings).
fn event_json(e: &KvEvent) -> J {
  let mut m = Map::new();
  match e {
    KvEvent::Stored(s) => {
      m.insert("type".into(), json!("stored"));
      m.insert("block_hashes".into(), strs(&s.block_hashes));
      put(
        &mut m,
        "parent_block_hash",
        s.parent_block_hash.map(|p| p.to_string()),
      );
      m.insert("token_ids".into(), json!(s.token_ids));
      m.insert("block_size".into(), json!(s.block_size));
      put(&mut m, "lora_id", s.lora_id.map(|l| l.to_string()));
      put(&mut m, "medium", s.medium.clone());
      put(&mut m, "lora_name", s.lora_name.clone());
      put(&mut m, "cache_salt", s.cache_salt.clone());
      put(&mut m, "kv_cache_spec_kind", s.kv_cache_spec_kind.clone());
      put(&mut m, "locality", s.locality.clone());
      put(&mut m, "ownership", s.ownership.clone());
      put(&mut m, "session_id", s.session_id.clone());
      put(&mut m, "group_idx", s.group_idx);
      put(
        &mut m,
        "kv_cache_spec_sliding_window",
        s.kv_cache_spec_sliding_window.map(|w| w.to_string()),
      );
      put(&mut m, "extra_keys", s.extra_keys.as_ref().map(value_json));
      put(
        &mut m,
        "lookahead_token_ids",
        s.lookahead_token_ids.as_ref().map(value_json),
      );
      if let Some(hb) = &s.hash_bytes {
        let mut b = Map::new();
        if !hb.blocks.is_empty() {
          b.insert(
            "blocks".into(),
            J::Array(hb.blocks.iter().map(|x| json!(hex(x))).collect()),
          );
        }
        put(&mut b, "parent", hb.parent.as_ref().map(|p| hex(p)));
        m.insert("hash_bytes".into(), J::Object(b));
      }
    }
    KvEvent::Removed(r) => {
      m.insert("type".into(), json!("removed"));
      m.insert("block_hashes".into(), strs(&r.block_hashes));
      put(&mut m, "medium", r.medium.clone());
      put(&mut m, "group_idx", r.group_idx);
      put(&mut m, "locality", r.locality.clone());
      put(&mut m, "ownership", r.ownership.clone());
      put(
        &mut m,
        "hash_bytes",
        r.hash_bytes
          .as_ref()
          .map(|v| J::Array(v.iter().map(|x| json!(hex(x))).collect())),
      );
    }
    KvEvent::Cleared => {
      m.insert("type".into(), json!("cleared"));
    }
    KvEvent::Updated(u) => {
      m.insert("type".into(), json!("updated"));
      m.insert("block_hash".into(), json!(u.block_hash.to_string()));
      put(
        &mut m,
        "cache_level",
        u.cache_level.map(|d| json!({"old": d.old, "new": d.new})),
      );
      put(
        &mut m,
        "priority",
        u.priority.map(|d| json!({"old": d.old, "new": d.new})),
      );
    }
    KvEvent::Created(c) => {
      m.insert("type".into(), json!("created"));
      m.insert(
        "num_blocks_per_cache_level".into(),
        json!(c.num_blocks_per_cache_level),
      );
    }
  }
  J::Object(m)
}

fn batch_json(b: &Batch, with_seq: bool) -> J {
  let mut m = Map::new();
  if with_seq {
    m.insert("seq".into(), json!(b.seq.to_string()));
  }
  m.insert("ts".into(), json!(b.ts));
  m.insert("dp_rank".into(), json!(b.dp_rank));
  m.insert(
    "events".into(),
    J::Array(b.events.iter().map(event_json).collect()),
  );
  J::Object(m)
}

#[test]
fn every_fixture_decodes_as_the_reference_encoder_meant() {
  let f = fixtures();
  let cases = f["cases"].as_array().unwrap();
  assert!(cases.len() >= 90, "{} cases", cases.len());
  let (mut decoded, mut errors, mut reencoded) = (0, 0, 0);
  for c in cases {
    let name = c["name"].as_str().unwrap();
    let dialect = Dialect::parse(c["dialect"].as_str().unwrap()).unwrap();
    let payload = unhex(c["payload"].as_str().unwrap());
    let result = codec::decode(&payload, dialect).and_then(|d| {
      codec::check_layout(&d.batches)?;
      Ok(d)
    });
    if let Some(code) = c.get("error") {
      let err = result.expect_err(name);
      assert_eq!(err.code.as_str(), code.as_str().unwrap(), "{name}: {err}");
      errors += 1;
      continue;
    }
    let d = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    let want = &c["expect"];
    let with_seq = dialect == Dialect::SmgProto;
    let got = J::Array(d.batches.iter().map(|b| batch_json(b, with_seq)).collect());
    assert_eq!(&got, &want["batches"], "{name}");
    assert_eq!(
      d.unknown_events as u64,
      want["unknown_events"].as_u64().unwrap(),
      "{name}"
    );
    if let Some(ids) = want.get("event_ids") {
      let got: Vec<Vec<String>> = d
        .event_ids
        .iter()
        .map(|v| v.iter().map(u64::to_string).collect())
        .collect();
      assert_eq!(serde_json::to_value(got).unwrap(), *ids, "{name}");
    }
    decoded += 1;
    if let Some(fmt) = c.get("reencode").and_then(J::as_str) {
      let bytes = codec::encode(&d.batches[0], Format::parse(fmt).unwrap());
      assert_eq!(hex(&bytes), hex(&payload), "{name}: re-encoded as {fmt}");
      reencoded += 1;
    }
  }
  assert!(
    decoded >= 60 && errors >= 20 && reencoded >= 20,
    "{decoded} {errors} {reencoded}"
  );
}
