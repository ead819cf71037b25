import native from '../native.js';

/**
 * When the allocator is trimmed after a burst: the burst's buffers are freed only as the garbage
 * collector finds them, which can take seconds, so one trim is not enough. (Forcing a full
 * collection first was measured: it paused the live stream by up to 45 ms more and returned no
 * more memory once replays are capped at 16 at a time.)
 */
const TRIM_AFTER_MS = [1000, 3000, 6000];
/** While bursts keep ending (a recovery storm, replays back to back), a trim at most this often. */
const TRIM_WHILE_BUSY_MS = 30_000;

let pending: NodeJS.Timeout | null = null;
let step = 0;
let lastTrim = Date.now();
let trimming = false;

/**
 * Hands the allocator's free memory back to the OS over the seconds after the last call, and
 * every 30 s while calls keep coming. Transports call it when a burst of short-lived buffers ends
 * (the last replay, the last `/kv_recover` answer): glibc otherwise keeps what the burst freed,
 * and the process's resident memory stays at its peak. The trim runs off the JS thread.
 */
export function trimMemorySoon(): void {
  if (Date.now() - lastTrim >= TRIM_WHILE_BUSY_MS) void trim();
  // Trailing: nothing more runs until a second after the last call.
  if (pending !== null) clearTimeout(pending);
  step = 0;
  schedule();
}

async function trim(): Promise<void> {
  if (trimming) return;
  trimming = true;
  lastTrim = Date.now();
  try {
    await native.trimAllocator();
  } catch {
    // Closed or unsupported: nothing to return.
  } finally {
    trimming = false;
  }
}

function schedule(): void {
  pending = setTimeout(() => {
    pending = null;
    void trim();
    step++;
    if (step < TRIM_AFTER_MS.length) schedule();
  }, TRIM_AFTER_MS[step]);
  pending.unref();
}
