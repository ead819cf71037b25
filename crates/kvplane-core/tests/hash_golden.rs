//! Every hash algorithm against the spec's vectors and the golden fixtures made by the reference
//! implementations (`scripts/gen_hash_fixtures.py`).

use kvplane_core::hash::{hash_blocks, Algo, ExtraKey, HashOptions, Parent};
use serde_json::Value;
use std::path::PathBuf;

fn repo_file(rel: &str) -> PathBuf {
  PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    .join("../..")
    .join(rel)
}

fn load(rel: &str) -> Value {
  let text = std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
  serde_json::from_str(&text).unwrap()
}

fn tokens(v: &Value) -> Vec<u32> {
  v.as_array()
    .unwrap()
    .iter()
    .map(|t| t.as_u64().unwrap() as u32)
    .collect()
}

fn u64s(v: &Value) -> Vec<u64> {
  v.as_array()
    .unwrap()
    .iter()
    .map(|h| h.as_str().unwrap().parse::<u64>().unwrap())
    .collect()
}

fn hex(bytes: &[u8]) -> String {
  bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
  (0..s.len())
    .step_by(2)
    .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
    .collect()
}

fn extra_key(v: &Value) -> ExtraKey {
  let (kind, val) = v.as_object().unwrap().iter().next().unwrap();
  match kind.as_str() {
    "str" => ExtraKey::Str(val.as_str().unwrap().to_string()),
    "int" => ExtraKey::Int(val.as_str().unwrap().parse().unwrap()),
    "bytes_hex" => ExtraKey::Bytes(unhex(val.as_str().unwrap())),
    "tuple" => ExtraKey::Tuple(val.as_array().unwrap().iter().map(extra_key).collect()),
    other => panic!("unknown extra key kind {other}"),
  }
}

fn options(algo: Algo, block_size: usize, o: Option<&Value>) -> HashOptions {
  let mut opts = HashOptions::new(algo, block_size);
  let Some(o) = o else { return opts };
  let s = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
  let n = |k: &str| s(k).map(|v| v.parse::<u64>().unwrap());
  if let Some(p) = s("parent_hex") {
    opts.parent = Some(Parent::Digest(unhex(&p)));
  }
  if let Some(p) = n("parent") {
    opts.parent = Some(Parent::U64(p));
  }
  opts.lora_name = s("lora_name");
  opts.lora_id = n("lora_id");
  opts.none_hash_seed = s("none_hash_seed");
  if algo.name().starts_with("trtllm") {
    // Both forms are recorded; the string form exercises kvplane's own BLAKE3 derivation.
    opts.cache_salt = s("cache_salt");
    if opts.cache_salt.is_none() {
      opts.cache_salt_id = n("cache_salt_id");
    }
  } else {
    opts.cache_salt = s("cache_salt");
  }
  if let Some(keys) = o.get("extra_keys") {
    opts.extra_keys = keys.as_array().unwrap().iter().map(extra_key).collect();
  }
  if let Some(keys) = o.get("first_block_extra_keys") {
    opts.first_block_extra_keys = keys.as_array().unwrap().iter().map(extra_key).collect();
  }
  opts
}

#[test]
fn spec_vectors_match_every_algorithm() {
  let doc = load("fixtures/spec-vectors.json");
  let mut checked = 0;
  for (name, case) in doc["cases"].as_object().unwrap() {
    let toks = tokens(&case["tokens"]);
    let bs = case["block_size"].as_u64().unwrap() as usize;
    for (key, want) in case.as_object().unwrap() {
      if key == "tokens" || key == "block_size" {
        continue;
      }
      if key == "xxh3_content" {
        let got = hash_blocks(&toks, &HashOptions::new(Algo::Xxh3Content, bs), false).unwrap();
        assert_eq!(
          got.hashes,
          vec![want.as_str().unwrap().parse::<u64>().unwrap()],
          "{name}"
        );
        checked += 1;
        continue;
      }
      let algo = Algo::parse(key).unwrap();
      let got = hash_blocks(
        &toks,
        &HashOptions::new(algo, bs),
        algo.digest_len().is_some(),
      )
      .unwrap();
      let want_u64: Vec<u64> = want
        .as_array()
        .unwrap()
        .iter()
        .map(|w| match w {
          Value::String(s) => s
            .parse::<i64>()
            .map(|v| v as u64)
            .or_else(|_| s.parse::<u64>())
            .unwrap(),
          Value::Object(o) => {
            assert_eq!(hex(&got.digests[..32]).len(), 64);
            o["u64"].as_str().unwrap().parse::<u64>().unwrap()
          }
          _ => panic!("bad vector"),
        })
        .collect();
      assert_eq!(got.hashes, want_u64, "{name} {key}");
      if algo == Algo::TrtllmV2Sha256 {
        let hexes: Vec<String> = got.digests.chunks(32).map(hex).collect();
        let want_hex: Vec<&str> = want
          .as_array()
          .unwrap()
          .iter()
          .map(|w| w["hex"].as_str().unwrap())
          .collect();
        assert_eq!(hexes, want_hex, "{name}");
      }
      checked += 1;
    }
  }
  assert!(checked >= 13, "only {checked} vectors checked");
}

#[test]
fn trtllm_salt_ids_match_sha256_and_the_older_blake3_form() {
  let doc = load("fixtures/hashes.json");
  let ids = doc["trtllm_salt_ids"].as_array().unwrap();
  assert!(ids.len() >= 3);
  for id in ids {
    let salt = id["salt"].as_str().unwrap();
    let want = |k: &str| id[k].as_str().unwrap().parse::<u64>().unwrap();
    assert_eq!(
      kvplane_core::hash::cache_salt_id(salt),
      want("sha256"),
      "{salt}"
    );
    assert_eq!(
      kvplane_core::hash::cache_salt_id_blake3(salt),
      want("blake3"),
      "{salt}"
    );
  }
}

#[test]
fn committed_spec_vectors_equal_the_shared_ones() {
  // The spec's vectors are copied into the repo so a clone stands alone; catch drift when the
  // shared folder sits beside it.
  let shared = repo_file("../shared/vectors/hashes.json");
  if let Ok(text) = std::fs::read_to_string(shared) {
    let shared: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(shared, load("fixtures/spec-vectors.json"));
  }
}

#[test]
fn golden_fixtures_match_the_reference_implementations() {
  let doc = load("fixtures/hashes.json");
  let cases = doc["cases"].as_array().unwrap();
  let mut per_algo = std::collections::BTreeMap::<String, usize>::new();
  for case in cases {
    let name = case["name"].as_str().unwrap();
    let algo_name = case["algo"].as_str().unwrap();
    let algo = Algo::parse(algo_name).unwrap();
    let bs = case["block_size"].as_u64().unwrap() as usize;
    let opts = options(algo, bs, case.get("options"));
    let want_digests = case.get("digests").is_some();
    let got = hash_blocks(&tokens(&case["tokens"]), &opts, want_digests)
      .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(got.hashes, u64s(&case["hashes"]), "{name}");
    if want_digests {
      let hexes: Vec<String> = got.digests.chunks(got.digest_len.max(1)).map(hex).collect();
      let want: Vec<&str> = case["digests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
      assert_eq!(hexes, want, "{name} digests");
    }
    if let Some(signed) = case.get("signed") {
      let want: Vec<i64> = signed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
      let got_signed: Vec<i64> = got
        .hashes
        .iter()
        .map(|&h| kvplane_core::int64::to_int64(h))
        .collect();
      assert_eq!(got_signed, want, "{name} signed");
    }
    // The `_64` name is the same chain.
    if algo == Algo::TrtllmV2Sha256 {
      let alias = hash_blocks(
        &tokens(&case["tokens"]),
        &HashOptions {
          algo: Algo::TrtllmV2Sha256_64,
          ..opts
        },
        false,
      )
      .unwrap();
      assert_eq!(alias.hashes, got.hashes, "{name} _64 alias");
    }
    *per_algo.entry(algo_name.to_string()).or_default() += 1;
  }
  for algo in Algo::ALL.iter().filter(|a| **a != Algo::TrtllmV2Sha256_64) {
    assert!(
      per_algo.get(algo.name()).copied().unwrap_or(0) >= 5,
      "too few fixtures for {}",
      algo.name()
    );
  }
}
