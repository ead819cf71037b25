import native from '../native.js';

/**
 * When the allocator is trimmed after a burst: the burst's buffers are freed only as the garbage
 * collector finds them, which can take seconds, so one trim is not enough.
 */
const TRIM_AFTER_MS = [1000, 3000, 6000];

let pending: NodeJS.Timeout | null = null;
let step = 0;
let collect: (() => void) | null = null;

/**
 * A full garbage collection to run before each trim (`kvplane serve` passes V8's `gc`). A burst's
 * buffers are garbage as soon as it ends, but V8 may leave gigabytes of them uncollected for many
 * seconds; without a collector, the trims return what the collector has freed by then.
 */
export function collectGarbageWith(gc: (() => void) | null): void {
  collect = gc;
}

/**
 * Hands the allocator's free memory back to the OS over the seconds after the last call. Transports call it when
 * a burst of short-lived buffers ends (the last replay, the last `/kv_recover` answer): glibc
 * otherwise keeps what the burst freed, and the process's resident memory stays at its peak.
 */
export function trimMemorySoon(): void {
  // Trailing: while bursts keep ending (a recovery storm, replays back to back), nothing runs
  // until a second after the last.
  if (pending !== null) clearTimeout(pending);
  step = 0;
  schedule();
}

function schedule(): void {
  pending = setTimeout(() => {
    pending = null;
    collect?.();
    native.trimAllocator();
    step++;
    if (step < TRIM_AFTER_MS.length) schedule();
  }, TRIM_AFTER_MS[step]);
  pending.unref();
}
