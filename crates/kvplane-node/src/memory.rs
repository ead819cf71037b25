//! The process allocator's free memory, handed back to the OS.

use crate::tasks::{Coded, CoreWork};
use kvplane_core::KvResult;
use napi::bindgen_prelude::AsyncTask;
use napi_derive::napi;

/// Returns the allocator's free memory to the OS (glibc's `malloc_trim`), on a worker thread:
/// after a burst of short-lived buffers (replays, recovery answers) glibc keeps freed memory in
/// its arenas, which shows as resident memory that never goes down. Resolves `true` once done;
/// `false` where the allocator has no such call (musl, other systems).
#[napi(ts_return_type = "Promise<boolean>")]
pub fn trim_allocator() -> AsyncTask<Coded<Trim>> {
  Coded::task(Trim)
}

pub struct Trim;

impl CoreWork for Trim {
  type Output = bool;
  type JsValue = bool;

  fn run(&mut self) -> KvResult<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
      // SAFETY: malloc_trim only releases memory the allocator holds free; it takes its own locks.
      unsafe { libc::malloc_trim(0) };
      Ok(true)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
      Ok(false)
    }
  }

  fn output(output: bool) -> bool {
    output
  }
}
