/** A relay's own latency, over its last batches: p50 / p99 / max, in ms. */
export interface LatencySummary {
  /** Batches the figures cover (at most the window). */
  count: number;
  p50: number;
  p99: number;
  max: number;
}

/**
 * The time each engine batch spends in the relay, from its message being read off the engine's
 * socket to its events being handed to the node's outputs (docs/protocol.md#engine-sources):
 * the last `window` batches, kept in a ring, summarized on demand.
 */
export class RelayLatency {
  readonly #ring: Float64Array;
  #n = 0;

  constructor(window = 8192) {
    this.#ring = new Float64Array(window);
  }

  /** One batch read at `receivedAt` (`performance.now()`), relayed now. */
  add(receivedAt: number): void {
    this.#ring[this.#n++ % this.#ring.length] = performance.now() - receivedAt;
  }

  /** Batches relayed elsewhere (a native link), each `ms` in the relay. */
  addTimes(ms: Float64Array): void {
    for (const t of ms) this.#ring[this.#n++ % this.#ring.length] = t;
  }

  summary(): LatencySummary {
    const count = Math.min(this.#n, this.#ring.length);
    const sorted = this.#ring.slice(0, count).sort();
    const at = (q: number) => +(sorted[Math.min(count - 1, Math.floor(q * count))] ?? 0).toFixed(3);
    return { count, p50: at(0.5), p99: at(0.99), max: +(sorted[count - 1] ?? 0).toFixed(3) };
  }
}
