import type { Publisher } from 'zeromq';
import { bindOrThrow, KvPlaneError } from '../../errors.js';
import { zeromq } from '../../optional.js';
import type { KvEventStream } from '../../stream/stream.js';
import { curveServerOptions, type ZmqCurveOptions, zapHandler } from './curve.js';
import { noReplays, type ReplayCounters, ReplayServer } from './replay.js';
import { SocketWriter, seqFrame } from './writer.js';

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
}

/** How long the live socket may go on writing its queue once closed. */
const CLOSE_LINGER_MS = 1000;

/**
 * vLLM's ZMQ transport (docs/protocol.md#vllm-and-sglang-zmq-stream): sends every batch of the
 * stream's log format as `[topic, seq (u64 BE), payload]` on a PUB socket, and serves replay
 * from the log on a ROUTER (docs/protocol.md#zmq-replay).
 */
export class ZmqTransport {
  readonly #pub: Publisher;
  readonly #writer: SocketWriter;
  readonly #replay: ReplayServer | null;
  readonly #endpoint: string;
  readonly #bind: boolean;
  readonly #zapDomain: string | null;
  #sendFailed = 0;
  #subscribers = 0;

  private constructor(
    stream: KvEventStream,
    pub: Publisher,
    replay: ReplayServer | null,
    opts: ZmqTransportOptions,
    zapDomain: string | null,
  ) {
    this.#pub = pub;
    this.#zapDomain = zapDomain;
    this.#replay = replay;
    this.#endpoint = opts.endpoint;
    this.#bind = opts.bind;
    this.#writer = new SocketWriter(pub, () => {
      this.#sendFailed++;
    });
    const topic = Buffer.from(opts.topic, 'utf8');
    stream.consume(stream.logFormat, ({ seqs, payloads }) => {
      for (let i = 0; i < seqs.length; i++) {
        this.#writer.push([topic, seqFrame(seqs[i] as bigint), payloads[i] as Buffer]);
      }
    });
    void this.#watch();
  }

  /** Opens the sockets; the stream's batches go out from then on. */
  static async create(stream: KvEventStream, opts: ZmqTransportOptions): Promise<ZmqTransport> {
    let zapDomain: string | null = null;
    let pub: Publisher | undefined;
    let replay: ReplayServer | null = null;
    try {
      let curve = {};
      if (opts.curve) {
        curveServerOptions(opts.curve, ''); // a bad key fails before anything is registered
        zapDomain = await zapHandler.register(opts.curve.allowedClients ?? null);
        curve = curveServerOptions(opts.curve, zapDomain);
      }
      pub = new (zeromq().Publisher)({ sendHighWaterMark: opts.hwm, linger: 0, ...curve });
      const p = pub;
      if (opts.bind) await bindOrThrow('the ZMQ publisher', opts.endpoint, () => p.bind(opts.endpoint));
      else pub.connect(opts.endpoint);
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
      return new ZmqTransport(stream, pub, replay, opts, zapDomain);
    } catch (err) {
      pub?.close();
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
    return this.#bind ? (this.#pub.lastEndpoint ?? this.#endpoint) : this.#endpoint;
  }

  /** The replay endpoint, or `null` without replay. */
  get replayEndpoint(): string | null {
    return this.#replay?.endpoint ?? null;
  }

  /** Peers connected to the live socket. */
  get subscribers(): number {
    return this.#subscribers;
  }

  /** Live sends that failed (each one a lost batch for the peers). */
  get sendFailed(): number {
    return this.#sendFailed;
  }

  get replayCounters(): ReplayCounters & { sessions: number } {
    const counters = this.#replay?.counters ?? noReplays();
    return { ...counters, sessions: this.#replay?.sessions ?? 0 };
  }

  /** Resolves once every batch handed to the socket is sent. */
  flushed(): Promise<void> {
    return this.#writer.flushed();
  }

  /** CURVE clients refused by the allow-list (0 without CURVE). */
  get authRefused(): number {
    return this.#zapDomain === null ? 0 : zapHandler.refused(this.#zapDomain);
  }

  /**
   * Sends what the stream handed over (it has drained by now), then closes the sockets. The live
   * socket runs with linger 0 (a slow subscriber never holds anything up); at close it gets
   * `CLOSE_LINGER_MS` to write what it still queues, which it would otherwise drop.
   */
  async close(): Promise<void> {
    await this.#writer.flushed();
    await this.#replay?.close();
    this.#pub.linger = CLOSE_LINGER_MS;
    this.#pub.close();
    if (this.#zapDomain !== null) zapHandler.unregister(this.#zapDomain);
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
