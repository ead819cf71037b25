//! Tree dump: every worker's reachable blocks as stored events, parents before children, one
//! event per chain segment (a run of blocks each with exactly one child in that worker's tree),
//! with the engine's hashes and, when retained, the tokens and the blocks' content hashes.
//!
//! Per worker, the tree is walked from the roots along the edges and the spans it holds; its
//! engine ids are found in its blocks sorted by location.

use super::edge::{loc, NONE};
use super::{Index, Pos, WorkerKey};
use crate::event::StoredEvent;

/// One stored event of a dump.
pub type DumpEvent = StoredEvent;

/// A worker's part of a dump.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerDump {
  pub worker: WorkerKey,
  pub events: Vec<DumpEvent>,
  /// Each event's blocks' content hashes, when the index retains them (else empty).
  pub contents: Vec<Vec<u64>>,
  /// Each event's blocks' keys, when the index dumps them (`IndexConfig::dump_keys`; else empty).
  pub keys: Vec<Vec<u64>>,
}

impl Index {
  fn tokens_of(&self, (e, o): Pos) -> &[u32] {
    self.edges[e as usize]
      .tokens
      .get(o as usize)
      .map_or(&[][..], |t| &t[..])
  }

  fn key_at(&self, (e, o): Pos) -> u64 {
    self.edges[e as usize].keys[o as usize]
  }

  /// A consistent snapshot of the index (the caller holds it exclusively while dumping).
  pub fn dump(&self) -> Vec<WorkerDump> {
    // The roots, by first key.
    let mut roots: Vec<(u64, u32)> = Vec::new();
    for (id, edge) in self.edges.iter().enumerate() {
      if edge.parent == NONE {
        roots.push((edge.keys[0], id as u32));
      }
    }
    roots.sort_unstable();
    let mut out = Vec::new();
    let mut held: Vec<(u64, u64)> = Vec::new();
    let mut children: Vec<Pos> = Vec::new();
    for (slot, w) in self.workers.iter().enumerate() {
      if w.engine.is_empty() {
        continue;
      }
      let slot = slot as u32;
      held.clear();
      held.extend(w.engine.iter().map(|(eh, l)| (l, eh)));
      held.sort_unstable();
      let engine_of = |(e, o): Pos| {
        let i = held
          .binary_search_by_key(&loc(e, o), |&(l, _)| l)
          .expect("a held block");
        held[i].1
      };
      let holds = |(e, o): Pos| self.edges[e as usize].holds(o, slot);
      let mut stack: Vec<(Pos, Option<u64>)> = roots
        .iter()
        .rev()
        .map(|&(_, e)| ((e, 0), self.root_parents.get(&e).copied()))
        .filter(|&(p, _)| holds(p))
        .collect();
      let mut events = Vec::new();
      let mut contents = Vec::new();
      let mut keys = Vec::new();
      let retained = self.cfg.retain_contents;
      while let Some((start, parent_hash)) = stack.pop() {
        let mut content = Vec::new();
        let mut key = Vec::new();
        let mut ev = StoredEvent {
          parent_block_hash: parent_hash,
          block_size: self.tokens_of(start).len() as u32,
          ..Default::default()
        };
        let mut p = start;
        loop {
          let here = engine_of(p);
          ev.block_hashes.push(here);
          ev.token_ids.extend_from_slice(self.tokens_of(p));
          if let Some(&c) = self.edges[p.0 as usize].contents.get(p.1 as usize) {
            content.push(c);
          }
          if self.cfg.dump_keys {
            key.push(self.key_at(p));
          }
          // This block's children in the worker's tree, by key.
          children.clear();
          let (e, o) = p;
          if (o as usize + 1) < self.edges[e as usize].len() && holds((e, o + 1)) {
            children.push((e, o + 1));
          }
          let kids = &self.edges[e as usize].kids;
          let from = kids.partition_point(|&(off, _)| off < o);
          for &(off, k) in &kids[from..] {
            if off != o {
              break;
            }
            if holds((k, 0)) {
              children.push((k, 0));
            }
          }
          if children.len() == 1 && self.tokens_of(children[0]).len() as u32 == ev.block_size {
            p = children[0];
            continue;
          }
          children.sort_unstable_by_key(|&c| self.key_at(c));
          stack.extend(children.iter().rev().map(|&c| (c, Some(here))));
          break;
        }
        // Blocks stored from a dump without content hashes have none: then the event has none.
        if retained {
          let known = !content.contains(&super::UNKNOWN_CONTENT);
          contents.push(if known && content.len() == ev.block_hashes.len() {
            content
          } else {
            Vec::new()
          });
        }
        if self.cfg.dump_keys {
          keys.push(key);
        }
        events.push(ev);
      }
      out.push(WorkerDump {
        worker: w.key,
        events,
        contents,
        keys,
      });
    }
    out
  }
}
