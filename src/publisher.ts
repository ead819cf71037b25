import type * as Native from '../index.js';
import { type AbortOptions, abortable, openAbortable, runThenAbortable } from './abort.js';
import type { Dialect } from './codec.js';
import { KvPlaneError } from './errors.js';
import type { EventColumns, KvEvent, RemovedEvent, StoredEvent } from './events.js';
import type { LocalIndexer, ZmqFormat } from './indexer.js';
import { withDefaults } from './options.js';
import type { BatchIterationOptions, BatchIterator } from './stream/iterate.js';
import { KvEventStream, type KvStreamEvents } from './stream/stream.js';
import {
  checkCount,
  endpointForRank,
  hwmForBytes,
  KV_EVENTS_DEFAULTS,
  type KvEventsConfig,
  REPLAY_SEND_BUDGET_BYTES,
  shouldBind,
  zmqAddress,
} from './transports/zmq/config.js';
import { curvePublicKey, type ZmqCurveOptions } from './transports/zmq/curve.js';
import { ZmqTransport } from './transports/zmq/transport.js';

export interface KvEventPublisherOptions extends KvEventsConfig {
  /**
   * The engine's DP rank: offsets the tcp ports of `endpoint` and `replayEndpoint` (inproc names
   * get `_dp{rank}`) and is written as the batches' `dp_rank`. Default: none (`dp_rank` nil, worker rank 0).
   */
  dataParallelRank?: number | null;
  /** Tokens per KV block, for the index's token queries. Default 16. */
  blockSize?: number;
  /** This node's worker id in the index. Default `0n`. */
  workerId?: bigint;
  /** Payload format. Default `'vllm'` (vLLM's current msgpack, byte-identical to msgspec). */
  format?: ZmqFormat;
  /** Replay replies carry the topic frame (vLLM ≥ 0.26, TensorRT-LLM). Default `true`; older vLLM and SGLang omit it. */
  replayTopicFrame?: boolean;
  /**
   * Bind the live socket natively (crates/kvplane-zmq: each batch sent as it is logged, off the JS
   * thread) when it binds tcp or ipc without CURVE. Default true; false: zeromq.js always.
   */
  nativeZmq?: boolean;
  /** How long a replay reply may wait on a full peer before that replay is abandoned. Default 30 s. */
  replaySendTimeoutMs?: number;
  /**
   * Bytes one replay peer may have queued before its replay waits on it (and, past
   * `replaySendTimeoutMs`, is abandoned). Default 8 MiB; sized into the ROUTER's HWM as
   * `hwmForBytes` does.
   */
  replaySendBudgetBytes?: number;
  /** Keep block tokens for tree dumps (`/kv_recover`). Default `true`. */
  retainTokens?: boolean;
  /** This incarnation's epoch. Default: random. */
  epoch?: bigint;
  /** The first batch's seq. Default `'clock'` (see `KvEventStreamOptions.firstSeq`). */
  firstSeq?: bigint | 'clock';
  /** Open the stream with `AllBlocksCleared` for its rank. Default `true`. */
  openWithClear?: boolean;
  /**
   * CURVE encryption (and, with `allowedClients`, authentication) on the live and replay sockets
   * (docs/protocol.md#zmq-curve). Default: none, plain ZMQ as vLLM's consumers expect.
   */
  curve?: ZmqCurveOptions | null;
}

export interface PublisherStats {
  /** Events waiting in the publish queue. */
  queued: number;
  /** Events published (in batches on the wire). */
  events: number;
  batches: number;
  lastSeq: bigint;
  /** Drops by reason; `queue_full` events also show as skipped seqs. */
  drops: { queue_full: number; send_failed: number };
  /** Seqs skipped where the queue lost events. */
  gaps: number;
  /** Peers connected to the live socket. */
  subscribers: number;
  /** Replay requests, malformed ones, replays abandoned, requests refused, batches sent, replays in progress. */
  replay: {
    requests: number;
    malformed: number;
    abandoned: number;
    refused: number;
    batchesSent: number;
    /** Of those, copied out of the log (the rest came from the replay cache). */
    batchesCopied: number;
    sessions: number;
  };
  /** Ranks whose source failed closed (unsupported layout), with the reason. */
  failClosed: Array<{ dpRank: number; message: string }>;
  /** CURVE clients refused by `curve.allowedClients` (0 without CURVE). */
  authRefused: number;
  /**
   * Live batches a ZMQ subscriber lost because its queue (`hwm`) was full, summed over
   * subscribers (the native socket counts them; zeromq.js's drops uncounted).
   */
  zmqLiveDropped: number;
  /**
   * The native live socket's subscribers cut off for holding more than 256 distinct subscriptions (or 64 KiB of them),
   * and the connections its listener failed to accept (out of file descriptors; it goes on).
   */
  zmqLiveRefused: { peers: number; acceptErrors: number };
}

/**
 * An engine node's publisher, as vLLM's `ZmqEventPublisher` is configured: a `KvEventStream`
 * (queue, index, replay log, seqs) with the ZMQ transport attached. Other transports (gRPC,
 * HTTP) attach to `stream`. Seqs start at 1; a full queue drops, counts and skips a seq
 * (docs/protocol.md#seqs-and-epochs).
 */
export class KvEventPublisher {
  readonly stream: KvEventStream;
  readonly #zmq: ZmqTransport;
  readonly #curve: ZmqCurveOptions | null;

  private constructor(stream: KvEventStream, zmq: ZmqTransport, curve: ZmqCurveOptions | null) {
    this.stream = stream;
    this.#zmq = zmq;
    this.#curve = curve;
    stream.onClose(() => zmq.close());
  }

  /**
   * Opens the stream and its sockets. `signal` gives up: an abort before the sockets are open
   * rejects with its reason and closes whatever was opened.
   */
  static async create(options: KvEventPublisherOptions & AbortOptions = {}): Promise<KvEventPublisher> {
    return openAbortable(options.signal, () => KvEventPublisher.#create(options));
  }

  static async #create(options: KvEventPublisherOptions): Promise<KvEventPublisher> {
    const o = withDefaults<KvEventsConfig>(KV_EVENTS_DEFAULTS, options);
    const rank = options.dataParallelRank ?? null;
    checkCount('hwm', o.hwm, 2 ** 31 - 1);
    if (options.replaySendBudgetBytes !== undefined)
      checkCount('replaySendBudgetBytes', options.replaySendBudgetBytes, 2 ** 40);
    if (typeof o.topic !== 'string') throw new KvPlaneError('ERR_INVALID_ARG', 'topic must be a string');
    const endpoint = endpointForRank(o.endpoint, rank ?? 0);
    const replayEndpoint = o.replayEndpoint ? endpointForRank(o.replayEndpoint, rank ?? 0) : null;
    const stream = new KvEventStream({
      dataParallelRank: rank,
      blockSize: options.blockSize,
      workerId: options.workerId,
      retainTokens: options.retainTokens,
      bufferSteps: o.bufferSteps,
      epoch: options.epoch,
      format: options.format,
      maxQueueSize: o.maxQueueSize,
      firstSeq: options.firstSeq,
      openWithClear: options.openWithClear,
    });
    try {
      const zmq = await ZmqTransport.create(stream, {
        endpoint: zmqAddress(endpoint),
        bind: shouldBind(endpoint),
        replay:
          replayEndpoint === null
            ? null
            : {
                endpoint: zmqAddress(replayEndpoint),
                bind: shouldBind(replayEndpoint),
                topicFrame: options.replayTopicFrame ?? true,
                sendTimeoutMs: options.replaySendTimeoutMs ?? 30_000,
                hwm: hwmForBytes(options.replaySendBudgetBytes ?? REPLAY_SEND_BUDGET_BYTES),
              },
        topic: o.topic,
        hwm: o.hwm,
        curve: options.curve ?? null,
        native: options.nativeZmq,
      });
      // The opening clear is published before the publisher is handed out: its queue starts empty.
      await stream.flush();
      return new KvEventPublisher(stream, zmq, options.curve ?? null);
    } catch (err) {
      await stream.close();
      throw err;
    }
  }

  /** The stream's `LocalIndexer` (index, replay log, recovery answers). */
  get indexer(): LocalIndexer {
    return this.stream.indexer;
  }

  /** The live endpoint (as bound, with the port the OS chose for `:*`). */
  get endpoint(): string {
    return this.#zmq.endpoint;
  }

  /** The CURVE public key clients connect with (`curveServerKey`), or `null` without CURVE. */
  get curvePublicKey(): string | null {
    return this.#curve ? curvePublicKey(this.#curve.secretKey) : null;
  }

  /** The replay endpoint, or `null` without replay. */
  get replayEndpoint(): string | null {
    return this.#zmq.replayEndpoint;
  }

  get epoch(): bigint {
    return this.stream.epoch;
  }

  /** Events waiting in the publish queue (cheap: never waits on a drain in progress). */
  get queued(): number {
    return this.stream.queued;
  }

  get dataParallelRank(): number | null {
    return this.stream.dataParallelRank;
  }

  /** `KvEventStream.relay`: an engine's encoded payloads from DP rank `dpRank`, relayed at once. */
  relay(payloads: Uint8Array | readonly Uint8Array[], dialect: Dialect, dpRank: number | null): number {
    return this.stream.relay(payloads, dialect, dpRank);
  }

  /** `KvEventStream.relayWithEventIds`: a TensorRT-LLM JSON drain, with event-id continuity per rank. */
  relayWithEventIds(
    bytes: Uint8Array,
    dialect: Dialect,
    nextIds: Map<number, bigint>,
  ): Array<{ dpRank: number; kind: 'gap' | 'restart' }> {
    return this.stream.relayWithEventIds(bytes, dialect, nextIds);
  }

  /** `KvEventStream.followZmq`: an engine rank's live socket relayed natively. */
  followZmq(opts: Native.EngineLinkOptions, onDelivery: (d: Native.ZmqDeliveryOut) => void): Native.NativeZmqLink {
    return this.stream.followZmq(opts, onDelivery);
  }

  /** `KvEventStream.clearRank`: `AllBlocksCleared` for DP rank `dpRank`, at once. */
  clearRank(dpRank: number | null): void {
    this.stream.clearRank(dpRank);
  }

  /** Enqueues events; returns how many were accepted (the rest were dropped and counted). */
  publish(events: readonly KvEvent[]): number {
    return this.#open().publish(events);
  }

  /** Enqueues events given as columns (the bulk path); returns how many were accepted. */
  publishColumns(columns: EventColumns): number {
    return this.#open().publishColumns(columns);
  }

  stored(event: Omit<StoredEvent, 'type'>): number {
    return this.#open().stored(event);
  }

  removed(event: Omit<RemovedEvent, 'type'>): number {
    return this.#open().removed(event);
  }

  cleared(): number {
    return this.#open().cleared();
  }

  /** Ranks whose source failed closed (unsupported layout), with the reason; empty when healthy. */
  get failClosed(): ReadonlyArray<{ dpRank: number; message: string }> {
    return this.stream.failClosed;
  }

  /**
   * Every batch published from now on, as an async iterator (`KvEventStream.batches`):
   * `for await (const { seqs, payloads } of publisher.batches({ signal })) ...`.
   */
  batches(options?: BatchIterationOptions): BatchIterator {
    return this.stream.batches(options);
  }

  /** Listens to the stream's events: `gap`, `drop`, `failClosed` (`KvStreamEvents`). */
  on<K extends keyof KvStreamEvents>(event: K, listener: (...args: KvStreamEvents[K]) => void): this {
    this.stream.on(event, listener as never);
    return this;
  }

  once<K extends keyof KvStreamEvents>(event: K, listener: (...args: KvStreamEvents[K]) => void): this {
    this.stream.once(event, listener as never);
    return this;
  }

  off<K extends keyof KvStreamEvents>(event: K, listener: (...args: KvStreamEvents[K]) => void): this {
    this.stream.off(event, listener as never);
    return this;
  }

  /** Publishes everything queued and resolves once it is on the socket. */
  async flush(options: AbortOptions = {}): Promise<void> {
    await abortable(options.signal, async () => {
      await this.stream.flush();
      await this.#zmq.flushed();
    });
  }

  stats(): PublisherStats {
    const s = this.stream.stats();
    return {
      queued: s.queued,
      events: s.events,
      batches: s.batches,
      lastSeq: s.lastSeq,
      drops: { queue_full: s.queueFull, send_failed: this.#zmq.sendFailed },
      gaps: s.gaps,
      subscribers: this.#zmq.subscribers,
      replay: this.#zmq.replayCounters,
      failClosed: [...this.stream.failClosed],
      authRefused: this.#zmq.authRefused,
      zmqLiveDropped: this.#zmq.dropped,
      zmqLiveRefused: this.#zmq.refused,
    };
  }

  get closed(): boolean {
    return this.stream.closed;
  }

  /**
   * Publishes what is queued, sends it, then closes the sockets and the index (`signal`: stop
   * waiting; the close goes on).
   */
  async close(options: AbortOptions = {}): Promise<void> {
    if (this.stream.closed) return;
    await runThenAbortable(options.signal, () => this.stream.close());
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** The stream, while the publisher is open. */
  #open(): KvEventStream {
    if (this.stream.closed) throw new KvPlaneError('ERR_CLOSED', 'the KvEventPublisher is closed');
    return this.stream;
  }
}
