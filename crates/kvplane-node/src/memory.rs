//! The allocator: mimalloc for this library's own memory on Linux glibc, and the free memory of
//! both allocators (ours, and glibc's for the rest of the process) handed back to the OS.

use crate::tasks::{Coded, CoreWork};
use kvplane_core::KvResult;
use napi::bindgen_prelude::AsyncTask;
use napi_derive::napi;

/// The library's allocations (decoded events, encodings, the index, the replay log) come from
/// mimalloc rather than glibc's malloc: a relay allocates and frees several small vectors per
/// event on its link thread, where glibc's malloc and free took about a third of the thread
/// (bench/README.md, engine relay). Its arenas are never marked for transparent huge pages
/// (`no_thp`): faulting in and zeroing a fresh 2 MiB page stalled the link thread for
/// milliseconds at a time. Other targets keep the system allocator (measured on glibc only).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns the allocators' free memory to the OS (mimalloc's collection of this library's memory,
/// then glibc's `malloc_trim` for the rest of the process), on a worker thread: after a burst of
/// short-lived buffers (replays, recovery answers) freed memory stays in the arenas, which shows
/// as resident memory that never goes down. Resolves `true` once done; `false` where the
/// allocator has no such call (musl, other systems).
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
      // SAFETY: both only release memory their allocator holds free, under their own locks.
      unsafe {
        libmimalloc_sys::mi_collect(true);
        libc::malloc_trim(0)
      };
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
