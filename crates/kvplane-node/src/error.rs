//! Core errors become JS errors whose `code` is the core's stable code; panics become
//! `ERR_INTERNAL` errors instead of aborting Node.

use kvplane_core::{ErrorCode, KvError};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The status carried by errors thrown to JS: the stable code string.
pub struct Code(pub &'static str);

impl AsRef<str> for Code {
  fn as_ref(&self) -> &str {
    self.0
  }
}

pub type JsResult<T> = napi::Result<T, Code>;

pub fn to_js(e: KvError) -> napi::Error<Code> {
  napi::Error::new(Code(e.code.as_str()), e.message)
}

pub fn invalid_arg(message: impl Into<String>) -> napi::Error<Code> {
  to_js(KvError::invalid_arg(message))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
  payload
    .downcast_ref::<&str>()
    .map(|s| s.to_string())
    .or_else(|| payload.downcast_ref::<String>().cloned())
    .unwrap_or_else(|| "unknown panic payload".to_string())
}

/// Runs `f`, turning a panic into an `ERR_INTERNAL` core error.
pub fn guard<T>(f: impl FnOnce() -> Result<T, KvError>) -> Result<T, KvError> {
  catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
    Err(KvError::new(
      ErrorCode::Internal,
      format!("panic in kvplane core: {}", panic_message(&*p)),
    ))
  })
}

/// [`guard`] for synchronous exports: the error is thrown with its code.
pub fn guard_js<T>(f: impl FnOnce() -> Result<T, KvError>) -> JsResult<T> {
  guard(f).map_err(to_js)
}

/// The variable that attaches the test hooks to the binary's exports when it loads. Without it
/// the hooks do not exist: neither the loader nor the typings know them.
const TEST_HOOKS_ENV: &str = "KVPLANE_TEST_HOOKS";

/// A test hook: panics on purpose, proving a panic surfaces as an `ERR_INTERNAL` error instead of
/// aborting the process.
#[napi_derive::napi(no_export)]
pub fn panic_probe(message: String) -> napi::Result<(), Code> {
  guard_js(|| kvplane_core::diagnostics::panic_probe(&message))
}

/// Attaches `panicProbe` when the process runs with `KVPLANE_TEST_HOOKS=1`.
#[napi_derive::napi(module_exports)]
pub fn attach_test_hooks(
  mut exports: napi::bindgen_prelude::Object,
  env: napi::Env,
) -> napi::Result<()> {
  if std::env::var(TEST_HOOKS_ENV).as_deref() == Ok("1") {
    let probe = env.create_function::<String, ()>("panicProbe", panic_probe_c_callback)?;
    exports.set("panicProbe", probe)?;
  }
  Ok(())
}
