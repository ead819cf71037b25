/** Options of every async call that can be given up on. */
export interface AbortOptions {
  /**
   * Rejects the call with the signal's reason (an `AbortError` by default) once it aborts. Work
   * already running off the JS thread finishes there and its result is dropped; nothing is left
   * half-applied.
   */
  signal?: AbortSignal;
}

/** Runs `work`, rejecting early with the signal's reason if it aborts first. */
export async function abortable<T>(signal: AbortSignal | undefined, work: () => Promise<T>): Promise<T> {
  if (!signal) return work();
  signal.throwIfAborted();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([work(), aborted]);
  } finally {
    if (onAbort) signal.removeEventListener('abort', onAbort);
  }
}

/**
 * Opens something with `open` (a server, a publisher); a signal that aborts before it is open
 * rejects with its reason, and what was opened meanwhile is closed again.
 */
export async function openAbortable<T extends { close(): Promise<void> | void }>(
  signal: AbortSignal | undefined,
  open: () => Promise<T>,
): Promise<T> {
  signal?.throwIfAborted();
  const opened = await open();
  if (signal?.aborted) {
    await opened.close();
    throw signal.reason;
  }
  return opened;
}

/**
 * Starts `work` in any case (a close, an unsubscribe: it always runs to its end) and waits for it
 * unless the signal aborts first, rejecting then with the signal's reason.
 */
export async function runThenAbortable<T>(signal: AbortSignal | undefined, work: () => Promise<T>): Promise<T> {
  const running = work();
  if (!signal) return running;
  // Given up on, its failure has nobody to go to.
  running.catch(() => {});
  return abortable(signal, () => running);
}
