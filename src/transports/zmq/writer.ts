/** What a zeromq.js socket offers for sending. */
export interface Sender {
  send(frames: Buffer[]): Promise<void>;
}

interface Pending {
  frames: Buffer[];
  done?: (err?: unknown) => void;
}

/**
 * The one writer of a socket: zeromq.js allows a single pending `send` per socket, so every
 * message goes through this queue and one loop sends them in order.
 */
export class SocketWriter {
  readonly #socket: Sender;
  readonly #onError: (err: unknown) => void;
  #queue: Pending[] = [];
  #head = 0;
  #running = false;
  #idle: Array<() => void> = [];

  constructor(socket: Sender, onError: (err: unknown) => void) {
    this.#socket = socket;
    this.#onError = onError;
  }

  /** Queues a message; failures go to `onError`. */
  push(frames: Buffer[]): void {
    this.#queue.push({ frames });
    this.#kick();
  }

  /** Queues a message and resolves once it is sent (rejects if the send fails). */
  send(frames: Buffer[]): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ frames, done: (err) => (err === undefined ? resolve() : reject(err)) });
      this.#kick();
    });
  }

  /** Messages waiting. */
  get pending(): number {
    return this.#queue.length - this.#head;
  }

  /** Resolves when every queued message has been handed to the socket. */
  flushed(): Promise<void> {
    if (!this.#running && this.pending === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  #kick(): void {
    if (!this.#running) void this.#run();
  }

  async #run(): Promise<void> {
    this.#running = true;
    while (this.#head < this.#queue.length) {
      const m = this.#queue[this.#head] as Pending;
      this.#queue[this.#head] = undefined as unknown as Pending;
      this.#head++;
      if (this.#head > 1024 && this.#head * 2 > this.#queue.length) {
        this.#queue = this.#queue.slice(this.#head);
        this.#head = 0;
      }
      try {
        await this.#socket.send(m.frames);
        m.done?.();
      } catch (err) {
        if (m.done) m.done(err);
        else this.#onError(err);
      }
    }
    this.#running = false;
    for (const resolve of this.#idle.splice(0)) resolve();
  }
}

/** A seq as the 8-byte big-endian frame of vLLM's wire format. */
export function seqFrame(seq: bigint): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(seq);
  return b;
}

/** The replay end marker's seq frame: eight 0xff bytes. */
export const END_OF_REPLAY = Buffer.alloc(8, 0xff);
