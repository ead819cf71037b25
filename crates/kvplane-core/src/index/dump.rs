//! Tree dump: every worker's reachable blocks as stored events, parents before children, one
//! event per chain segment (a run of blocks each with exactly one child in that worker's tree),
//! with the engine's hashes and, when retained, the tokens.

use super::node::NONE;
use super::{Index, WorkerKey};
use crate::event::StoredEvent;
use std::collections::HashMap;

/// One stored event of a dump.
pub type DumpEvent = StoredEvent;

/// A worker's part of a dump.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerDump {
  pub worker: WorkerKey,
  pub events: Vec<DumpEvent>,
}

impl Index {
  /// A consistent snapshot of the index (the caller holds it exclusively while dumping).
  pub fn dump(&self) -> Vec<WorkerDump> {
    let mut out = Vec::new();
    for (slot, w) in self.workers.iter().enumerate() {
      if w.engine.is_empty() {
        continue;
      }
      let slot = slot as u32;
      // node -> the worker's engine hash for it
      let mut engine_of: HashMap<u32, u64> = HashMap::with_capacity(w.engine.len());
      for (eh, node) in w.engine.iter() {
        engine_of.insert(node, eh);
      }
      // children in this worker's tree; roots are blocks with no parent. Blocks whose parent the
      // worker no longer holds are unreachable and left out.
      let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
      let mut roots = Vec::new();
      for (_, node) in w.engine.iter() {
        let parent = self.nodes[node as usize].parent;
        if parent == NONE {
          roots.push(node);
        } else if engine_of.contains_key(&parent)
          && self.sets.contains(&self.nodes[parent as usize], slot)
        {
          children.entry(parent).or_default().push(node);
        }
      }
      // Deterministic order.
      roots.sort_unstable_by_key(|n| self.nodes[*n as usize].key);
      for kids in children.values_mut() {
        kids.sort_unstable_by_key(|n| self.nodes[*n as usize].key);
      }
      let mut events = Vec::new();
      // (segment start, parent engine hash)
      let mut stack: Vec<(u32, Option<u64>)> = roots.into_iter().rev().map(|r| (r, None)).collect();
      while let Some((start, parent_hash)) = stack.pop() {
        let mut ev = StoredEvent {
          parent_block_hash: parent_hash,
          ..Default::default()
        };
        let mut node = start;
        loop {
          ev.block_hashes.push(engine_of[&node]);
          let toks = self.tokens.get(node as usize).map_or(&[][..], |t| &t[..]);
          if ev.block_hashes.len() == 1 {
            ev.block_size = toks.len() as u32;
          }
          ev.token_ids.extend_from_slice(toks);
          let kids = children.get(&node).map_or(&[][..], |k| &k[..]);
          let next_fits = kids.len() == 1
            && self.tokens.get(kids[0] as usize).map_or(0, |t| t.len()) as u32 == ev.block_size;
          if next_fits {
            node = kids[0];
            continue;
          }
          let here = engine_of[&node];
          for &k in kids.iter().rev() {
            stack.push((k, Some(here)));
          }
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
