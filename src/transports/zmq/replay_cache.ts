import type { LocalIndexer } from '../../indexer.js';

/**
 * Logged batches of the replays in progress, one Buffer per batch shared by every session that
 * sends it. A recovery storm is many peers replaying the same stretch of the log: without it each
 * answer was a fresh copy out of the native log, and the copies (small JS objects over large
 * external memory) stayed uncollected long after they were sent, so a burst's resident memory
 * followed the garbage collector more than the replay budgets (test/budgets.test.ts).
 *
 * The cache only answers for seqs the log still retains (from its oldest on), so a replay reads
 * exactly what the log would give; it is bounded in bytes (oldest entries go first) and emptied
 * when the last replay ends.
 */
export class ReplayCache {
  readonly #maxBytes: number;
  readonly #bySeq = new Map<bigint, Buffer>();
  #bytes = 0;
  /** Batches answered from the cache, and copied out of the log. */
  hits = 0;
  misses = 0;

  constructor(maxBytes: number) {
    this.#maxBytes = maxBytes;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** As `LocalIndexer.replay(start, max)`: logged batches from `start`, at most `max`. */
  read(ix: LocalIndexer, start: bigint, max: number): { seqs: bigint[]; payloads: Buffer[] } {
    const oldest = ix.oldestSeq;
    if (oldest !== null && start >= oldest) {
      const seqs: bigint[] = [];
      const payloads: Buffer[] = [];
      for (let seq = start; seqs.length < max; seq++) {
        const payload = this.#bySeq.get(seq);
        if (payload === undefined) break;
        seqs.push(seq);
        payloads.push(payload);
      }
      if (seqs.length > 0) {
        this.hits += seqs.length;
        return { seqs, payloads };
      }
    }
    const { seqs: logged, payloads } = ix.replay(start, max);
    const seqs = Array.from(logged);
    this.misses += seqs.length;
    for (let i = 0; i < seqs.length; i++) this.#put(seqs[i] as bigint, payloads[i] as Buffer);
    return { seqs, payloads };
  }

  clear(): void {
    this.#bySeq.clear();
    this.#bytes = 0;
  }

  #put(seq: bigint, payload: Buffer): void {
    if (this.#bySeq.has(seq) || payload.length > this.#maxBytes) return;
    this.#bySeq.set(seq, payload);
    this.#bytes += payload.length;
    for (const [old, b] of this.#bySeq) {
      if (this.#bytes <= this.#maxBytes) break;
      this.#bySeq.delete(old);
      this.#bytes -= b.length;
    }
  }
}
