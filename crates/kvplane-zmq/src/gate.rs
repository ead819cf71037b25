//! The in-order fast path's gate. A live stream's batches are applied where they are read only
//! while the stream's follower (in JS) has said where it stands: then each batch with the next
//! seq is applied at once. Anything else (a gap, a seq that falls back, a reconnect, a batch that
//! does not apply) is handed to the follower, and the gate shuts until the follower reopens it.
//!
//! While shut, live batches that follow the last one handed over in order are held here rather
//! than handed over one by one (a follower catching up, or fetching a replay, does not need them
//! yet). When the follower reopens the gate at `next`, the held batches from `next` on are
//! applied here (those before it were applied from the replay: skipped, counted); if they start
//! after `next`, they are handed over, and the follower sees the gap.
//!
//! The follower may reopen it with hand-offs still unread. If those are only the live batches
//! that follow in order, it applies them itself, and the gate goes on holding until it has read
//! them all; then the held batches are applied and the gate is open. Anything else still unread
//! keeps it shut. So batches are applied in seq order, each once, whichever side applies them.

use std::collections::VecDeque;

/// What the link does with a live batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
  /// Apply it here.
  Apply,
  /// Keep it until the follower has read what it was handed (`hold`).
  Hold,
  /// Hand it to the follower (after the held batches: `take_held`).
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

/// A held live batch: its seq and payload.
pub type Held = (u64, Vec<u8>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
  #[default]
  Shut,
  /// Reopened with `until` hand-offs queued: batches are held until the follower read them.
  Pending {
    until: u64,
  },
  Open,
}

/// What `reopen` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reopened {
  /// Still shut: something other than in-order batches is unread.
  Shut,
  /// Still shut: the held batches start after the seq the follower expects. Hand them over
  /// (`take_held`): it sees the gap.
  Gap,
  /// Holding until the follower has read what it was handed.
  Pending,
  /// Open; apply these held batches first, in order (`applied` each, or hand over the rest).
  Open(Vec<Held>),
}

#[derive(Debug)]
pub struct Gate {
  state: State,
  /// Open: the seq applied next. Pending: the seq held next.
  expected: u64,
  stint: Stint,
  /// Hand-offs queued for the follower so far.
  handed: u64,
  /// The hand-offs not known to be read: their number and, for a live batch, its seq.
  queued: VecDeque<(u64, Option<u64>)>,
  held: Vec<Held>,
  /// Shut or pending: the seq that is held if it comes next (`None`: the next batch is handed over).
  hold_next: Option<u64>,
  max_held: usize,
  /// Held batches skipped because the follower had them already (from a replay).
  duplicates: u64,
}

impl Gate {
  /// Shut: everything goes to the follower until it opens the gate. At most `max_held` batches
  /// are held; one more is handed over (with the held ones) instead.
  pub fn new(max_held: usize) -> Self {
    Gate {
      state: State::Shut,
      expected: 0,
      stint: Stint::default(),
      handed: 0,
      queued: VecDeque::new(),
      held: Vec::new(),
      hold_next: None,
      max_held,
      duplicates: 0,
    }
  }

  pub fn is_open(&self) -> bool {
    self.state == State::Open
  }

  /// What was applied here since the last hand-off.
  pub fn stint(&self) -> Stint {
    self.stint
  }

  /// Held batches skipped as already applied by the follower.
  pub fn duplicates(&self) -> u64 {
    self.duplicates
  }

  /// Where a live batch with `seq` goes.
  pub fn route(&self, seq: u64) -> Route {
    match self.state {
      State::Open if seq == self.expected => Route::Apply,
      State::Open => Route::Forward,
      _ if self.hold_next == Some(seq) && self.held.len() < self.max_held => Route::Hold,
      _ => Route::Forward,
    }
  }

  /// Keeps a batch `route` said to hold.
  pub fn hold(&mut self, seq: u64, payload: Vec<u8>) {
    self.held.push((seq, payload));
    self.hold_next = Some(seq.wrapping_add(1));
  }

  /// `seq` was applied here.
  pub fn applied(&mut self, seq: u64) {
    self.expected = seq.wrapping_add(1);
    self.stint.last_seq = Some(seq);
    self.stint.batches += 1;
  }

  /// Before anything is handed to the follower: the held batches, to be handed over first, in
  /// order. The gate shuts.
  pub fn take_held(&mut self) -> Vec<Held> {
    self.state = State::Shut;
    std::mem::take(&mut self.held)
  }

  /// Something is handed to the follower (a live batch: its seq), after `take_held`: the gate
  /// shuts, and what was applied here since the last hand-off goes with it.
  pub fn hand_off(&mut self, batch_seq: Option<u64>) -> Stint {
    self.state = State::Shut;
    // What follows a batch handed over in order is held; after anything else, handed over.
    self.hold_next = batch_seq.map(|s| s.wrapping_add(1));
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

  /// The follower takes over without a hand-off (it could not apply a batch it was handed): the
  /// gate shuts. What was applied here since the last hand-off, and the held batches, to be
  /// handed over.
  pub fn shut(&mut self) -> (Stint, Vec<Held>) {
    self.state = State::Shut;
    self.hold_next = None;
    (
      std::mem::take(&mut self.stint),
      std::mem::take(&mut self.held),
    )
  }

  /// Hand-offs queued and not read yet, `read` of those queued so far having been read.
  pub fn unread(&mut self, read: u64) -> u64 {
    self.forget_read(read);
    self.handed.saturating_sub(read)
  }

  /// Opens: the seq after the held batches is applied next, once they are (by the caller).
  fn open_after_held(&mut self) -> Reopened {
    self.state = State::Open;
    self.expected = self.hold_next.unwrap_or(self.expected);
    self.hold_next = None;
    Reopened::Open(std::mem::take(&mut self.held))
  }

  fn forget_read(&mut self, read: u64) {
    while self.queued.front().is_some_and(|&(n, _)| n <= read) {
      self.queued.pop_front();
    }
  }

  /// The follower, having read `read` hand-offs, expects `next`. Shut: it opens if nothing is
  /// unread, or holds from after the unread hand-offs if they are only live batches from `next`
  /// on, in order. Holding: it opens once `read` covers them. Open: nothing changes.
  pub fn reopen(&mut self, next: u64, read: u64) -> Reopened {
    match self.state {
      State::Open => Reopened::Open(Vec::new()),
      State::Pending { until } if read >= until => self.open_after_held(),
      State::Pending { .. } => Reopened::Pending,
      State::Shut => {
        self.forget_read(read);
        let mut after = next;
        for &(_, seq) in &self.queued {
          if seq != Some(after) {
            return Reopened::Shut;
          }
          after = after.wrapping_add(1);
        }
        // Held batches the follower has applied already (a replay went past them).
        let dup = self
          .held
          .iter()
          .take_while(|&&(seq, _)| seq < after)
          .count();
        self.held.drain(..dup);
        self.duplicates += dup as u64;
        match self.held.first() {
          Some(&(seq, _)) if seq != after => return Reopened::Gap,
          Some(_) => {}
          None => self.hold_next = Some(after),
        }
        if self.queued.is_empty() {
          self.open_after_held()
        } else {
          self.state = State::Pending { until: self.handed };
          Reopened::Pending
        }
      }
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn open(g: &mut Gate, next: u64, read: u64) -> bool {
    matches!(g.reopen(next, read), Reopened::Open(h) if h.is_empty())
  }

  #[test]
  fn shut_until_reopened() {
    let mut g = Gate::new(8);
    assert_eq!(g.route(0), Route::Forward);
    g.hand_off(None);
    assert_eq!(g.reopen(0, 0), Reopened::Shut, "a connect is unread");
    assert!(open(&mut g, 0, 1));
    assert_eq!(g.route(0), Route::Apply);
    assert_eq!(g.route(1), Route::Forward);
  }

  #[test]
  fn shut_holds_what_follows_the_last_batch_handed_over() {
    let mut g = Gate::new(8);
    assert_eq!(g.route(10), Route::Forward, "nothing handed over yet");
    g.hand_off(Some(10));
    assert_eq!(g.route(11), Route::Hold);
    g.hold(11, vec![11]);
    g.hold(12, vec![12]);
    assert_eq!(g.route(14), Route::Forward);
    // The follower applied 10 and expects 11: the held batches are applied here, then it is open.
    assert_eq!(
      g.reopen(11, 1),
      Reopened::Open(vec![(11, vec![11]), (12, vec![12])])
    );
    g.applied(11);
    g.applied(12);
    assert_eq!(g.route(13), Route::Apply);
  }

  #[test]
  fn held_batches_a_replay_went_past_are_skipped() {
    let mut g = Gate::new(8);
    g.hand_off(Some(10));
    g.hold(11, vec![]);
    g.hold(12, vec![]);
    g.hold(13, vec![]);
    // The follower held 10, fetched 0..12 from the replay, and expects 13.
    assert_eq!(g.reopen(13, 1), Reopened::Open(vec![(13, vec![])]));
    assert_eq!(g.duplicates(), 2);
  }

  #[test]
  fn held_batches_after_a_gap_are_handed_over() {
    let mut g = Gate::new(8);
    g.hand_off(Some(10));
    g.hold(11, vec![]);
    // The follower expects 12: 11 is skipped as applied.
    assert_eq!(g.reopen(12, 1), Reopened::Open(vec![]));
    let mut g = Gate::new(8);
    g.hand_off(Some(10));
    g.hold(12, vec![]);
    assert_eq!(g.reopen(11, 1), Reopened::Gap);
    assert_eq!(g.take_held(), vec![(12, vec![])]);
  }

  #[test]
  fn a_control_hand_off_stops_holding() {
    let mut g = Gate::new(8);
    g.hand_off(Some(3));
    g.hand_off(None);
    assert_eq!(g.route(4), Route::Forward);
  }

  #[test]
  fn a_control_hand_off_unread_keeps_it_shut() {
    let mut g = Gate::new(8);
    g.hand_off(Some(0));
    g.hand_off(None);
    assert_eq!(g.reopen(1, 1), Reopened::Shut);
    assert!(open(&mut g, 1, 2));
    assert_eq!(g.route(1), Route::Apply);
  }

  #[test]
  fn holds_after_unread_batches_that_follow_in_order_until_they_are_read() {
    let mut g = Gate::new(8);
    for seq in 0..5 {
      g.hand_off(Some(seq));
    }
    // The follower read batch 0 and expects 1; 1..4 are queued for it.
    assert_eq!(g.reopen(1, 1), Reopened::Pending);
    assert_eq!(g.route(4), Route::Forward);
    assert_eq!(g.route(6), Route::Forward);
    assert_eq!(g.route(5), Route::Hold);
    g.hold(5, vec![5]);
    g.hold(6, vec![6]);
    assert_eq!(
      g.route(8),
      Route::Forward,
      "out of order: handed over after the held ones"
    );
    assert_eq!(
      g.reopen(3, 3),
      Reopened::Pending,
      "2 of the 5 hand-offs read"
    );
    assert_eq!(
      g.reopen(5, 5),
      Reopened::Open(vec![(5, vec![5]), (6, vec![6])])
    );
    g.applied(5);
    g.applied(6);
    assert_eq!(g.route(7), Route::Apply);
    assert_eq!(
      g.stint(),
      Stint {
        last_seq: Some(6),
        batches: 2
      }
    );
  }

  #[test]
  fn holding_is_bounded() {
    let mut g = Gate::new(1);
    g.hand_off(Some(0));
    g.hand_off(Some(1));
    assert_eq!(g.reopen(1, 1), Reopened::Pending);
    g.hold(2, vec![]);
    assert_eq!(g.route(3), Route::Forward);
    assert_eq!(g.take_held(), vec![(2, vec![])]);
    assert!(!g.is_open());
  }

  #[test]
  fn unread_batches_out_of_order_keep_it_shut() {
    let mut g = Gate::new(8);
    g.hand_off(Some(0));
    g.hand_off(Some(2));
    assert_eq!(g.reopen(1, 1), Reopened::Shut);
    assert!(open(&mut g, 3, 2));
  }

  #[test]
  fn in_order_batches_apply_and_a_gap_hands_off_the_stint() {
    let mut g = Gate::new(8);
    assert!(open(&mut g, 5, 0));
    for seq in 5..9 {
      assert_eq!(g.route(seq), Route::Apply);
      g.applied(seq);
    }
    assert_eq!(g.route(10), Route::Forward);
    assert!(g.take_held().is_empty());
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
    assert_eq!(g.reopen(11, 1), Reopened::Shut);
    assert!(open(&mut g, 11, 2));
  }

  #[test]
  fn a_dropped_hand_off_is_not_waited_for() {
    let mut g = Gate::new(8);
    assert!(open(&mut g, 0, 0));
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
    assert!(open(&mut g, 6, 1));
    assert_eq!(g.route(6), Route::Apply);
  }

  #[test]
  fn shut_takes_the_stint_and_the_held() {
    let mut g = Gate::new(8);
    assert!(open(&mut g, 3, 0));
    g.applied(3);
    g.applied(4);
    assert_eq!(
      g.shut(),
      (
        Stint {
          last_seq: Some(4),
          batches: 2
        },
        vec![]
      )
    );
    assert_eq!(g.route(5), Route::Forward);
    g.hand_off(Some(5));
    g.hand_off(Some(6));
    assert_eq!(g.reopen(6, 1), Reopened::Pending);
    g.hold(7, vec![7]);
    assert_eq!(g.shut(), (Stint::default(), vec![(7, vec![7])]));
  }

  #[test]
  fn a_fallen_back_seq_is_forwarded() {
    let mut g = Gate::new(8);
    assert!(open(&mut g, 100, 0));
    g.applied(100);
    assert_eq!(g.route(0), Route::Forward);
    assert_eq!(g.route(100), Route::Forward);
  }
}
