//! The process allocator's free memory, handed back to the OS.

use napi_derive::napi;

/// Returns the allocator's free memory to the OS (glibc's `malloc_trim`): after a burst of
/// short-lived buffers (replays, recovery answers) glibc keeps freed memory in its arenas, which
/// shows as resident memory that never goes down. `true` once done; `false` where the allocator
/// has no such call (musl, other systems).
#[napi]
pub fn trim_allocator() -> bool {
  #[cfg(all(target_os = "linux", target_env = "gnu"))]
  {
    // SAFETY: malloc_trim only releases memory the allocator holds free; it takes its own locks.
    unsafe { libc::malloc_trim(0) };
    true
  }
  #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
  {
    false
  }
}
