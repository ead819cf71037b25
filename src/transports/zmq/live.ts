import type { Publisher } from 'zeromq';
import type * as Native from '../../../index.js';
import type { KvEventStream } from '../../stream/stream.js';
import { SocketWriter, seqFrame } from './writer.js';

/** How long the live socket may go on writing its queue once closed. */
export const CLOSE_LINGER_MS = 1000;

/** The live PUB socket of the ZMQ transport. */
export interface LiveSocket {
  /** As bound (with the port the OS chose for `:*`), or as connected. */
  readonly endpoint: string;
  /** Peers connected. */
  readonly subscribers: number;
  /** Sends that failed (each one a lost batch for the peers). */
  readonly sendFailed: number;
  /** Messages a peer lost because its queue was full (its seq gap), where counted. */
  readonly dropped: number;
  /** Peers cut off for holding too many subscriptions, and connections the listener failed to accept (native socket only). */
  readonly refused: { peers: number; acceptErrors: number };
  /** Resolves once every batch handed over is with the socket. */
  flushed(): Promise<void>;
  /** Gives the socket `CLOSE_LINGER_MS` to write what it queues, then closes it. */
  close(): Promise<void>;
}

/**
 * The live socket bound natively (crates/kvplane-zmq): each batch is queued for its subscribers
 * as it is logged, under the index's lock, whichever thread publishes it (a native engine link's
 * included): nothing per batch on the JS thread. A subscriber more than the HWM behind loses
 * batches (counted: `dropped`) and sees the seq gap.
 */
export class NativeLive implements LiveSocket {
  readonly #pub: Native.NativeZmqPublisher;

  constructor(pub: Native.NativeZmqPublisher) {
    this.#pub = pub;
  }

  get endpoint(): string {
    return this.#pub.endpoint;
  }

  get subscribers(): number {
    return this.#pub.stats().peers;
  }

  get sendFailed(): number {
    return 0;
  }

  get dropped(): number {
    return this.#pub.stats().dropped;
  }

  get refused(): { peers: number; acceptErrors: number } {
    const s = this.#pub.stats();
    return { peers: s.refusedPeers, acceptErrors: s.acceptErrors };
  }

  /** Batches are with the socket as soon as they are logged. */
  flushed(): Promise<void> {
    return Promise.resolve();
  }

  async close(): Promise<void> {
    const until = Date.now() + CLOSE_LINGER_MS;
    while (this.#pub.stats().queued > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
    this.#pub.close();
  }
}

/** The live socket as zeromq.js's Publisher (CURVE, or an endpoint that connects). */
export class ZmqjsLive implements LiveSocket {
  readonly #pub: Publisher;
  readonly #writer: SocketWriter;
  readonly #endpoint: string;
  readonly #bind: boolean;
  #sendFailed = 0;
  #subscribers = 0;

  constructor(stream: KvEventStream, pub: Publisher, endpoint: string, bind: boolean, topic: string) {
    this.#pub = pub;
    this.#endpoint = endpoint;
    this.#bind = bind;
    this.#writer = new SocketWriter(pub, () => {
      this.#sendFailed++;
    });
    const t = Buffer.from(topic, 'utf8');
    stream.consume(stream.logFormat, ({ seqs, payloads }) => {
      for (let i = 0; i < seqs.length; i++) {
        this.#writer.push([t, seqFrame(seqs[i] as bigint), payloads[i] as Buffer]);
      }
    });
    void this.#watch();
  }

  get endpoint(): string {
    return this.#bind ? (this.#pub.lastEndpoint ?? this.#endpoint) : this.#endpoint;
  }

  get subscribers(): number {
    return this.#subscribers;
  }

  get sendFailed(): number {
    return this.#sendFailed;
  }

  /** libzmq drops at the HWM without telling. */
  get dropped(): number {
    return 0;
  }

  /** libzmq caps neither, and counts neither. */
  get refused(): { peers: number; acceptErrors: number } {
    return { peers: 0, acceptErrors: 0 };
  }

  flushed(): Promise<void> {
    return this.#writer.flushed();
  }

  /**
   * The socket runs with linger 0 (a slow subscriber never holds anything up); at close it gets
   * `CLOSE_LINGER_MS` to write what it still queues, which it would otherwise drop.
   */
  async close(): Promise<void> {
    await this.#writer.flushed();
    this.#pub.linger = CLOSE_LINGER_MS;
    this.#pub.close();
  }

  async #watch(): Promise<void> {
    try {
      for await (const ev of this.#pub.events) {
        if (ev.type === 'accept' || ev.type === 'connect') this.#subscribers++;
        else if (ev.type === 'disconnect') this.#subscribers = Math.max(0, this.#subscribers - 1);
        else if (ev.type === 'end') break;
      }
    } catch {
      // The socket closed.
    }
  }
}
