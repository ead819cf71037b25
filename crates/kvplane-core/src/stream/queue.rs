//! The publish queue (docs/protocol.md#vllm-and-sglang-zmq-stream,
//! docs/protocol.md#drops-and-gaps): producers enqueue in O(1) and never wait. When the queue is
//! full, events are dropped and counted, and the drain turns each loss into a visible seq gap at
//! the place in the stream where it happened.

use crate::chunk::EventChunk;
use crate::error::{count_from_f64, KvResult};
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
  /// One chunk per accepted push, oldest first.
  chunks: VecDeque<Taken>,
  len: usize,
  capacity: usize,
  dropped: u64,
}

/// Events taken from the head of the queue.
#[derive(Debug, Default)]
pub struct Taken {
  pub events: EventChunk,
  /// Events were lost right after these: the stream must show a gap there.
  pub gap_after: bool,
}

impl EventQueue {
  pub fn new(capacity: usize) -> EventQueue {
    EventQueue {
      chunks: VecDeque::new(),
      len: 0,
      capacity: capacity.max(1),
      dropped: 0,
    }
  }

  /// Enqueues events in order while there is room; the rest are dropped and counted. Returns how
  /// many were accepted.
  pub fn push(&mut self, mut events: EventChunk) -> usize {
    let room = self.capacity - self.len;
    let n = events.len();
    if n <= room {
      if n > 0 {
        self.len += n;
        self.chunks.push_back(Taken {
          events,
          gap_after: false,
        });
      }
      return n;
    }
    self.dropped += (n - room) as u64;
    events.truncate(room);
    self.len += room;
    match self.chunks.back_mut() {
      Some(last) if room == 0 => last.gap_after = true,
      _ => self.chunks.push_back(Taken {
        events,
        gap_after: true,
      }),
    }
    room
  }

  /// Takes chunks from the head holding up to `max` events in all (the last one may be split),
  /// each marked where the queue lost events after it.
  pub fn take_segments(&mut self, max: usize) -> Vec<Taken> {
    let mut out = Vec::new();
    let mut taken = 0;
    while let Some(head) = self.chunks.front_mut() {
      let n = head.events.len();
      if taken + n <= max {
        taken += n;
        out.extend(self.chunks.pop_front());
      } else {
        if taken < max {
          let part = head.events.split_front(max - taken);
          taken = max;
          out.push(Taken {
            events: part,
            gap_after: false,
          });
        }
        break;
      }
    }
    self.len -= taken;
    out
  }

  pub fn len(&self) -> usize {
    self.len
  }

  pub fn is_empty(&self) -> bool {
    self.chunks.is_empty()
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
  use crate::event::{KvEvent, RemovedEvent};

  fn evs(hs: impl IntoIterator<Item = u64>) -> EventChunk {
    EventChunk::from_events(
      hs.into_iter()
        .map(|h| {
          KvEvent::Removed(RemovedEvent {
            block_hashes: vec![h],
            ..Default::default()
          })
        })
        .collect(),
    )
  }

  fn hashes(segs: &[Taken]) -> Vec<(Vec<u64>, bool)> {
    segs
      .iter()
      .map(|t| {
        let hs = t
          .events
          .iter()
          .map(|e| match e.to_event() {
            KvEvent::Removed(r) => r.block_hashes[0],
            _ => unreachable!(),
          })
          .collect();
        (hs, t.gap_after)
      })
      .collect()
  }

  #[test]
  fn drops_when_full_and_marks_the_gap_where_the_loss_happened() {
    let mut q = EventQueue::new(3);
    assert_eq!(q.push(evs(1..=5)), 3);
    assert_eq!(q.dropped(), 2);
    assert_eq!(hashes(&q.take_segments(2)), vec![(vec![1, 2], false)]);
    assert_eq!(q.len(), 1);
    assert_eq!(q.push(evs([6, 7, 8])), 2);
    assert_eq!(q.push(evs([9])), 0);
    // 3 | gap | 6 7 | gap
    assert_eq!(
      hashes(&q.take_segments(100)),
      vec![(vec![3], true), (vec![6, 7], true)]
    );
    assert!(q.is_empty());
    assert_eq!((q.len(), q.dropped()), (0, 4));
    assert!(q.take_segments(100).is_empty());
  }

  #[test]
  fn takes_whole_pushes_and_splits_the_last_one_at_max() {
    let mut q = EventQueue::new(100);
    q.push(evs([1, 2]));
    q.push(evs([3, 4, 5]));
    assert_eq!(hashes(&q.take_segments(0)), vec![]);
    assert_eq!(
      hashes(&q.take_segments(3)),
      vec![(vec![1, 2], false), (vec![3], false)]
    );
    assert_eq!(hashes(&q.take_segments(5)), vec![(vec![4, 5], false)]);
    assert!(queue_size_from_f64(0.0).is_err());
    assert_eq!(queue_size_from_f64(10.0).unwrap(), 10);
  }
}
