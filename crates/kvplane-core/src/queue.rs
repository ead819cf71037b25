//! The publish queue (SPEC §3.1, §7): producers enqueue in O(1) and never wait. When the queue
//! is full, events are dropped and counted, and the drain turns each loss into a visible seq gap
//! at the place in the stream where it happened.

use crate::error::{count_from_f64, KvResult};
use crate::event::KvEvent;
use std::collections::VecDeque;

/// vLLM's `max_queue_size` default (kvplane counts events).
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 100_000;
/// Largest accepted `max_queue_size`.
pub const MAX_QUEUE_SIZE: usize = 100_000_000;

/// Checks a JS number is a usable `maxQueueSize`.
pub fn queue_size_from_f64(v: f64) -> KvResult<usize> {
  count_from_f64("maxQueueSize", v, MAX_QUEUE_SIZE)
}

pub struct EventQueue {
  events: VecDeque<KvEvent>,
  capacity: usize,
  /// Positions (counted from the head) after which events were lost, ascending.
  gaps: VecDeque<usize>,
  dropped: u64,
}

/// Events taken from the head of the queue.
#[derive(Debug, Default)]
pub struct Taken {
  pub events: Vec<KvEvent>,
  /// Events were lost right after these: the stream must show a gap there.
  pub gap_after: bool,
}

impl EventQueue {
  pub fn new(capacity: usize) -> EventQueue {
    EventQueue {
      events: VecDeque::new(),
      capacity: capacity.max(1),
      gaps: VecDeque::new(),
      dropped: 0,
    }
  }

  /// Enqueues events in order while there is room; the rest are dropped and counted. Returns how
  /// many were accepted.
  pub fn push_all(&mut self, events: impl IntoIterator<Item = KvEvent>) -> usize {
    let mut accepted = 0;
    for ev in events {
      if self.events.len() < self.capacity {
        self.events.push_back(ev);
        accepted += 1;
      } else {
        self.dropped += 1;
        if self.gaps.back() != Some(&self.events.len()) {
          self.gaps.push_back(self.events.len());
        }
      }
    }
    accepted
  }

  /// Takes up to `max` events from the head, stopping at the first loss.
  pub fn take(&mut self, max: usize) -> Taken {
    let mut n = self.events.len().min(max);
    let mut gap_after = false;
    if let Some(&g) = self.gaps.front() {
      if g <= n {
        n = g;
        gap_after = true;
        self.gaps.pop_front();
      }
    }
    for g in self.gaps.iter_mut() {
      *g -= n;
    }
    Taken {
      events: self.events.drain(..n).collect(),
      gap_after,
    }
  }

  /// Takes up to `max` events from the head as segments, each ending at a loss or at the end.
  pub fn take_segments(&mut self, max: usize) -> Vec<Taken> {
    let mut out = Vec::new();
    let mut taken = 0;
    while taken < max && !self.is_empty() {
      let t = self.take(max - taken);
      taken += t.events.len();
      out.push(t);
    }
    out
  }

  pub fn len(&self) -> usize {
    self.events.len()
  }

  pub fn is_empty(&self) -> bool {
    self.events.is_empty() && self.gaps.is_empty()
  }

  pub fn capacity(&self) -> usize {
    self.capacity
  }

  /// Events dropped because the queue was full.
  pub fn dropped(&self) -> u64 {
    self.dropped
  }
}

#[cfg(test)]
mod tests {
  use super::*;
  use crate::event::RemovedEvent;

  fn ev(h: u64) -> KvEvent {
    KvEvent::Removed(RemovedEvent {
      block_hashes: vec![h],
      ..Default::default()
    })
  }

  fn hashes(t: &Taken) -> Vec<u64> {
    t.events
      .iter()
      .map(|e| match e {
        KvEvent::Removed(r) => r.block_hashes[0],
        _ => unreachable!(),
      })
      .collect()
  }

  #[test]
  fn drops_when_full_and_marks_the_gap_where_the_loss_happened() {
    let mut q = EventQueue::new(3);
    assert_eq!(q.push_all((1..=5).map(ev)), 3);
    assert_eq!(q.dropped(), 2);
    let t = q.take(2);
    assert_eq!((hashes(&t), t.gap_after), (vec![1, 2], false));
    assert_eq!(q.push_all([ev(6), ev(7), ev(8)]), 2);
    // 3 | gap | 6 7 | gap
    let t = q.take(100);
    assert_eq!((hashes(&t), t.gap_after), (vec![3], true));
    let t = q.take(100);
    assert_eq!((hashes(&t), t.gap_after), (vec![6, 7], true));
    assert!(q.is_empty());
    assert_eq!(q.dropped(), 3);
    let t = q.take(100);
    assert_eq!((t.events.len(), t.gap_after), (0, false));
  }

  #[test]
  fn takes_nothing_past_a_loss_and_validates_its_size() {
    let mut q = EventQueue::new(1);
    q.push_all([ev(1), ev(2)]);
    assert_eq!(hashes(&q.take(0)), Vec::<u64>::new());
    let t = q.take(5);
    assert_eq!((hashes(&t), t.gap_after), (vec![1], true));
    assert!(queue_size_from_f64(0.0).is_err());
    assert_eq!(queue_size_from_f64(10.0).unwrap(), 10);
  }
}
