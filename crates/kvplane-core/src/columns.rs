//! Events in columns: the bulk publish path. A host hands over many events as a few typed arrays
//! (one N-API call, no object per event); this checks them and builds the events.

use crate::error::{KvError, KvResult};
use crate::event::{KvEvent, RemovedEvent, StoredEvent};

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

/// Builds the events, or `ERR_INVALID_ARG` naming the first inconsistency (nothing is built).
pub fn events_from_columns(c: &Columns<'_>) -> KvResult<Vec<KvEvent>> {
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
  let bs = c.block_size as usize;
  let (mut h, mut t) = (0usize, 0usize);
  let mut out = Vec::with_capacity(n);
  for i in 0..n {
    let count = c.hash_counts[i] as usize;
    let block_hashes = c.hashes[h..h + count].to_vec();
    h += count;
    out.push(match c.kinds[i] {
      KIND_STORED => {
        let token_ids = c.tokens[t..t + count * bs].to_vec();
        t += count * bs;
        KvEvent::Stored(StoredEvent {
          block_hashes,
          parent_block_hash: (c.has_parent[i] != 0).then_some(c.parents[i]),
          token_ids,
          block_size: c.block_size,
          lora_id: c.lora_id,
          lora_name: c.lora_name.map(str::to_owned),
          medium: c.medium.map(str::to_owned),
          ..Default::default()
        })
      }
      KIND_REMOVED => KvEvent::Removed(RemovedEvent {
        block_hashes,
        medium: c.medium.map(str::to_owned),
        ..Default::default()
      }),
      _ => KvEvent::Cleared,
    });
  }
  Ok(out)
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
  fn builds_events_in_order() {
    let ev =
      events_from_columns(&cols(&[2, 0, 1], &[0, 2, 1], &[1, 2, 3], &[10, 11, 12, 13])).unwrap();
    assert_eq!(ev[0], KvEvent::Cleared);
    match &ev[1] {
      KvEvent::Stored(s) => {
        assert_eq!(s.block_hashes, vec![1, 2]);
        assert_eq!(s.parent_block_hash, Some(7));
        assert_eq!(s.token_ids, vec![10, 11, 12, 13]);
        assert_eq!(s.medium.as_deref(), Some("GPU"));
      }
      other => panic!("{other:?}"),
    }
    match &ev[2] {
      KvEvent::Removed(r) => assert_eq!(r.block_hashes, vec![3]),
      other => panic!("{other:?}"),
    }
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
      let err = events_from_columns(&cols(kinds, counts, hashes, tokens)).unwrap_err();
      assert_eq!(err.code, crate::ErrorCode::InvalidArg, "{}", err.message);
    }
  }
}
