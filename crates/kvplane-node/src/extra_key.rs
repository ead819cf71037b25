//! vLLM extra keys from JS: strings, integers (number or bigint), bytes, and arrays of those,
//! nested to any depth. A hand-written conversion because N-API's derived types cannot recurse.

use crate::convert::napi_is;
use kvplane_core::hash::ExtraKey;
use kvplane_core::KvError;
use napi::bindgen_prelude::*;
use napi::sys;

/// One extra key converted from JS.
pub struct JsExtraKey(pub ExtraKey);

fn arg_error(e: KvError) -> napi::Error {
  napi::Error::new(Status::InvalidArg, e.message)
}

fn bigint_i128(v: &BigInt) -> Result<i128> {
  match v.words.as_slice() {
    [] => Ok(0),
    [w] => Ok(if v.sign_bit {
      -(*w as i128)
    } else {
      *w as i128
    }),
    _ => Err(napi::Error::new(
      Status::InvalidArg,
      "extra key bigints must lie in -(2^64-1)..=2^64-1",
    )),
  }
}

impl TypeName for JsExtraKey {
  fn type_name() -> &'static str {
    "ExtraKey"
  }

  fn value_type() -> ValueType {
    ValueType::Unknown
  }
}

impl ValidateNapiValue for JsExtraKey {}

impl FromNapiValue for JsExtraKey {
  unsafe fn from_napi_value(env: sys::napi_env, val: sys::napi_value) -> Result<Self> {
    let kind = Unknown::from_napi_value(env, val)?.get_type()?;
    let key = match kind {
      ValueType::String => ExtraKey::Str(String::from_napi_value(env, val)?),
      ValueType::Number => {
        ExtraKey::from_f64(f64::from_napi_value(env, val)?).map_err(arg_error)?
      }
      ValueType::BigInt => ExtraKey::Int(bigint_i128(&BigInt::from_napi_value(env, val)?)?),
      ValueType::Object if napi_is(env, val, sys::napi_is_typedarray) => {
        ExtraKey::Bytes(Uint8Array::from_napi_value(env, val)?.to_vec())
      }
      ValueType::Object if napi_is(env, val, sys::napi_is_array) => ExtraKey::Tuple(
        Vec::<JsExtraKey>::from_napi_value(env, val)?
          .into_iter()
          .map(|k| k.0)
          .collect(),
      ),
      _ => {
        return Err(napi::Error::new(
          Status::InvalidArg,
          "extra keys are strings, integers (number or bigint), Uint8Arrays or arrays of those",
        ))
      }
    };
    Ok(JsExtraKey(key))
  }
}
