//! Typed errors with stable codes. The binding maps `ErrorCode::as_str()` to the JS error's
//! `code`; the TypeScript layer re-throws it as `KvPlaneError`.

use std::fmt;

/// Stable error codes shared by every layer. Never rename a variant's string: consumers match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
  /// An argument has the wrong type, range or combination.
  InvalidArg,
  /// Bytes could not be decoded.
  Decode,
  /// A stored event whose tokens do not split into `block_size` x hashes.
  UnsupportedLayout,
  /// The object was closed.
  Closed,
  /// A bug inside kvplane (a caught panic).
  Internal,
}

impl ErrorCode {
  pub const fn as_str(self) -> &'static str {
    match self {
      ErrorCode::InvalidArg => "ERR_INVALID_ARG",
      ErrorCode::Decode => "ERR_DECODE",
      ErrorCode::UnsupportedLayout => "ERR_UNSUPPORTED_LAYOUT",
      ErrorCode::Closed => "ERR_CLOSED",
      ErrorCode::Internal => "ERR_INTERNAL",
    }
  }
}

impl fmt::Display for ErrorCode {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str(self.as_str())
  }
}

/// An error from the core: a stable code and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvError {
  pub code: ErrorCode,
  pub message: String,
}

impl KvError {
  pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
    KvError {
      code,
      message: message.into(),
    }
  }

  pub fn invalid_arg(message: impl Into<String>) -> Self {
    KvError::new(ErrorCode::InvalidArg, message)
  }
}

impl fmt::Display for KvError {
  fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{}: {}", self.code, self.message)
  }
}

impl std::error::Error for KvError {}

pub type KvResult<T> = Result<T, KvError>;

/// Checks a JS number is a count in `1..=max` (an option named `name`).
pub fn count_from_f64(name: &str, v: f64, max: usize) -> KvResult<usize> {
  if v.fract() == 0.0 && (1.0..=max as f64).contains(&v) {
    Ok(v as usize)
  } else {
    Err(KvError::invalid_arg(format!(
      "{name} is {v}: an integer in 1..={max}"
    )))
  }
}
