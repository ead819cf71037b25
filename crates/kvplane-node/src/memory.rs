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

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in its `mimalloc.h`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the allocator before it goes back to the OS, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise. mimalloc's own default is 1 s: a relay's link thread
/// then handed memory back about once a second, in calls that unmapped megabytes and held the
/// thread for 4-11 ms (every batch arriving meanwhile waited; bench/README.md, engine relay).
/// Memory that a relay frees and allocates again within seconds now stays mapped. Bursts still
/// return theirs soon after they end: `trimAllocator` purges at once, whatever the delay, off the
/// JS thread and off the link thread.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
/// At load: the purge delay, and the ZMQ link thread's collection once its work pauses.
#[napi_derive::module_init]
fn tune_allocator() {
  if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
    // SAFETY: sets one of mimalloc's integer options, as its API allows at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
  }
  kvplane_zmq::set_on_pause(COLLECT_AFTER, collect_here);
}

/// How long the ZMQ link thread goes without work before it hands its free memory back: half the
/// purge delay. Bursts a few seconds apart (an engine under light load) keep theirs mapped; an
/// ingest that stopped returns it well before the purge delay would, if ever (mimalloc purges on
/// the thread's next allocation).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const COLLECT_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Hands the calling thread's free memory back to the OS at once, whatever the purge delay: the
/// ZMQ link thread runs it when its work pauses (`kvplane_zmq::set_on_pause`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn collect_here() {
  // SAFETY: releases only memory the allocator holds free, under its own locks.
  unsafe { libmimalloc_sys::mi_collect(true) };
}

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

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
  use super::{MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS};

  fn purge_delay() -> std::ffi::c_long {
    // SAFETY: reads one of mimalloc's integer options.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
  }

  #[test]
  fn freed_memory_stays_with_the_allocator_for_ten_seconds() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
      return; // set by whoever runs the tests: theirs is kept (the next test)
    }
    assert_eq!(purge_delay(), PURGE_DELAY_MS);
  }

  /// The option set is mimalloc's `purge_delay` (it reads `MIMALLOC_PURGE_DELAY` into it), and a
  /// delay given in the environment is kept: this test binary run again with one.
  #[test]
  fn a_purge_delay_from_the_environment_is_kept() {
    const NAME: &str = "memory::tests::a_purge_delay_from_the_environment_is_kept";
    if std::env::var_os("KVPLANE_PURGE_DELAY_CHILD").is_some() {
      println!("purge_delay={}", purge_delay());
      return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
      .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
      .env("KVPLANE_PURGE_DELAY_CHILD", "1")
      .env("MIMALLOC_PURGE_DELAY", "1234")
      .output()
      .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("purge_delay=1234"), "{stdout}");
  }
}
