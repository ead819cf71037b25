import { Router } from 'zeromq';
import type { LocalIndexer } from '../../indexer.js';
import { END_OF_REPLAY, SocketWriter, seqFrame } from './writer.js';

export interface ReplayServerOptions {
  /** ROUTER endpoint, bound or connected by vLLM's rule. */
  endpoint: string;
  bind: boolean;
  indexer: LocalIndexer;
  topic: Buffer;
  /** Send the topic frame in replies (vLLM ≥ 0.26, TensorRT-LLM); older vLLM and SGLang omit it. */
  topicFrame: boolean;
  /** How long a reply may wait on a full peer (its HWM) before the replay is abandoned. */
  sendTimeoutMs: number;
  hwm: number;
  /** CURVE socket options (`curveServerOptions`), or none. */
  curve?: object;
}

const EMPTY = Buffer.alloc(0);
/** Batches fetched from the log per native call (each session holds one chunk's copies). */
const CHUNK = 8;

/** Counters of the replay socket. */
export interface ReplayCounters {
  requests: number;
  /** Requests that were not `[empty, 8-byte seq]` (answered with the end marker alone). */
  malformed: number;
  /** Replays abandoned: the peer left or stayed full past the send timeout. */
  abandoned: number;
  batchesSent: number;
}

/**
 * The replay ROUTER (docs/protocol.md#zmq-replay): for `[identity, "", start]` it sends every retained batch with
 * seq ≥ start as `[identity, "", topic?, seq, payload]`, then the end marker (seq eight 0xff, empty
 * payload). A malformed request gets the end marker alone. Replies go through ROUTER_MANDATORY, so a full peer is waited for, never silently
 * skipped; replay runs on its own socket and never holds up the live stream.
 */
export class ReplayServer {
  readonly #router: Router;
  readonly #writer: SocketWriter;
  readonly #opts: ReplayServerOptions;
  readonly #prefix: Buffer[];
  readonly counters: ReplayCounters = { requests: 0, malformed: 0, abandoned: 0, batchesSent: 0 };
  #loop: Promise<void> = Promise.resolve();
  #sessions = new Set<Promise<void>>();

  private constructor(router: Router, opts: ReplayServerOptions) {
    this.#router = router;
    this.#opts = opts;
    this.#prefix = opts.topicFrame ? [opts.topic] : [];
    this.#writer = new SocketWriter(router, () => {
      this.counters.abandoned++;
    });
  }

  static async create(opts: ReplayServerOptions): Promise<ReplayServer> {
    const router = new Router({
      mandatory: true,
      sendTimeout: opts.sendTimeoutMs,
      sendHighWaterMark: opts.hwm,
      linger: 0,
      ...opts.curve,
    });
    if (opts.bind) await router.bind(opts.endpoint);
    else router.connect(opts.endpoint);
    const server = new ReplayServer(router, opts);
    server.#loop = server.#receive();
    return server;
  }

  /** Replays in progress (each holds at most its send budget in the socket). */
  get sessions(): number {
    return this.#sessions.size;
  }

  /** The endpoint as bound (with the port the OS chose for `:*`). */
  get endpoint(): string {
    return this.#opts.bind ? (this.#router.lastEndpoint ?? this.#opts.endpoint) : this.#opts.endpoint;
  }

  async #receive(): Promise<void> {
    try {
      for await (const frames of this.#router) {
        const id = frames[0] as Buffer;
        const start = frames[frames.length - 1] as Buffer;
        const wellFormed =
          (frames.length === 3 && (frames[1] as Buffer).length === 0 && start.length === 8) ||
          (frames.length === 2 && start.length === 8);
        this.counters.requests++;
        if (!wellFormed) {
          // Every request gets an answer, so a REQ peer is never left waiting: an empty replay.
          this.counters.malformed++;
          this.#writer.push([id, EMPTY, ...this.#prefix, END_OF_REPLAY, EMPTY]);
          continue;
        }
        const session = this.#replay(id, start.readBigUInt64BE()).finally(() => this.#sessions.delete(session));
        this.#sessions.add(session);
      }
    } catch (err) {
      if (!this.#router.closed) throw err;
    }
  }

  async #replay(id: Buffer, start: bigint): Promise<void> {
    const ix = this.#opts.indexer;
    // Replay up to the newest batch at the time of the request; live batches after it are the
    // live stream's.
    const last = ix.lastSeq;
    let next = start;
    try {
      while (next <= last) {
        const { seqs, payloads } = ix.replay(next, CHUNK);
        if (seqs.length === 0) break;
        for (let i = 0; i < seqs.length; i++) {
          const seq = seqs[i] as bigint;
          if (seq > last) break;
          await this.#writer.send([id, EMPTY, ...this.#prefix, seqFrame(seq), payloads[i] as Buffer]);
          this.counters.batchesSent++;
        }
        next = (seqs[seqs.length - 1] as bigint) + 1n;
      }
      await this.#writer.send([id, EMPTY, ...this.#prefix, END_OF_REPLAY, EMPTY]);
    } catch {
      this.counters.abandoned++;
    }
  }

  async close(): Promise<void> {
    this.#router.close();
    await Promise.allSettled([this.#loop, ...this.#sessions]);
  }
}
