//! Conversions shared by the exports: bigints to u64, and u64 results into V8-owned arrays.

use crate::error::{invalid_arg, Code};
use kvplane_core::{KvError, KvResult};
use napi::bindgen_prelude::*;

/// A JS bigint that must fit a u64.
pub(crate) fn bigint_u64(name: &str, v: &BigInt) -> KvResult<u64> {
  let (negative, value, lossless) = v.get_u64();
  if negative || !lossless {
    return Err(KvError::invalid_arg(format!(
      "{name} must be a bigint in 0..=2^64-1"
    )));
  }
  Ok(value)
}

/// A JS bigint that must fit an i64.
pub(crate) fn bigint_i64(name: &str, v: &BigInt) -> KvResult<i64> {
  let (value, lossless) = v.get_i64();
  if !lossless {
    return Err(KvError::invalid_arg(format!(
      "{name} must be a bigint in -2^63..=2^63-1"
    )));
  }
  Ok(value)
}

/// Copies u64s into a new `BigUint64Array` whose memory V8 allocates and frees with the array.
/// (napi-rs's typed arrays wrap Rust memory as external buffers, which Node frees only when the
/// event loop turns: a synchronous burst of calls would hold every result until then.)
pub(crate) fn v8_u64s(env: &Env, data: Vec<u64>) -> Result<Unknown<'_>, Code> {
  let fail = |what: &str| invalid_arg(format!("cannot allocate the result: {what} failed"));
  let bytes = std::mem::size_of_val(data.as_slice());
  let mut ptr = std::ptr::null_mut();
  let mut buffer = std::ptr::null_mut();
  let mut array = std::ptr::null_mut();
  // SAFETY: plain N-API calls on the current env; `ptr` points at `bytes` fresh bytes owned by
  // the new ArrayBuffer, which `data` (exactly `bytes` long) is copied into.
  unsafe {
    if napi::sys::napi_create_arraybuffer(env.raw(), bytes, &mut ptr, &mut buffer)
      != napi::sys::Status::napi_ok
    {
      return Err(fail("napi_create_arraybuffer"));
    }
    if bytes > 0 {
      std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), ptr.cast::<u8>(), bytes);
    }
    let kind = napi::sys::TypedarrayType::biguint64_array;
    if napi::sys::napi_create_typedarray(env.raw(), kind, data.len(), buffer, 0, &mut array)
      != napi::sys::Status::napi_ok
    {
      return Err(fail("napi_create_typedarray"));
    }
    Ok(Unknown::from_raw_unchecked(env.raw(), array))
  }
}

/// Whether an N-API type check (`napi_is_array`, `napi_is_typedarray`, ...) holds for `val`.
///
/// # Safety
/// `env` and `val` must be live handles of the current call.
pub(crate) unsafe fn napi_is(
  env: napi::sys::napi_env,
  val: napi::sys::napi_value,
  f: unsafe extern "C" fn(
    napi::sys::napi_env,
    napi::sys::napi_value,
    *mut bool,
  ) -> napi::sys::napi_status,
) -> bool {
  let mut out = false;
  f(env, val, &mut out) == napi::sys::Status::napi_ok && out
}
