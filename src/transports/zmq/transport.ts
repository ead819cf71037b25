import type { Publisher } from 'zeromq';
import { bindOrThrow, KvPlaneError } from '../../errors.js';
import { zeromq } from '../../optional.js';
import type { KvEventStream } from '../../stream/stream.js';
import { curveServerOptions, type ZmqCurveOptions, zapHandler } from './curve.js';
import { type LiveSocket, NativeLive, ZmqjsLive } from './live.js';
import { noReplays, type ReplayCounters, ReplayServer } from './replay.js';

export interface ZmqTransportOptions {
  /** Live endpoint, already offset for the DP rank. */
  endpoint: string;
  /** Bind (else connect) the live endpoint. */
  bind: boolean;
  /** Replay ROUTER endpoint, already offset for the DP rank; `null` for no replay. */
  replay: { endpoint: string; bind: boolean; topicFrame: boolean; sendTimeoutMs: number; hwm: number } | null;
  topic: string;
  /** Send high-water mark of the live socket, per subscriber, in messages. */
  hwm: number;
  /** CURVE for both sockets; `null` for plain ZMQ. */
  curve: ZmqCurveOptions | null;
  /**
   * Bind the live socket natively (crates/kvplane-zmq) when it binds tcp or ipc without CURVE.
   * Default true; false uses zeromq.js's Publisher always.
   */
  native?: boolean;
}

/**
 * vLLM's ZMQ transport (docs/protocol.md#vllm-and-sglang-zmq-stream): sends every batch of the
 * stream's log format as `[topic, seq (u64 BE), payload]` on a PUB socket, and serves replay
 * from the log on a ROUTER (docs/protocol.md#zmq-replay).
 */
export class ZmqTransport {
  readonly #live: LiveSocket;
  readonly #replay: ReplayServer | null;
  readonly #zapDomain: string | null;

  private constructor(live: LiveSocket, replay: ReplayServer | null, zapDomain: string | null) {
    this.#live = live;
    this.#zapDomain = zapDomain;
    this.#replay = replay;
  }

  /** Opens the sockets; the stream's batches go out from then on. */
  static async create(stream: KvEventStream, opts: ZmqTransportOptions): Promise<ZmqTransport> {
    let zapDomain: string | null = null;
    let live: LiveSocket | null = null;
    let pub: Publisher | undefined;
    let replay: ReplayServer | null = null;
    try {
      let curve = {};
      if (opts.curve) {
        curveServerOptions(opts.curve, ''); // a bad key fails before anything is registered
        zapDomain = await zapHandler.register(opts.curve.allowedClients ?? null);
        curve = curveServerOptions(opts.curve, zapDomain);
      }
      if (opts.bind && opts.curve === null && opts.native !== false) {
        const n = await bindOrThrow('the ZMQ publisher', opts.endpoint, async () =>
          stream.indexer.bindZmqLive(opts.endpoint, opts.topic, opts.hwm),
        );
        if (n !== null) live = new NativeLive(n);
      }
      if (live === null) {
        pub = new (zeromq().Publisher)({ sendHighWaterMark: opts.hwm, linger: 0, ...curve });
        const p = pub;
        if (opts.bind) await bindOrThrow('the ZMQ publisher', opts.endpoint, () => p.bind(opts.endpoint));
        else pub.connect(opts.endpoint);
        live = new ZmqjsLive(stream, pub, opts.endpoint, opts.bind, opts.topic);
      }
      if (opts.replay !== null) {
        replay = await ReplayServer.create({
          endpoint: opts.replay.endpoint,
          bind: opts.replay.bind,
          indexer: stream.indexer,
          topic: Buffer.from(opts.topic, 'utf8'),
          topicFrame: opts.replay.topicFrame,
          sendTimeoutMs: opts.replay.sendTimeoutMs,
          hwm: opts.replay.hwm,
          curve,
        });
      }
      return new ZmqTransport(live, replay, zapDomain);
    } catch (err) {
      if (live !== null) await live.close();
      else pub?.close();
      await replay?.close();
      if (zapDomain !== null) zapHandler.unregister(zapDomain);
      if (err instanceof KvPlaneError) throw err;
      throw new KvPlaneError('ERR_INVALID_ARG', `cannot open ${opts.endpoint}: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  /** The live endpoint (as bound, with the port the OS chose for `:*`). */
  get endpoint(): string {
    return this.#live.endpoint;
  }

  /** The replay endpoint, or `null` without replay. */
  get replayEndpoint(): string | null {
    return this.#replay?.endpoint ?? null;
  }

  /** Peers connected to the live socket. */
  get subscribers(): number {
    return this.#live.subscribers;
  }

  /** Live sends that failed (each one a lost batch for the peers). */
  get sendFailed(): number {
    return this.#live.sendFailed;
  }

  /** Live batches a subscriber lost because its queue was full (the native socket counts them). */
  get dropped(): number {
    return this.#live.dropped;
  }

  /** The live socket's peers cut off for too many subscriptions, and its failed accepts. */
  get refused(): { peers: number; acceptErrors: number } {
    return this.#live.refused;
  }

  get replayCounters(): ReplayCounters & { sessions: number } {
    const counters = this.#replay?.counters ?? noReplays();
    return { ...counters, sessions: this.#replay?.sessions ?? 0 };
  }

  /** Resolves once every batch handed to the socket is sent. */
  flushed(): Promise<void> {
    return this.#live.flushed();
  }

  /** CURVE clients refused by the allow-list (0 without CURVE). */
  get authRefused(): number {
    return this.#zapDomain === null ? 0 : zapHandler.refused(this.#zapDomain);
  }

  /** Sends what the stream handed over (it has drained by now), then closes the sockets. */
  async close(): Promise<void> {
    await this.#live.flushed();
    await this.#replay?.close();
    await this.#live.close();
    if (this.#zapDomain !== null) zapHandler.unregister(this.#zapDomain);
  }
}
