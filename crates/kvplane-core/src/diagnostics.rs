//! Diagnostics used to prove the binding's panic safety: a Rust panic must surface in Node as an
//! `ERR_INTERNAL` error, never abort the process.

/// Panics on purpose with the given message.
pub fn panic_probe(message: &str) -> ! {
  panic!("kvplane panic probe: {message}")
}
