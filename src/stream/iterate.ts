import type { EncodeFormat } from '../codec.js';
import { KvPlaneError } from '../errors.js';
import type { EncodedBatches } from './batches.js';

export interface BatchIterationOptions {
  /** Encoding of the payloads. Default `'vllm'`. */
  format?: EncodeFormat;
  /** Ends the iteration (the loop ends normally; nothing is thrown). */
  signal?: AbortSignal;
  /**
   * Drains held for a loop that has not read them yet. Past it the oldest is dropped and counted
   * in `dropped`; the seqs of what follows show the gap. Default 1024.
   */
  maxQueued?: number;
}

/** An async iterator of a stream's batches that also says how many it dropped. */
export interface BatchIterator extends AsyncIterableIterator<EncodedBatches> {
  /** Drains dropped because the loop fell more than `maxQueued` behind. */
  readonly dropped: number;
}

/**
 * Turns a stream's `consume` into `for await (const b of ...)`: every drain published from now
 * on, in seq order, until the loop breaks, the signal aborts or the stream closes.
 */
export function iterateBatches(
  consume: (format: EncodeFormat, fn: (b: EncodedBatches) => void) => () => void,
  onClose: (fn: () => void) => () => void,
  options: BatchIterationOptions = {},
): BatchIterator {
  const max = options.maxQueued ?? 1024;
  if (!Number.isInteger(max) || max < 1) {
    throw new KvPlaneError('ERR_INVALID_ARG', `maxQueued is ${max}: a positive integer`);
  }
  const queued: EncodedBatches[] = [];
  let waiting: ((r: IteratorResult<EncodedBatches>) => void) | null = null;
  let done = false;
  let dropped = 0;
  const finish = () => {
    if (done) return;
    done = true;
    stop();
    offClose();
    options.signal?.removeEventListener('abort', finish);
    queued.length = 0;
    waiting?.({ value: undefined, done: true });
    waiting = null;
  };
  const stop = consume(options.format ?? 'vllm', (b) => {
    if (waiting) {
      const w = waiting;
      waiting = null;
      w({ value: b, done: false });
      return;
    }
    queued.push(b);
    if (queued.length > max) {
      queued.shift();
      dropped++;
    }
  });
  const offClose = onClose(finish);
  if (options.signal?.aborted) finish();
  else options.signal?.addEventListener('abort', finish, { once: true });
  return {
    get dropped() {
      return dropped;
    },
    next(): Promise<IteratorResult<EncodedBatches>> {
      const b = queued.shift();
      if (b) return Promise.resolve({ value: b, done: false });
      if (done) return Promise.resolve({ value: undefined, done: true });
      return new Promise((resolve) => {
        waiting = resolve;
      });
    },
    return(): Promise<IteratorResult<EncodedBatches>> {
      finish();
      return Promise.resolve({ value: undefined, done: true });
    },
    [Symbol.asyncIterator]() {
      return this;
    },
  };
}
