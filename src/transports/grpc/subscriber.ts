import type { Metadata, ServerWritableStream } from '@grpc/grpc-js';
import type { LoggedBatches, Snapshot } from '../../indexer.js';
import type { LoadFeed } from './loads.js';

/** Batches read from the replay log per step of a catch-up. */
const REPLAY_CHUNK = 64;

/** How a subscription ends: a gRPC status code and message. */
export interface EndStatus {
  code: number;
  details: string;
  metadata?: Metadata;
}

type Call = ServerWritableStream<Buffer, Buffer>;

/**
 * One `SubscribeKvEvents` stream. It takes the shared `KvEventBatch` bytes (the same Buffer for
 * every subscriber), keeps them in order in a bounded queue and writes them as fast as the peer
 * reads. A subscription from a seq first catches up from the replay log, at the peer's pace; live
 * batches arriving meanwhile are in the log too, so they are not held: the catch-up reads on until
 * it reaches the log's end and the stream turns live in that same step. The peer sees every seq
 * once, in order, and only what waits for the peer counts as its lag.
 */
export class Subscriber {
  readonly #call: Call;
  readonly #maxLag: number;
  readonly #onEnd: (sub: Subscriber) => void;
  /** The next seq this peer needs; `null` until the first live batch (a live subscription). */
  #next: bigint | null;
  #catchingUp = false;
  #queue: Buffer[] = [];
  #head = 0;
  /** The stream is above its high-water mark: wait for `drain`. */
  #blocked = false;
  #drained: (() => void) | undefined;
  /** Set once ending: no more batches are taken. */
  #ending: EndStatus | undefined;
  #done = false;
  /** The engine's load, attached to each batch as its record (none without an upstream). */
  readonly #loads: LoadFeed | null;
  /** The peer takes `load_only` batches numbered 0 before the first batch. */
  readonly #loadsEarly: boolean;
  /** The last record's sample number (monotonic per stream). */
  #sample = 0n;
  /** The last seq queued for the peer, or `null`: what a `load_only` batch repeats. */
  #lastSeq: bigint | null = null;
  /** A record went out since the last heartbeat. */
  #recorded = false;
  /** The next record carries the engine's telemetry (a stream's first, then each heartbeat's). */
  #telemetryDue = true;
  /** Batches handed to the stream. */
  sent = 0;
  /** `load_only` batches handed to the stream. */
  loadOnlySent = 0;
  /** Bytes queued here for the peer, not yet handed to the stream. */
  queuedBytes = 0;

  constructor(
    call: Call,
    next: bigint | null,
    maxLag: number,
    onEnd: (sub: Subscriber) => void,
    loads: LoadFeed | null = null,
    loadsEarly = false,
  ) {
    this.#call = call;
    this.#next = next;
    this.#maxLag = maxLag;
    this.#onEnd = onEnd;
    this.#loads = loads;
    this.#loadsEarly = loadsEarly;
    call.on('drain', () => {
      this.#blocked = false;
      this.#pump();
    });
    const gone = () => this.#finish();
    call.on('cancelled', gone);
    call.on('close', gone);
    call.on('error', gone);
  }

  /** Batches waiting for the peer. */
  get lag(): number {
    return this.#queue.length - this.#head;
  }

  get done(): boolean {
    return this.#done || this.#ending !== undefined;
  }

  /** Offers a live batch; false when the peer is now further behind than its bound. */
  live(seq: bigint, bytes: Buffer): boolean {
    // During a catch-up the batch is in the log, where the catch-up will read it.
    if (this.done || this.#catchingUp) return true;
    this.#enqueue(seq, bytes);
    return this.lag <= this.#maxLag;
  }

  /**
   * Sends `snapshot`'s chunks when given, then the log from the subscription's start seq (or the
   * seq after the snapshot) up to its end, as fast as the peer reads, then turns live. `read`
   * returns logged batches from a seq (at most `max`, the oldest retained when that seq is gone),
   * as `KvEventBatch` bytes. Resolves `false` if the peer fell so far behind
   * that the log no longer holds the seq it needs (the caller ends the stream).
   */
  async catchUp(
    read: (start: bigint, max: number) => LoggedBatches,
    snapshot?: Promise<Snapshot | null>,
  ): Promise<boolean> {
    this.#catchingUp = true;
    try {
      // A snapshot's chunks first (docs/protocol.md#snapshots): they end at the seq its state
      // was taken at, and the log continues from the next one. Live batches published while it
      // is taken and sent are in the log.
      const snap = snapshot === undefined ? null : await snapshot;
      if (snap !== null) {
        try {
          let seq = snap.lastSeq - BigInt(snap.count) + 1n;
          for await (const chunk of snap.chunks) {
            if (this.done) break;
            this.#enqueue(seq++, chunk);
            await this.#drain();
          }
        } finally {
          snap.release();
        }
      }
      while (!this.done) {
        const from = this.#next ?? 1n;
        const got = read(from, REPLAY_CHUNK);
        if (got.seqs.length === 0) return true;
        // (No seq yet: a snapshot of nothing; the log's first batch is where this peer begins.)
        if ((got.seqs[0] as bigint) > from && this.#next !== null) return false;
        for (let i = 0; i < got.seqs.length; i++) this.#enqueue(got.seqs[i] as bigint, got.payloads[i] as Buffer);
        await this.#drain();
      }
      return true;
    } finally {
      this.#catchingUp = false;
    }
  }

  /**
   * After each `GetLoads` answer: a stream idle since the last one gets the engine's record alone,
   * as `load_only` batches (one per rank) repeating the last seq it was sent, so the gateway keeps
   * its load current and knows the stream is alive. Before its first batch only a peer that asked
   * for records early gets them (numbered 0); a peer catching up or with batches waiting gets its
   * record with them.
   */
  heartbeat(): void {
    const recorded = this.#recorded;
    this.#recorded = false;
    this.#telemetryDue = true;
    if (recorded || this.done || this.#catchingUp || this.lag > 0 || this.#blocked) return;
    const load = this.#loads?.current();
    if (!load || (this.#lastSeq === null && !this.#loadsEarly)) return;
    const batches = load.loads.loadOnly(this.#lastSeq ?? 0n, Date.now() / 1000, ++this.#sample, load.ageMs, true);
    this.#telemetryDue = false;
    for (const b of batches) {
      this.loadOnlySent++;
      if (!this.#call.write(b)) this.#blocked = true;
    }
  }

  /** Ends the stream now with `status`, dropping what has not been handed to the stream. */
  cut(status: EndStatus): void {
    if (this.done) return;
    this.#queue = [];
    this.#head = 0;
    this.queuedBytes = 0;
    this.#end(status);
  }

  /** Ends the stream with `status` once what is queued has been handed to the stream. */
  endAfterQueued(status: EndStatus): void {
    if (this.done) return;
    this.#ending = status;
    this.#pump();
  }

  /** Resolves once the stream takes more (at once when it is not above its high-water mark). */
  async #drain(): Promise<void> {
    if (this.#blocked) await new Promise<void>((resolve) => (this.#drained = resolve));
  }

  #enqueue(seq: bigint, bytes: Buffer): void {
    if (this.#next !== null && seq < this.#next) return;
    this.#queue.push(bytes);
    this.queuedBytes += bytes.length;
    this.#next = seq + 1n;
    this.#lastSeq = seq;
    this.#pump();
  }

  #pump(): void {
    while (!this.#blocked && this.#head < this.#queue.length && !this.#done) {
      const bytes = this.#queue[this.#head] as Buffer;
      this.#queue[this.#head++] = undefined as unknown as Buffer;
      this.queuedBytes -= bytes.length;
      this.sent++;
      if (!this.#call.write(this.#withLoad(bytes))) this.#blocked = true;
    }
    if (this.#head === this.#queue.length) {
      this.#queue = [];
      this.#head = 0;
    }
    if (!this.#blocked) {
      const resolve = this.#drained;
      this.#drained = undefined;
      resolve?.();
    }
    if (this.#ending !== undefined && this.#head === this.#queue.length && !this.#done) this.#end(this.#ending);
  }

  /** The batch with the engine's current load record appended, when there is one. */
  #withLoad(bytes: Buffer): Buffer {
    const load = this.#loads?.current();
    if (!load) return bytes;
    const out = load.loads.attach(bytes, ++this.#sample, load.ageMs, this.#telemetryDue);
    this.#telemetryDue = false;
    this.#recorded = true;
    return out;
  }

  #end(status: EndStatus): void {
    this.#ending = status;
    this.#finish();
    if (status.code === 0) this.#call.end();
    else this.#call.emit('error', Object.assign(new Error(status.details), status));
  }

  #finish(): void {
    if (this.#done) return;
    this.#done = true;
    const resolve = this.#drained;
    this.#drained = undefined;
    resolve?.();
    this.#onEnd(this);
  }
}
