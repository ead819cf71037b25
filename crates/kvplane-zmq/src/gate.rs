//! The in-order fast path's gate. A live stream's batches are applied where they are read only
//! while the stream's follower (in JS) has said where it stands: then each batch with the next
//! seq is applied at once. Anything else (a gap, a seq that falls back, a reconnect, a batch that
//! does not apply) is handed to the follower, and the gate stays shut until the follower reopens
//! it. It may reopen it before reading everything it was handed if what it has not read yet is
//! only the batches that follow in order: it applies those itself, and the gate opens after them.

use std::collections::VecDeque;

/// What the link does with a live batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
  /// Apply it here.
  Apply,
  /// Hand it to the follower.
  Forward,
}

/// What was applied here since the last hand-off: the follower takes it up before what it is
/// handed next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stint {
  /// The last seq applied here, or `None`.
  pub last_seq: Option<u64>,
  /// Batches applied here.
  pub batches: u64,
}

#[derive(Debug, Default)]
pub struct Gate {
  open: bool,
  expected: u64,
  stint: Stint,
  /// Hand-offs queued for the follower so far.
  handed: u64,
  /// The hand-offs not known to be read: their number and, for a live batch, its seq.
  queued: VecDeque<(u64, Option<u64>)>,
}

impl Gate {
  /// Shut: everything goes to the follower until it opens the gate.
  pub fn new() -> Self {
    Gate::default()
  }

  pub fn is_open(&self) -> bool {
    self.open
  }

  /// What was applied here since the last hand-off.
  pub fn stint(&self) -> Stint {
    self.stint
  }

  /// Where a live batch with `seq` goes.
  pub fn route(&self, seq: u64) -> Route {
    if self.open && seq == self.expected {
      Route::Apply
    } else {
      Route::Forward
    }
  }

  /// `seq` was applied here.
  pub fn applied(&mut self, seq: u64) {
    self.expected = seq.wrapping_add(1);
    self.stint.last_seq = Some(seq);
    self.stint.batches += 1;
  }

  /// Something is handed to the follower (a live batch: its seq): the gate shuts, and what was
  /// applied here since the last hand-off goes with it.
  pub fn hand_off(&mut self, batch_seq: Option<u64>) -> Stint {
    self.open = false;
    self.handed += 1;
    self.queued.push_back((self.handed, batch_seq));
    std::mem::take(&mut self.stint)
  }

  /// The hand-off that `hand_off` began was not queued (the follower has too many unread): it
  /// is not waited for, and its stint stays to go with the next one.
  pub fn hand_off_dropped(&mut self, stint: Stint) {
    self.handed -= 1;
    self.queued.pop_back();
    self.stint = stint;
  }

  /// The follower takes over without a hand-off (it could not apply a batch it was handed while
  /// the gate was open after it): the gate shuts, and what was applied here goes to it now.
  pub fn shut(&mut self) -> Stint {
    self.open = false;
    std::mem::take(&mut self.stint)
  }

  /// Hand-offs queued and not read yet, `read` of those queued so far having been read.
  pub fn unread(&mut self, read: u64) -> u64 {
    self.forget_read(read);
    self.handed.saturating_sub(read)
  }

  fn forget_read(&mut self, read: u64) {
    while self.queued.front().is_some_and(|&(n, _)| n <= read) {
      self.queued.pop_front();
    }
  }

  /// The follower, having read `read` hand-offs, expects `next`: the gate opens if what it has
  /// not read is only live batches from `next` on, in order (it applies those; the gate expects
  /// the one after them). An open gate stays as it is.
  pub fn reopen(&mut self, next: u64, read: u64) -> bool {
    if self.open {
      return true;
    }
    self.forget_read(read);
    let mut expected = next;
    for &(_, seq) in &self.queued {
      if seq != Some(expected) {
        return false;
      }
      expected = expected.wrapping_add(1);
    }
    self.open = true;
    self.expected = expected;
    true
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn shut_until_reopened() {
    let mut g = Gate::new();
    assert_eq!(g.route(0), Route::Forward);
    g.hand_off(None);
    assert!(!g.reopen(0, 0), "a connect is unread");
    assert!(g.reopen(0, 1));
    assert_eq!(g.route(0), Route::Apply);
  }

  #[test]
  fn a_control_hand_off_unread_keeps_it_shut() {
    let mut g = Gate::new();
    g.hand_off(Some(0));
    g.hand_off(None);
    assert!(!g.reopen(1, 1), "a reconnect is unread");
    assert!(g.reopen(1, 2));
    assert_eq!(g.route(1), Route::Apply);
    assert_eq!(g.route(2), Route::Forward);
  }

  #[test]
  fn reopens_past_unread_batches_that_follow_in_order() {
    let mut g = Gate::new();
    for seq in 0..5 {
      g.hand_off(Some(seq));
    }
    // The follower read batch 0 and expects 1; 1..4 are queued for it.
    assert!(g.reopen(1, 1));
    assert_eq!(g.route(4), Route::Forward);
    assert_eq!(g.route(5), Route::Apply);
  }

  #[test]
  fn unread_batches_out_of_order_keep_it_shut() {
    let mut g = Gate::new();
    g.hand_off(Some(0));
    g.hand_off(Some(2));
    assert!(!g.reopen(1, 1));
    assert!(g.reopen(3, 2));
  }

  #[test]
  fn in_order_batches_apply_and_a_gap_hands_off_the_stint() {
    let mut g = Gate::new();
    assert!(g.reopen(5, 0));
    for seq in 5..9 {
      assert_eq!(g.route(seq), Route::Apply);
      g.applied(seq);
    }
    assert_eq!(g.route(10), Route::Forward);
    let s = g.hand_off(Some(10));
    assert_eq!(
      s,
      Stint {
        last_seq: Some(8),
        batches: 4
      }
    );
    assert!(!g.is_open());
    assert_eq!(
      g.route(9),
      Route::Forward,
      "shut until the follower reopens it"
    );
    assert_eq!(g.hand_off(None), Stint::default());
    assert!(!g.reopen(11, 1));
    assert!(g.reopen(11, 2));
  }

  #[test]
  fn a_dropped_hand_off_is_not_waited_for() {
    let mut g = Gate::new();
    g.reopen(0, 0);
    g.applied(0);
    let first = g.hand_off(Some(5));
    let stint = g.hand_off(Some(6));
    g.hand_off_dropped(stint);
    assert_eq!(
      first,
      Stint {
        last_seq: Some(0),
        batches: 1
      }
    );
    assert_eq!(g.unread(0), 1);
    assert!(g.reopen(6, 1));
    assert_eq!(g.route(6), Route::Apply);
  }

  #[test]
  fn shut_takes_the_stint() {
    let mut g = Gate::new();
    g.reopen(3, 0);
    g.applied(3);
    g.applied(4);
    assert_eq!(
      g.shut(),
      Stint {
        last_seq: Some(4),
        batches: 2
      }
    );
    assert_eq!(g.route(5), Route::Forward);
    assert_eq!(g.stint(), Stint::default());
  }

  #[test]
  fn a_fallen_back_seq_is_forwarded() {
    let mut g = Gate::new();
    g.reopen(100, 0);
    g.applied(100);
    assert_eq!(g.route(0), Route::Forward);
    assert_eq!(g.route(100), Route::Forward);
  }
}
