import type { Metadata, ServerWritableStream } from '@grpc/grpc-js';
import type { LoggedBatches } from '../../indexer.js';

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
 * reads. A subscription from a seq first catches up from the replay log; live batches arriving
 * meanwhile are held and the ones the replay already covered are skipped, so the peer sees every
 * seq once, in order.
 */
export class Subscriber {
  readonly #call: Call;
  readonly #maxLag: number;
  readonly #onEnd: (sub: Subscriber) => void;
  /** The next seq this peer needs; `null` until the first live batch (a live subscription). */
  #next: bigint | null;
  #catchingUp = false;
  /** Live batches that arrived during catch-up. */
  #held: Array<{ seq: bigint; bytes: Buffer }> = [];
  #heldHead = 0;
  #queue: Buffer[] = [];
  #head = 0;
  /** The stream is above its high-water mark: wait for `drain`. */
  #blocked = false;
  #drained: (() => void) | undefined;
  /** Set once ending: no more batches are taken. */
  #ending: EndStatus | undefined;
  #done = false;
  /** Batches handed to the stream. */
  sent = 0;

  constructor(call: Call, next: bigint | null, maxLag: number, onEnd: (sub: Subscriber) => void) {
    this.#call = call;
    this.#next = next;
    this.#maxLag = maxLag;
    this.#onEnd = onEnd;
    call.on('drain', () => {
      this.#blocked = false;
      this.#pump();
    });
    const gone = () => this.#finish();
    call.on('cancelled', gone);
    call.on('close', gone);
    call.on('error', gone);
  }

  /** Batches waiting for the peer (queued and held). */
  get lag(): number {
    return this.#queue.length - this.#head + this.#held.length - this.#heldHead;
  }

  get done(): boolean {
    return this.#done || this.#ending !== undefined;
  }

  /** Offers a live batch; false when the peer is now further behind than its bound. */
  live(seq: bigint, bytes: Buffer): boolean {
    if (this.done) return true;
    if (this.#catchingUp) {
      this.#held.push({ seq, bytes });
      // Held batches the replay has already sent are no longer waiting.
      while (this.#heldHead < this.#held.length && (this.#held[this.#heldHead]?.seq ?? 0n) < (this.#next ?? 0n)) {
        this.#heldHead++;
      }
    } else {
      this.#enqueue(seq, bytes);
    }
    return this.lag <= this.#maxLag;
  }

  /**
   * Sends the log from the subscription's start seq, then what arrived live meanwhile. `read`
   * returns logged batches from a seq (at most `max`), as `KvEventBatch` bytes.
   */
  async catchUp(read: (start: bigint, max: number) => LoggedBatches): Promise<void> {
    this.#catchingUp = true;
    try {
      while (!this.done) {
        const got = read(this.#next ?? 1n, REPLAY_CHUNK);
        if (got.seqs.length === 0) break;
        for (let i = 0; i < got.seqs.length; i++) this.#enqueue(got.seqs[i] as bigint, got.payloads[i] as Buffer);
        if (this.lag > this.#maxLag) return;
        if (this.#blocked) await new Promise<void>((resolve) => (this.#drained = resolve));
      }
    } finally {
      this.#catchingUp = false;
    }
    for (let i = this.#heldHead; i < this.#held.length && !this.done; i++) {
      const h = this.#held[i] as { seq: bigint; bytes: Buffer };
      this.#enqueue(h.seq, h.bytes);
    }
    this.#held = [];
    this.#heldHead = 0;
  }

  /** Ends the stream now with `status`, dropping what has not been handed to the stream. */
  cut(status: EndStatus): void {
    if (this.done) return;
    this.#queue = [];
    this.#head = 0;
    this.#held = [];
    this.#heldHead = 0;
    this.#end(status);
  }

  /** Ends the stream with `status` once what is queued has been handed to the stream. */
  endAfterQueued(status: EndStatus): void {
    if (this.done) return;
    this.#ending = status;
    this.#pump();
  }

  #enqueue(seq: bigint, bytes: Buffer): void {
    if (this.#next !== null && seq < this.#next) return;
    this.#queue.push(bytes);
    this.#next = seq + 1n;
    this.#pump();
  }

  #pump(): void {
    while (!this.#blocked && this.#head < this.#queue.length && !this.#done) {
      const bytes = this.#queue[this.#head] as Buffer;
      this.#queue[this.#head++] = undefined as unknown as Buffer;
      this.sent++;
      if (!this.#call.write(bytes)) this.#blocked = true;
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
