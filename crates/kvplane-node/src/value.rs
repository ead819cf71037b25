//! Opaque event values (`extraKeys`, `lookaheadTokenIds`) between JS and the core's `Value`:
//! null, booleans, numbers (integers beyond 2^53 as bigint), strings, bytes (`Uint8Array` in,
//! `Buffer` out), arrays, and plain objects (maps with string keys).

use crate::convert::napi_is;
use kvplane_core::codec::value::Value;
use napi::bindgen_prelude::*;
use napi::sys;

pub struct JsOpaque(pub Value);

const MAX_SAFE: u64 = (1 << 53) - 1;

impl TypeName for JsOpaque {
  fn type_name() -> &'static str {
    "Opaque"
  }

  fn value_type() -> ValueType {
    ValueType::Unknown
  }
}

impl ValidateNapiValue for JsOpaque {}

fn bad(what: &str) -> napi::Error {
  napi::Error::new(Status::InvalidArg, format!("opaque event values {what}"))
}

impl FromNapiValue for JsOpaque {
  unsafe fn from_napi_value(env: sys::napi_env, val: sys::napi_value) -> Result<Self> {
    let kind = Unknown::from_napi_value(env, val)?.get_type()?;
    Ok(JsOpaque(match kind {
      ValueType::Null | ValueType::Undefined => Value::Nil,
      ValueType::Boolean => Value::Bool(bool::from_napi_value(env, val)?),
      ValueType::Number => {
        let f = f64::from_napi_value(env, val)?;
        if f.fract() == 0.0 && f.abs() <= MAX_SAFE as f64 {
          if f < 0.0 {
            Value::Int(f as i64)
          } else {
            Value::Uint(f as u64)
          }
        } else {
          Value::Float(f)
        }
      }
      ValueType::BigInt => {
        let b = BigInt::from_napi_value(env, val)?;
        let (v, lossless) = b.get_i64();
        match (b.sign_bit, b.words.as_slice()) {
          (false, [w]) => Value::Uint(*w),
          (false, []) => Value::Uint(0),
          (true, _) if lossless => Value::Int(v),
          _ => return Err(bad("hold bigints in -(2^63)..2^64")),
        }
      }
      ValueType::String => Value::Str(String::from_napi_value(env, val)?),
      ValueType::Object if napi_is(env, val, sys::napi_is_typedarray) => {
        Value::Bin(Uint8Array::from_napi_value(env, val)?.to_vec())
      }
      ValueType::Object if napi_is(env, val, sys::napi_is_array) => Value::Array(
        Vec::<JsOpaque>::from_napi_value(env, val)?
          .into_iter()
          .map(|v| v.0)
          .collect(),
      ),
      ValueType::Object => {
        let obj = Object::from_napi_value(env, val)?;
        let mut items = Vec::new();
        for key in Object::keys(&obj)? {
          let v: JsOpaque = obj.get_named_property(&key)?;
          items.push((Value::Str(key), v.0));
        }
        Value::Map(items)
      }
      _ => {
        return Err(bad(
          "are null, booleans, numbers, bigints, strings, bytes, arrays or objects",
        ))
      }
    }))
  }
}

impl ToNapiValue for JsOpaque {
  unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
    to_js(env, &val.0)
  }
}

unsafe fn to_js(env: sys::napi_env, v: &Value) -> Result<sys::napi_value> {
  match v {
    Value::Nil => Null::to_napi_value(env, Null),
    Value::Bool(b) => bool::to_napi_value(env, *b),
    Value::Uint(u) if *u <= MAX_SAFE => f64::to_napi_value(env, *u as f64),
    Value::Uint(u) => BigInt::to_napi_value(env, BigInt::from(*u)),
    Value::Int(i) if i.unsigned_abs() <= MAX_SAFE => f64::to_napi_value(env, *i as f64),
    Value::Int(i) => BigInt::to_napi_value(env, BigInt::from(*i)),
    Value::Float(f) => f64::to_napi_value(env, *f),
    Value::Str(s) => String::to_napi_value(env, s.clone()),
    Value::Bin(b) => Buffer::to_napi_value(env, Buffer::from(b.clone())),
    Value::Array(items) => {
      let mut arr = std::ptr::null_mut();
      check_status!(sys::napi_create_array_with_length(
        env,
        items.len(),
        &mut arr
      ))?;
      for (i, item) in items.iter().enumerate() {
        let js = to_js(env, item)?;
        check_status!(sys::napi_set_element(env, arr, i as u32, js))?;
      }
      Ok(arr)
    }
    Value::Map(items) => {
      let mut obj = std::ptr::null_mut();
      check_status!(sys::napi_create_object(env, &mut obj))?;
      for (k, item) in items {
        let key = match k {
          Value::Str(s) => s.clone(),
          other => format!("{other:?}"),
        };
        let js_key = String::to_napi_value(env, key)?;
        let js = to_js(env, item)?;
        check_status!(sys::napi_set_property(env, obj, js_key, js))?;
      }
      Ok(obj)
    }
  }
}
