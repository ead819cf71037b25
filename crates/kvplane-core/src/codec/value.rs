//! Opaque values the engines attach to events (`extra_keys`, `lookahead_token_ids`, ...): kept as
//! decoded so they re-encode to the same msgpack and can be shown as JSON.

use super::msgpack::{decode_error, Int, Kind, Reader, Writer, MAX_DEPTH};
use crate::error::KvResult;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
  Nil,
  Bool(bool),
  /// A non-negative integer.
  Uint(u64),
  /// A negative integer.
  Int(i64),
  Float(f64),
  Str(String),
  Bin(Vec<u8>),
  Array(Vec<Value>),
  Map(Vec<(Value, Value)>),
}

impl Value {
  pub fn read(r: &mut Reader<'_>) -> KvResult<Value> {
    Self::read_at(r, 0)
  }

  fn read_at(r: &mut Reader<'_>, depth: usize) -> KvResult<Value> {
    if depth > MAX_DEPTH {
      return Err(decode_error(format!(
        "msgpack: a value nested deeper than {MAX_DEPTH} levels at byte {}",
        r.pos()
      )));
    }
    Ok(match r.peek_kind()? {
      Kind::Nil => {
        r.try_nil();
        Value::Nil
      }
      Kind::Bool => Value::Bool(r.read_bool()?),
      Kind::Int => match r.read_int()? {
        Int::U(v) => Value::Uint(v),
        Int::I(v) => Value::Int(v),
      },
      Kind::Float => Value::Float(r.read_f64()?),
      Kind::Str => Value::Str(r.read_str()?.to_owned()),
      Kind::Bin => Value::Bin(r.read_bin()?.to_vec()),
      Kind::Array => {
        let n = r.read_array_len()?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
          items.push(Self::read_at(r, depth + 1)?);
        }
        Value::Array(items)
      }
      Kind::Map => {
        let n = r.read_map_len()?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
          let k = Self::read_at(r, depth + 1)?;
          let v = Self::read_at(r, depth + 1)?;
          items.push((k, v));
        }
        Value::Map(items)
      }
      Kind::Ext | Kind::Reserved => {
        return Err(decode_error(format!(
          "msgpack: an extension type where a plain value was expected at byte {}",
          r.pos()
        )))
      }
    })
  }

  pub fn write(&self, w: &mut Writer) {
    match self {
      Value::Nil => w.nil(),
      Value::Bool(b) => w.bool(*b),
      Value::Uint(v) => w.uint(*v),
      Value::Int(v) => w.int(*v),
      Value::Float(v) => w.f64(*v),
      Value::Str(s) => w.str(s),
      Value::Bin(b) => w.bin(b),
      Value::Array(items) => {
        w.array_len(items.len());
        for v in items {
          v.write(w);
        }
      }
      Value::Map(items) => {
        w.map_len(items.len());
        for (k, v) in items {
          k.write(w);
          v.write(w);
        }
      }
    }
  }

  /// JSON text: integers exact, bytes as arrays of numbers, map keys stringified.
  pub fn write_json(&self, out: &mut String) {
    use std::fmt::Write;
    match self {
      Value::Nil => out.push_str("null"),
      Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
      Value::Uint(v) => {
        let _ = write!(out, "{v}");
      }
      Value::Int(v) => {
        let _ = write!(out, "{v}");
      }
      Value::Float(v) => super::json::write_f64(out, *v),
      Value::Str(s) => super::json::write_str(out, s),
      Value::Bin(b) => {
        out.push('[');
        for (i, x) in b.iter().enumerate() {
          if i > 0 {
            out.push(',');
          }
          let _ = write!(out, "{x}");
        }
        out.push(']');
      }
      Value::Array(items) => {
        out.push('[');
        for (i, v) in items.iter().enumerate() {
          if i > 0 {
            out.push(',');
          }
          v.write_json(out);
        }
        out.push(']');
      }
      Value::Map(items) => {
        out.push('{');
        for (i, (k, v)) in items.iter().enumerate() {
          if i > 0 {
            out.push(',');
          }
          match k {
            Value::Str(s) => super::json::write_str(out, s),
            other => {
              let mut key = String::new();
              other.write_json(&mut key);
              super::json::write_str(out, &key);
            }
          }
          out.push(':');
          v.write_json(out);
        }
        out.push('}');
      }
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn refuses_pathological_nesting() {
    let bytes = vec![0x91u8; 10_000];
    let err = Value::read(&mut Reader::new(&bytes)).unwrap_err();
    assert!(err.message.contains("nested deeper"));
  }

  #[test]
  fn round_trips_through_msgpack() {
    let v = Value::Array(vec![
      Value::Str("lora".into()),
      Value::Map(vec![(Value::Str("k".into()), Value::Int(-5))]),
      Value::Bin(vec![1, 2]),
      Value::Float(0.25),
      Value::Uint(u64::MAX),
      Value::Nil,
      Value::Bool(true),
    ]);
    let mut w = Writer::new();
    v.write(&mut w);
    assert_eq!(Value::read(&mut Reader::new(&w.buf)).unwrap(), v);
    let mut json = String::new();
    v.write_json(&mut json);
    assert_eq!(
      json,
      r#"["lora",{"k":-5},[1,2],0.25,18446744073709551615,null,true]"#
    );
  }
}
