import { KvPlaneError } from '../errors.js';

/** `idleConnectionMs` as given (`fallback` when not), checked: an integer of at least 100 ms. */
export function idleConnectionMs(ms: number | undefined, fallback: number): number {
  const v = ms ?? fallback;
  if (!Number.isInteger(v) || v < 100) {
    throw new KvPlaneError('ERR_INVALID_ARG', `idleConnectionMs must be an integer >= 100, got ${v}`);
  }
  return v;
}
