import type * as Native from '../../../index.js';
import { KvPlaneError } from '../../errors.js';
import type { LiveFeed, LiveHandlers } from './zmq_source.js';

export type NativeZmqLink = Native.NativeZmqLink;
export type ZmqDelivery = Native.ZmqDeliveryOut;
export type ZmqLinkStats = Native.ZmqLinkStatsOut;

/**
 * A rank's live socket read by a native link (crates/kvplane-zmq) on its own thread: while the
 * follower is in order (`reopen`), each batch with the next seq is applied to the router index
 * there, never crossing into JS; the rest (joining, gaps, restarts, reconnects, batches that do
 * not apply) comes here as it does from zeromq.js, after what the link applied meanwhile.
 */
export class NativeZmqFeed implements LiveFeed {
  readonly more = false;
  readonly #link: NativeZmqLink;
  #h: LiveHandlers | null = null;
  #closed = false;

  /**
   * A feed whose link `open` starts, or `null` where a link does not speak the endpoint (`open`
   * throws `ERR_INVALID_ARG`: `inproc://`): the caller reads it with zeromq.js then.
   */
  static open(
    open: (onDelivery: (d: ZmqDelivery) => void) => NativeZmqLink,
    onProgress: () => void,
  ): NativeZmqFeed | null {
    try {
      return new NativeZmqFeed(open, onProgress);
    } catch (err) {
      if (err instanceof KvPlaneError && err.code === 'ERR_INVALID_ARG') return null;
      throw err;
    }
  }

  /**
   * `open` starts the link with a delivery callback; `onProgress` is told, at most every 250 ms,
   * that the link applied batches.
   */
  private constructor(open: (onDelivery: (d: ZmqDelivery) => void) => NativeZmqLink, onProgress: () => void) {
    // Deliveries reach JS on a later turn of the event loop: `start` has set the handlers by then.
    this.#link = open((d) => {
      const h = this.#h;
      if (this.#closed || h === null) return;
      if (d.kind === 'progress') return onProgress();
      if (d.stintBatches > 0 && d.stintLastSeq != null) h.appliedElsewhere(d.stintLastSeq, d.stintBatches);
      if (d.kind === 'batch') h.batch(d.seq as bigint, d.payload as Buffer);
      else if (d.kind === 'connected') h.connected();
      else if (d.kind === 'disconnected') h.disconnected();
      else h.malformed(d.frames ?? 0);
    });
  }

  get closed(): boolean {
    return this.#closed;
  }

  start(h: LiveHandlers): void {
    this.#h = h;
  }

  reopen(next: bigint): void {
    if (!this.#closed) this.#link.reopen(next);
  }

  shut(): { lastSeq: bigint | null; batches: number } {
    const s = this.#link.shut();
    return { lastSeq: s.lastSeq ?? null, batches: s.batches };
  }

  stint(): { lastSeq: bigint | null; batches: number } {
    const s = this.#link.stats();
    return { lastSeq: s.stintLastSeq ?? null, batches: s.stintBatches };
  }

  takeLatencies(): Float64Array {
    return this.#link.takeLatencies();
  }

  stats(): ZmqLinkStats {
    return this.#link.stats();
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#link.close();
  }
}
