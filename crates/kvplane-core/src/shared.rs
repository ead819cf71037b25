//! An index shared by one writer and readers on other threads (docs/architecture.md#reads-during-writes).
//!
//! The writer takes the lock once per piece of an event, at most `PIECE_BLOCKS` blocks
//! (`index::Piecewise`), never across a batch or a whole long event: a query waits at most for
//! one piece to be applied. It sees the state between two pieces: the events before applied
//! whole, and the first blocks of the one under way, as the engine stored or freed them. A
//! payload is decoded before the lock is taken.
//!
//! Writers take turns too, an event at a time (`Shared::turn`): another writer never comes
//! between the pieces of an event, nor between the events of a recovery, which holds one turn
//! for all of them. Readers never wait for a turn, only for a piece.
//!
//! The two sides take turns: a writer announces itself and new readers hold off until it has had
//! its turn (with std's lock, measured, a thread querying back to back left the writer applying
//! nothing), and a writer lets readers already waiting go before its next piece (so a reader
//! waits for one piece, not for a run of them). Both wait on the CPU for a while before they
//! sleep (`SPIN`), then fall back to parking_lot's fair lock.

use crate::error::KvResult;
use crate::event::KvEvent;
use crate::index::{Index, Piecewise, WorkerKey};
use parking_lot::{Mutex, MutexGuard, RwLock};
pub use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a thread waits for the lock on the CPU before it sleeps. Each side holds the lock for
/// microseconds (one event, one query), while waking a sleeping thread took tens of microseconds
/// on the 2-vCPU VM of the benchmarks, and with a fair lock every later reader waits behind a
/// writer that is still waking up.
const SPIN: Duration = Duration::from_micros(200);

pub struct Shared<T> {
  inner: RwLock<T>,
  /// Writers waiting for the lock: readers hold off while there are any.
  writers: AtomicU32,
  /// Readers waiting for the lock: a writer lets them go first.
  readers: AtomicU32,
  /// Held by the writer whose turn it is (`turn`).
  turns: Mutex<()>,
}

/// A writer's turn (`Shared::turn`): other writers wait until it ends; readers do not.
pub struct Turn<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

/// A whole write (`Shared::write`): a turn and the lock, held together.
pub struct Exclusive<'a, T> {
  guard: RwLockWriteGuard<'a, T>,
  _turn: Turn<'a>,
}

impl<T> Deref for Exclusive<'_, T> {
  type Target = T;
  fn deref(&self) -> &T {
    &self.guard
  }
}

impl<T> DerefMut for Exclusive<'_, T> {
  fn deref_mut(&mut self) -> &mut T {
    &mut self.guard
  }
}

impl<T> Shared<T> {
  pub fn new(value: T) -> Shared<T> {
    Shared {
      inner: RwLock::new(value),
      writers: AtomicU32::new(0),
      readers: AtomicU32::new(0),
      turns: Mutex::new(()),
    }
  }

  /// A writer's turn: other writers wait until it ends, readers do not. `apply` takes one per
  /// event; a caller whose events no other writer may come between (a recovery) takes one across
  /// them and applies them with `apply_in`.
  pub fn turn(&self) -> Turn<'_> {
    Turn(self.turns.lock())
  }

  /// For work the caller does not interleave with reads, as one write: in a turn of its own, so
  /// it never lands between the pieces of another writer's event. A panic inside the index is
  /// caught where the call came in (the link, the binding's guard) and reported there; the lock
  /// is not poisoned.
  pub fn write(&self) -> Exclusive<'_, T> {
    let turn = self.turn();
    Exclusive {
      guard: self.piece(&turn),
      _turn: turn,
    }
  }

  /// For queries.
  pub fn read(&self) -> RwLockReadGuard<'_, T> {
    let take = || match self.writers.load(Ordering::Acquire) {
      0 => self.inner.try_read(),
      _ => None,
    };
    if let Some(g) = take() {
      return g;
    }
    self.readers.fetch_add(1, Ordering::AcqRel);
    let g = spin(take).unwrap_or_else(|| self.inner.read());
    self.readers.fetch_sub(1, Ordering::AcqRel);
    g
  }

  /// The lock for one piece of an event (or one step of a recovery), in the caller's turn.
  pub fn piece(&self, _turn: &Turn<'_>) -> RwLockWriteGuard<'_, T> {
    // Readers already waiting go first (bounded by SPIN, so readers cannot hold a writer off).
    spin(|| (self.readers.load(Ordering::Acquire) == 0).then_some(()));
    self.writers.fetch_add(1, Ordering::AcqRel);
    let g = spin(|| self.inner.try_write()).unwrap_or_else(|| self.inner.write());
    self.writers.fetch_sub(1, Ordering::AcqRel);
    g
  }
}

/// Blocks of an event applied under one write lock. Measured with `bench/index` (queries while
/// another thread applies 1M block ops/s of 16-block events; busy p99 against idle p99): whole
/// events 2.3-2.9x, 8 blocks 1.6-2.2x, 4 blocks 1.4-1.7x, one block up to 2.9x (the lock's own
/// traffic then shows).
pub const PIECE_BLOCKS: usize = 4;

/// What applies an event a piece at a time (`index::Piecewise`): the index, and the router's.
pub trait ApplyPiece {
  /// Applies the next piece of `p`; false once the event is all applied, or dropped.
  fn apply_piece(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool>;
}

impl ApplyPiece for Index {
  fn apply_piece(&mut self, p: &mut Piecewise<'_>) -> KvResult<bool> {
    Index::apply_piece(self, p)
  }
}

impl<T: ApplyPiece> Shared<T> {
  /// Applies one event for a worker, in a turn of its own, `PIECE_BLOCKS` blocks per write lock.
  pub fn apply(&self, w: WorkerKey, ev: &KvEvent) -> KvResult<()> {
    self.apply_in(&self.turn(), w, ev)
  }

  /// `apply` in the caller's turn.
  pub fn apply_in(&self, turn: &Turn<'_>, w: WorkerKey, ev: &KvEvent) -> KvResult<()> {
    let mut p = Piecewise::new(w, ev, PIECE_BLOCKS);
    while self.piece(turn).apply_piece(&mut p)? {}
    Ok(())
  }
}

/// Tries `take` until it succeeds or `SPIN` has passed.
fn spin<G>(mut take: impl FnMut() -> Option<G>) -> Option<G> {
  let mut start = None;
  loop {
    for _ in 0..64 {
      if let Some(g) = take() {
        return Some(g);
      }
      std::hint::spin_loop();
    }
    if start.get_or_insert_with(Instant::now).elapsed() > SPIN {
      return None;
    }
  }
}

#[cfg(test)]
mod tests {
  use super::Shared;
  use std::sync::Arc;

  #[test]
  fn a_reader_proceeds_between_a_writers_steps() {
    let s = Arc::new(Shared::new(0u64));
    let w = {
      let s = s.clone();
      std::thread::spawn(move || {
        for _ in 0..100_000 {
          *s.write() += 1;
        }
      })
    };
    let mut seen = Vec::new();
    while seen.last() != Some(&100_000) {
      seen.push(*s.read());
    }
    w.join().unwrap();
    assert!(seen.windows(2).all(|p| p[0] <= p[1]));
  }

  #[test]
  fn a_writers_turn_keeps_other_writers_out_and_lets_readers_in() {
    let s = Arc::new(Shared::new(0u64));
    let turn = s.turn();
    let other = {
      let s = s.clone();
      std::thread::spawn(move || {
        // Waits for the turn below to end.
        *s.write() = 100;
      })
    };
    for k in 1..=50 {
      *s.piece(&turn) += 1;
      // A reader gets in between the pieces of the turn; the other writer does not.
      assert_eq!(*s.read(), k);
      std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert_eq!(*s.read(), 50, "no other writer came in during the turn");
    drop(turn);
    other.join().unwrap();
    assert_eq!(*s.read(), 100);
  }
}
