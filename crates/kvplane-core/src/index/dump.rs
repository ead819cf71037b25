//! Tree dump: every worker's reachable blocks as stored events, parents before children, one
//! event per chain segment (a run of blocks each with exactly one child in that worker's tree),
//! with the engine's hashes and, when retained, the tokens.
//!
//! Per worker, the worker's own tree is rebuilt in dense scratch arrays indexed by node (reused
//! across workers, validated by a stamp), so a dump costs O(memberships) without hashing.

use super::node::NONE;
use super::{Index, WorkerKey};
use crate::event::StoredEvent;

/// One stored event of a dump.
pub type DumpEvent = StoredEvent;

/// A worker's part of a dump.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerDump {
  pub worker: WorkerKey,
  pub events: Vec<DumpEvent>,
}

/// Scratch arrays indexed by node; an entry is valid when its stamp is the current worker's.
struct Scratch {
  stamp: Vec<u32>,
  engine: Vec<u64>,
  /// Children of a node in the current worker's tree, as `kids[kid_start..kid_start + kid_len]`.
  kid_start: Vec<u32>,
  kid_len: Vec<u32>,
}

impl Index {
  fn tokens_of(&self, n: u32) -> &[u32] {
    self.tokens.get(n as usize).map_or(&[][..], |t| &t[..])
  }

  /// A consistent snapshot of the index (the caller holds it exclusively while dumping).
  pub fn dump(&self) -> Vec<WorkerDump> {
    let n = self.nodes.len();
    let mut s = Scratch {
      stamp: vec![0; n],
      engine: vec![0; n],
      kid_start: vec![0; n],
      kid_len: vec![0; n],
    };
    let mut out = Vec::new();
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    let mut kids: Vec<u32> = Vec::new();
    for (slot, w) in self.workers.iter().enumerate() {
      if w.engine.is_empty() {
        continue;
      }
      let stamp = slot as u32 + 1;
      for (eh, node) in w.engine.iter() {
        s.stamp[node as usize] = stamp;
        s.engine[node as usize] = eh;
        s.kid_start[node as usize] = 0;
        s.kid_len[node as usize] = 0;
      }
      // (parent, child) edges of this worker's tree; roots have parent NONE. Blocks whose
      // parent the worker no longer holds are unreachable and left out.
      pairs.clear();
      for (_, node) in w.engine.iter() {
        let parent = self.nodes[node as usize].parent;
        if parent == NONE || s.stamp[parent as usize] == stamp {
          pairs.push((parent, node));
        }
      }
      // Deterministic order: by parent, then by child key.
      pairs.sort_unstable_by_key(|&(p, c)| (p, self.nodes[c as usize].key));
      kids.clear();
      let mut roots = Vec::new();
      for (i, &(p, c)) in pairs.iter().enumerate() {
        if p == NONE {
          roots.push(c);
          continue;
        }
        if i == 0 || pairs[i - 1].0 != p {
          s.kid_start[p as usize] = kids.len() as u32;
        }
        s.kid_len[p as usize] += 1;
        kids.push(c);
      }
      let children = |node: u32| {
        let (a, l) = (
          s.kid_start[node as usize] as usize,
          s.kid_len[node as usize] as usize,
        );
        &kids[a..a + l]
      };
      let mut events = Vec::new();
      let mut stack: Vec<(u32, Option<u64>)> = roots.iter().rev().map(|&r| (r, None)).collect();
      while let Some((start, parent_hash)) = stack.pop() {
        let mut ev = StoredEvent {
          parent_block_hash: parent_hash,
          ..Default::default()
        };
        ev.block_size = self.tokens_of(start).len() as u32;
        let mut node = start;
        loop {
          ev.block_hashes.push(s.engine[node as usize]);
          ev.token_ids.extend_from_slice(self.tokens_of(node));
          let next = children(node);
          if next.len() == 1 && self.tokens_of(next[0]).len() as u32 == ev.block_size {
            node = next[0];
            continue;
          }
          let here = s.engine[node as usize];
          stack.extend(next.iter().rev().map(|&k| (k, Some(here))));
          break;
        }
        events.push(ev);
      }
      out.push(WorkerDump {
        worker: w.key,
        events,
      });
    }
    out
  }
}
