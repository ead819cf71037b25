//! A peer indexer's dump stored into a router's index (`kvplane indexer --peers`): its segments
//! as `codec::dynamo_dump` reads them, each stored by its blocks' keys (a kvplane dump's) or
//! their content hashes chained as tokens' are (Dynamo's).

use super::{split_tier, DumpSegment, RouterIndex};
use crate::index::{DropReason, StoredBlocks};
use crate::shared::{Shared, Turn, PIECE_BLOCKS};

/// What restoring a peer's dump did (`Shared::<RouterIndex>::restore`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
  pub segments: u32,
  pub blocks: u64,
}

impl RouterIndex {
  /// Whether a dumped segment's parent is stored, in any tier (or it has none).
  fn knows_parent(&self, seg: &DumpSegment) -> bool {
    seg.parent.is_none_or(|p| {
      self
        .tiers
        .iter()
        .any(|ix| ix.key_of(seg.worker, p).is_some())
    })
  }

  /// Stores blocks `blocks` of a dumped segment under `parent`: by their keys when it has them,
  /// else by their content hashes; false when they were not stored (their parent unknown:
  /// counted).
  fn restore_blocks(
    &mut self,
    seg: &DumpSegment,
    parent: Option<u64>,
    blocks: std::ops::Range<usize>,
  ) -> bool {
    let stored = StoredBlocks {
      block_hashes: &seg.block_hashes[blocks.clone()],
      parent_block_hash: parent,
      token_ids: &[],
      block_size: self.block_size,
      content_hashes: seg.content_hashes.get(blocks.clone()).unwrap_or(&[]),
      keys: seg.keys.get(blocks).unwrap_or(&[]),
    };
    let (here, elsewhere) = split_tier(&mut self.tiers, seg.tier as usize, seg.worker);
    let before = here.dropped(DropReason::UnknownParent);
    here.store_chained(seg.worker, stored, 0, elsewhere).is_ok()
      && here.dropped(DropReason::UnknownParent) == before
  }
}

/// Whether a segment has keys or content hashes for each of its blocks (and no partial list).
fn storable(s: &DumpSegment) -> bool {
  let n = s.block_hashes.len();
  let all = |m: usize| m == n;
  let all_or_none = |m: usize| m == 0 || m == n;
  let (k, c) = (s.keys.len(), s.content_hashes.len());
  all_or_none(k) && all_or_none(c) && (all(k) || all(c))
}

impl Shared<RouterIndex> {
  /// A peer's dump stored over what the index holds, in one writer's turn, `PIECE_BLOCKS` blocks
  /// per write lock. A segment whose parent is not stored yet waits for the others (a dump may
  /// list a tier's blocks before those of the tier their parents are in); one whose parent never
  /// comes is stored last, and dropped as an unknown parent (counted). A segment without keys or
  /// content hashes for each of its blocks is left out, as are those of the workers in `skip`
  /// (they load their state from their own source).
  pub fn restore(&self, segments: &[DumpSegment], skip: &[u64]) -> Restored {
    let turn = self.turn();
    let mut out = Restored::default();
    let mut pending: Vec<&DumpSegment> = segments
      .iter()
      .filter(|s| storable(s) && !skip.contains(&s.worker.worker_id))
      .collect();
    loop {
      let before = pending.len();
      let mut later = Vec::new();
      for seg in pending {
        if self.read().knows_parent(seg) {
          self.restore_segment(&turn, seg, &mut out);
        } else {
          later.push(seg);
        }
      }
      if later.len() == before {
        for seg in later {
          self.restore_segment(&turn, seg, &mut out);
        }
        return out;
      }
      pending = later;
    }
  }

  fn restore_segment(&self, turn: &Turn<'_>, seg: &DumpSegment, out: &mut Restored) {
    out.segments += 1;
    let mut parent = seg.parent;
    let mut at = 0;
    while at < seg.block_hashes.len() {
      let end = (at + PIECE_BLOCKS).min(seg.block_hashes.len());
      if !self.piece(turn).restore_blocks(seg, parent, at..end) {
        return;
      }
      out.blocks += (end - at) as u64;
      parent = Some(seg.block_hashes[end - 1]);
      at = end;
    }
  }
}
