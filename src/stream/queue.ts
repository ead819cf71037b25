import type * as Native from '../../index.js';
import { callNative } from '../errors.js';
import { columnArgs, type EventColumns, type KvEvent } from '../events.js';
import native from '../native.js';

/**
 * The publish queue, owned by Rust: producers enqueue in O(1) and never wait; a full queue drops
 * the overflow, counts it and marks the place, so the drain skips a seq there.
 */
export class EventQueue {
  readonly handle: Native.NativeEventQueue;

  constructor(maxEvents: number) {
    this.handle = callNative(() => new native.NativeEventQueue(maxEvents));
  }

  /** Enqueues event objects; returns how many were accepted. */
  push(events: readonly KvEvent[]): number {
    return callNative(() => this.handle.pushEvents(events));
  }

  /** Enqueues events given as typed-array columns (the bulk path); returns how many were accepted. */
  pushColumns(columns: EventColumns): number {
    return callNative(() => this.handle.pushColumns(...columnArgs(columns)));
  }

  /** Events waiting for a drain. */
  get length(): number {
    return this.handle.length;
  }

  /** Events dropped because the queue was full. */
  get dropped(): number {
    return this.handle.dropped;
  }
}
