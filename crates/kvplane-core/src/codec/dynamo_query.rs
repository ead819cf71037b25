//! The bodies of Dynamo's indexer queries (docs/protocol.md#router-side-kvplane-indexer):
//! `POST /query` `{"token_ids": [u32], "model_name", "routing_group"?, "lora_name"?, "cache_salt"?}`
//! and `POST /query_by_hash` `{"block_hashes": [i64], "model_name", "routing_group"?, "cache_salt"?}`.
//! Read here rather than in JS: a long prompt's body holds hundreds of thousands of numbers, which
//! JS parses into one object each (and 64-bit integers not at all exactly).

use crate::error::{ErrorCode, KvError, KvResult};
use serde_json::{Map, Value};

/// A `/query` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenQuery {
  pub token_ids: Vec<u32>,
  pub model_name: String,
  /// `None` when absent or null (as every optional field).
  pub routing_group: Option<String>,
  pub lora_name: Option<String>,
  pub cache_salt: Option<String>,
}

/// A `/query_by_hash` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashQuery {
  /// Each block's unchained content hash as its u64 bit pattern (sent as i64).
  pub block_hashes: Vec<u64>,
  pub model_name: String,
  pub routing_group: Option<String>,
  /// A `cache_salt` was given (not null): the caller refuses it.
  pub cache_salt: bool,
}

/// Malformed JSON is `ERR_DECODE` (answered 400); a missing or mistyped field `ERR_INVALID_ARG`
/// (422), with the messages the other request fields get.
pub fn parse_token_query(body: &[u8]) -> KvResult<TokenQuery> {
  let mut o = object(body)?;
  let token_ids = numbers(&mut o, "token_ids", "u32", |v| {
    v.as_u64().and_then(|t| u32::try_from(t).ok())
  })?;
  Ok(TokenQuery {
    token_ids,
    model_name: string(&mut o, "model_name")?.ok_or_else(|| missing("model_name"))?,
    routing_group: string(&mut o, "routing_group")?,
    lora_name: string(&mut o, "lora_name")?,
    cache_salt: string(&mut o, "cache_salt")?,
  })
}

/// As `parse_token_query`.
pub fn parse_hash_query(body: &[u8]) -> KvResult<HashQuery> {
  let mut o = object(body)?;
  let block_hashes = numbers(&mut o, "block_hashes", "i64", |v| {
    v.as_i64().map(|h| h as u64)
  })?;
  Ok(HashQuery {
    block_hashes,
    model_name: string(&mut o, "model_name")?.ok_or_else(|| missing("model_name"))?,
    routing_group: string(&mut o, "routing_group")?,
    cache_salt: !matches!(o.remove("cache_salt"), None | Some(Value::Null)),
  })
}

fn object(body: &[u8]) -> KvResult<Map<String, Value>> {
  let v: Value = serde_json::from_slice(body).map_err(|e| {
    KvError::new(
      ErrorCode::Decode,
      format!("Failed to parse the request body as JSON: {e}"),
    )
  })?;
  match v {
    Value::Object(o) => Ok(o),
    _ => Err(KvError::invalid_arg(
      "the request body must be a JSON object",
    )),
  }
}

/// Required field `name`: an array of integers each read by `read` (a `want`).
fn numbers<T>(
  o: &mut Map<String, Value>,
  name: &str,
  want: &str,
  read: impl Fn(&Value) -> Option<T>,
) -> KvResult<Vec<T>> {
  match o.remove(name) {
    Some(Value::Array(items)) => items
      .iter()
      .enumerate()
      .map(|(i, v)| {
        read(v).ok_or_else(|| {
          KvError::invalid_arg(format!("{name}[{i}]: invalid value, expected {want}"))
        })
      })
      .collect(),
    None | Some(Value::Null) => Err(missing(name)),
    _ => Err(KvError::invalid_arg(format!(
      "{name}: invalid value, expected a sequence of {want}"
    ))),
  }
}

/// Optional string field `name`.
fn string(o: &mut Map<String, Value>, name: &str) -> KvResult<Option<String>> {
  match o.remove(name) {
    Some(Value::String(s)) => Ok(Some(s)),
    None | Some(Value::Null) => Ok(None),
    _ => Err(KvError::invalid_arg(format!(
      "{name}: invalid value, expected a string"
    ))),
  }
}

fn missing(name: &str) -> KvError {
  KvError::invalid_arg(format!("missing field `{name}`"))
}

#[cfg(test)]
mod tests {
  use super::*;

  fn code<T: std::fmt::Debug>(r: KvResult<T>) -> &'static str {
    r.unwrap_err().code.as_str()
  }

  #[test]
  fn reads_numbers_exactly_and_the_names() {
    let q = parse_hash_query(
      br#"{"block_hashes":[1,-1,9223372036854775807,-9223372036854775808],"model_name":"m","routing_group":null,"other":[1.5]}"#,
    )
    .unwrap();
    assert_eq!(
      q.block_hashes,
      vec![1, u64::MAX, i64::MAX as u64, i64::MIN as u64]
    );
    assert_eq!(
      (q.model_name.as_str(), q.routing_group, q.cache_salt),
      ("m", None, false)
    );
    let q = parse_hash_query(
      br#"{"block_hashes":[],"model_name":"m","routing_group":"g","cache_salt":"s"}"#,
    )
    .unwrap();
    assert_eq!(
      (q.routing_group.as_deref(), q.cache_salt),
      (Some("g"), true)
    );
    let q = parse_token_query(
      br#"{"token_ids":[0,4294967295],"model_name":"m","lora_name":"a","cache_salt":null}"#,
    )
    .unwrap();
    assert_eq!(q.token_ids, vec![0, u32::MAX]);
    assert_eq!((q.lora_name.as_deref(), q.cache_salt), (Some("a"), None));
  }

  #[test]
  fn malformed_text_and_bad_fields_have_their_codes() {
    for body in [
      "",
      "{",
      "[1] x",
      r#"{"block_hashes":[01],"model_name":"m"}"#,
      "{\"model_name\":\"\u{0}\"}",
      r#"{"model_name":"\ud800"}"#,
    ] {
      assert_eq!(
        code(parse_hash_query(body.as_bytes())),
        "ERR_DECODE",
        "{body:?}"
      );
      assert_eq!(
        code(parse_token_query(body.as_bytes())),
        "ERR_DECODE",
        "{body:?}"
      );
    }
    assert_eq!(
      code(parse_hash_query(b"{\"model_name\":\"\xff\"}")),
      "ERR_DECODE"
    );
    for body in [
      "[]",
      r#"{"model_name":"m"}"#,
      r#"{"block_hashes":null,"model_name":"m"}"#,
      r#"{"block_hashes":"1","model_name":"m"}"#,
      r#"{"block_hashes":[9223372036854775808],"model_name":"m"}"#,
      r#"{"block_hashes":[-9223372036854775809],"model_name":"m"}"#,
      r#"{"block_hashes":[1.0],"model_name":"m"}"#,
      r#"{"block_hashes":["1"],"model_name":"m"}"#,
      r#"{"block_hashes":[1]}"#,
      r#"{"block_hashes":[1],"model_name":5}"#,
      r#"{"block_hashes":[1],"model_name":"m","routing_group":5}"#,
    ] {
      assert_eq!(
        code(parse_hash_query(body.as_bytes())),
        "ERR_INVALID_ARG",
        "{body}"
      );
    }
    for body in [
      r#"{"token_ids":[-1],"model_name":"m"}"#,
      r#"{"token_ids":[4294967296],"model_name":"m"}"#,
      r#"{"token_ids":[1.5],"model_name":"m"}"#,
      r#"{"token_ids":[null],"model_name":"m"}"#,
      r#"{"token_ids":[[1]],"model_name":"m"}"#,
      r#"{"token_ids":"abc","model_name":"m"}"#,
      r#"{"token_ids":[1],"model_name":"m","lora_name":7}"#,
    ] {
      assert_eq!(
        code(parse_token_query(body.as_bytes())),
        "ERR_INVALID_ARG",
        "{body}"
      );
    }
    let e = parse_hash_query(br#"{"block_hashes":[1,true],"model_name":"m"}"#).unwrap_err();
    assert_eq!(e.message, "block_hashes[1]: invalid value, expected i64");
    let e = parse_token_query(br#"{"model_name":"m"}"#).unwrap_err();
    assert_eq!(e.message, "missing field `token_ids`");
  }
}
