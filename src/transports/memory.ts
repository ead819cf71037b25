import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import native from '../native.js';

/**
 * When the allocator is trimmed after a burst: the burst's buffers are freed only as the garbage
 * collector finds them, so one trim is not enough. The first also asks for a major collection
 * (`collectSoon`), and the later ones return what it freed.
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

/**
 * Asks V8 for a major collection, run as a task of its own. A burst's buffers are old by the time
 * it ends, and with little traffic after it nothing else makes V8 collect them: Node 22 was seen
 * holding 208 MB of a finished burst's buffers 10 s later, Node 24 about 150 MB of memory it had
 * not returned, where Node 20 had collected them (test/budgets.test.ts). The collection pauses the
 * JS thread once per burst (tens of ms on a heap of tens of MB), against hundreds of MB kept.
 * `gc` is reached through a context of its own, as Node exposes it only behind a V8 flag.
 */
let collector: ((opts: { type: 'major'; execution: 'async'; flavor: 'last-resort' }) => void) | null | undefined;
function collectSoon(): void {
  if (collector === undefined) {
    try {
      setFlagsFromString('--expose-gc');
      collector = runInNewContext('gc') as typeof collector;
    } catch {
      collector = null;
    }
  }
  collector?.({ type: 'major', execution: 'async', flavor: 'last-resort' });
}

function schedule(): void {
  pending = setTimeout(() => {
    pending = null;
    if (step === 0) collectSoon();
    void trim();
    step++;
    if (step < TRIM_AFTER_MS.length) schedule();
  }, TRIM_AFTER_MS[step]);
  pending.unref();
}
