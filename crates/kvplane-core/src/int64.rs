//! Two's-complement views of engine block hashes. SGLang and the SMG proto carry hashes as
//! `int64`, vLLM as `uint64`: they are the same 64 bits.

/// The signed view of a u64 hash.
#[inline]
pub const fn to_int64(v: u64) -> i64 {
  v as i64
}

/// The unsigned view of an i64 hash.
#[inline]
pub const fn to_uint64(v: i64) -> u64 {
  v as u64
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn signed_and_unsigned_views_round_trip_at_the_edges() {
    assert_eq!(to_int64(0), 0);
    assert_eq!(to_int64((1u64 << 63) - 1), i64::MAX);
    assert_eq!(to_int64(1u64 << 63), i64::MIN);
    assert_eq!(to_int64(u64::MAX), -1);
    assert_eq!(to_uint64(-1), u64::MAX);
    assert_eq!(to_uint64(-6157722022507328103), 12289022051202223513);
    for v in [0u64, 1, 1 << 62, 1 << 63, u64::MAX - 7] {
      assert_eq!(to_uint64(to_int64(v)), v);
    }
  }
}
