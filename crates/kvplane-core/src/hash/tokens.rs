//! Token ids arrive from JS either as a `Uint32Array` (used as is) or as plain numbers, which must
//! be checked: an engine token id is an integer in `0..=u32::MAX`.

use crate::error::{KvError, KvResult};

/// Converts JS numbers to token ids, rejecting non-integers and values outside `0..=u32::MAX`.
pub fn tokens_from_f64(values: &[f64]) -> KvResult<Vec<u32>> {
  values
    .iter()
    .enumerate()
    .map(|(i, &v)| {
      if v.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&v) {
        Ok(v as u32)
      } else {
        Err(KvError::invalid_arg(format!(
          "token at index {i} is {v}: token ids are integers in 0..=4294967295"
        )))
      }
    })
    .collect()
}

/// A block of token ids as the little-endian bytes every engine hashes.
#[inline]
pub(crate) fn le_bytes(block: &[u32]) -> std::borrow::Cow<'_, [u8]> {
  #[cfg(target_endian = "little")]
  {
    // SAFETY: u32 has no padding and any byte pattern is a valid u8; the slice is borrowed for
    // the same lifetime and covers exactly the same memory.
    std::borrow::Cow::Borrowed(unsafe {
      std::slice::from_raw_parts(block.as_ptr().cast::<u8>(), std::mem::size_of_val(block))
    })
  }
  #[cfg(not(target_endian = "little"))]
  {
    std::borrow::Cow::Owned(block.iter().flat_map(|t| t.to_le_bytes()).collect())
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn accepts_integers_across_the_u32_range() {
    assert_eq!(
      tokens_from_f64(&[0.0, 1.0, 4294967295.0]).unwrap(),
      vec![0, 1, u32::MAX]
    );
  }

  #[test]
  fn rejects_fractions_negatives_overflow_and_nan() {
    for bad in [1.5, -1.0, 4294967296.0, f64::NAN, f64::INFINITY] {
      let err = tokens_from_f64(&[3.0, bad]).unwrap_err();
      assert_eq!(err.code, crate::ErrorCode::InvalidArg, "{bad}");
      assert!(err.message.contains("index 1"), "{}", err.message);
    }
  }
}
