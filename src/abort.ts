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
