import type * as Native from '../../index.js';
import type { LocalIndexer } from '../indexer.js';
import type { EventQueue } from './queue.js';

/** Most events one drain cycle takes (it holds the index lock while it applies them). */
export const EVENTS_PER_CYCLE = 16 * 1024;

/**
 * Runs drain cycles off the JS thread: at most one in flight, so seqs stay in order; a new cycle
 * is scheduled on the next turn after events arrive and again while events remain.
 */
export class DrainScheduler {
  readonly #indexer: LocalIndexer;
  readonly #queue: EventQueue;
  readonly #dpRank: number | null;
  readonly #onCycle: (out: Native.PublishedOut) => void;
  #scheduled = false;
  #inFlight: Promise<void> | undefined;
  #stopped = false;

  constructor(
    indexer: LocalIndexer,
    queue: EventQueue,
    dpRank: number | null,
    onCycle: (out: Native.PublishedOut) => void,
  ) {
    this.#indexer = indexer;
    this.#queue = queue;
    this.#dpRank = dpRank;
    this.#onCycle = onCycle;
  }

  /** Schedules a cycle unless one is scheduled or running. */
  schedule(): void {
    if (this.#scheduled || this.#inFlight) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      if (!this.#stopped && !this.#inFlight) this.#drainNow();
    });
  }

  /** Resolves once everything queued has been drained and handed on. */
  async idle(): Promise<void> {
    while (!this.#stopped && (this.#inFlight || this.#queue.length > 0)) {
      if (this.#inFlight) await this.#inFlight;
      else this.#drainNow();
    }
  }

  /** Whether a cycle is scheduled or running (its batches not yet handed on). */
  get busy(): boolean {
    return this.#scheduled || this.#inFlight !== undefined;
  }

  /** No cycle starts after this. */
  stop(): void {
    this.#stopped = true;
  }

  #drainNow(): void {
    const cycle = this.#indexer
      .drainAsync(this.#queue.handle, EVENTS_PER_CYCLE, Date.now() / 1000, this.#dpRank)
      .then(
        (out) => this.#onCycle(out),
        () => {
          // Only a closed index fails here; close() has already published what it could.
        },
      )
      .finally(() => {
        this.#inFlight = undefined;
        if (!this.#stopped && this.#queue.length > 0) this.schedule();
      });
    this.#inFlight = cycle;
  }
}
