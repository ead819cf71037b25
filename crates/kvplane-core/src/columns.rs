//! Events in columns: the bulk publish path. A host hands over many events as a few typed arrays
//! (one N-API call, no object per event); this checks them (`chunk` keeps them as columns).

use crate::error::{KvError, KvResult};

pub const KIND_STORED: u8 = 0;
pub const KIND_REMOVED: u8 = 1;
pub const KIND_CLEARED: u8 = 2;

/// `n = kinds.len()` events. Hashes and tokens are concatenated in event order.
#[derive(Debug, Clone, Copy)]
pub struct Columns<'a> {
  /// Per event: 0 stored, 1 removed, 2 cleared.
  pub kinds: &'a [u8],
  /// Per event: its number of block hashes (0 for cleared).
  pub hash_counts: &'a [u32],
  /// All events' block hashes.
  pub hashes: &'a [u64],
  /// Per event: the parent block hash of a stored event (read only where `has_parent` is 1).
  pub parents: &'a [u64],
  /// Per event: 1 if the stored event has a parent.
  pub has_parent: &'a [u8],
  /// All stored events' tokens, `hash_count * block_size` per stored event.
  pub tokens: &'a [u32],
  pub block_size: u32,
  /// Medium of every event (`None`: unset).
  pub medium: Option<&'a str>,
  pub lora_id: Option<i64>,
  pub lora_name: Option<&'a str>,
}

fn bad(msg: String) -> KvError {
  KvError::invalid_arg(format!("event columns: {msg}"))
}

/// `Ok` if the columns describe `kinds.len()` events exactly, else `ERR_INVALID_ARG` naming the
/// first inconsistency.
pub fn check_columns(c: &Columns<'_>) -> KvResult<()> {
  let n = c.kinds.len();
  for (name, len) in [
    ("hashCounts", c.hash_counts.len()),
    ("parents", c.parents.len()),
    ("hasParent", c.has_parent.len()),
  ] {
    if len != n {
      return Err(bad(format!("{name} has {len} entries for {n} events")));
    }
  }
  if c.block_size == 0 {
    return Err(bad("blockSize must be positive".into()));
  }
  let (mut hashes_needed, mut tokens_needed) = (0usize, 0usize);
  for (i, (&k, &count)) in c.kinds.iter().zip(c.hash_counts).enumerate() {
    match k {
      KIND_STORED => tokens_needed += count as usize * c.block_size as usize,
      KIND_REMOVED => {}
      KIND_CLEARED if count == 0 => {}
      KIND_CLEARED => return Err(bad(format!("event {i} is cleared but has {count} hashes"))),
      _ => {
        return Err(bad(format!(
          "event {i} has kind {k}: 0 stored, 1 removed, 2 cleared"
        )))
      }
    }
    hashes_needed += count as usize;
  }
  if hashes_needed != c.hashes.len() || tokens_needed != c.tokens.len() {
    return Err(bad(format!(
      "{} hashes and {} tokens given, the counts need {hashes_needed} and {tokens_needed}",
      c.hashes.len(),
      c.tokens.len()
    )));
  }
  Ok(())
}

#[cfg(test)]
mod tests {
  use super::*;

  fn cols<'a>(
    kinds: &'a [u8],
    counts: &'a [u32],
    hashes: &'a [u64],
    tokens: &'a [u32],
  ) -> Columns<'a> {
    Columns {
      kinds,
      hash_counts: counts,
      hashes,
      parents: &[0, 7, 0],
      has_parent: &[0, 1, 0],
      tokens,
      block_size: 2,
      medium: Some("GPU"),
      lora_id: None,
      lora_name: None,
    }
  }

  #[test]
  fn accepts_consistent_columns() {
    assert!(check_columns(&cols(&[2, 0, 1], &[0, 2, 1], &[1, 2, 3], &[10, 11, 12, 13])).is_ok());
  }

  #[test]
  fn rejects_inconsistent_columns() {
    for (kinds, counts, hashes, tokens) in [
      (
        &[2u8, 0, 1][..],
        &[0u32, 2, 1][..],
        &[1u64, 2][..],
        &[10u32, 11, 12, 13][..],
      ),
      (&[2, 0, 1], &[0, 2, 1], &[1, 2, 3], &[10, 11, 12]),
      (&[2, 0, 9], &[0, 2, 1], &[1, 2, 3], &[10, 11, 12, 13]),
      (&[2, 0, 2], &[0, 2, 1], &[1, 2, 3], &[10, 11, 12, 13]),
      (&[2, 0], &[0, 2], &[1, 2], &[10, 11, 12, 13]),
    ] {
      let err = check_columns(&cols(kinds, counts, hashes, tokens)).unwrap_err();
      assert_eq!(err.code, crate::ErrorCode::InvalidArg, "{}", err.message);
    }
  }
}
