import { Publisher } from 'zeromq';
import { callNative, KvPlaneError } from '../errors.js';
import { columnArgs, type EventColumns, type KvEvent, type RemovedEvent, type StoredEvent } from '../events.js';
import { LocalIndexer, type ZmqFormat } from '../indexer.js';
import native from '../native.js';
import { withDefaults } from '../options.js';
import { checkCount, endpointForRank, KV_EVENTS_DEFAULTS, type KvEventsConfig, shouldBind } from './config.js';
import { ReplayServer } from './replay.js';
import { SocketWriter, seqFrame } from './writer.js';

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
  /** How long a replay reply may wait on a full peer before that replay is abandoned. Default 30 s. */
  replaySendTimeoutMs?: number;
  /** Keep block tokens for tree dumps (`/kv_recover`). Default `true`. */
  retainTokens?: boolean;
  /** This incarnation's epoch. Default: random. */
  epoch?: bigint;
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
  replay: { requests: number; malformed: number; abandoned: number; batchesSent: number };
  /** Ranks whose source failed closed (unsupported layout), with the reason. */
  failClosed: Array<{ dpRank: number; message: string }>;
}

/** Most events one drain cycle takes (it holds the index lock while it applies them). */
const EVENTS_PER_CYCLE = 16 * 1024;

/** Batches one drain cycle published, in seq order. */
export interface PublishedBatches {
  seqs: BigUint64Array;
  /** The payloads as sent on the ZMQ stream. */
  payloads: Buffer[];
  /** The same batches as SMG protobuf `KvEventBatch`es, once `enableProtoStream()` was called. */
  protoPayloads: Buffer[];
}

type Listener = (batches: PublishedBatches) => void;

/**
 * Publishes one numbered KV event stream (spec §3.1, §6): `publish()` enqueues and returns at
 * once; each drain cycle packs batches of at most 1024 events, encodes each once in Rust, applies
 * it to the `LocalIndexer` (replay log + tree dumps) and sends `[topic, seq, payload]` on a ZMQ
 * PUB socket. Seqs start at 1; a full queue drops, counts and skips a seq.
 */
export class KvEventPublisher {
  readonly indexer: LocalIndexer;
  readonly #queue: native.NativeEventQueue;
  readonly #pub: Publisher;
  readonly #writer: SocketWriter;
  readonly #replay: ReplayServer | null;
  readonly #topic: Buffer;
  readonly #rank: number | null;
  readonly #endpoint: string;
  readonly #bind: boolean;
  readonly #listeners = new Set<Listener>();
  #scheduled = false;
  #inFlight: Promise<void> | undefined;
  #closed = false;
  #events = 0;
  #batches = 0;
  #gaps = 0;
  #sendFailed = 0;
  #subscribers = 0;
  readonly #failClosed = new Map<number, string>();

  private constructor(
    indexer: LocalIndexer,
    queue: native.NativeEventQueue,
    pub: Publisher,
    replay: ReplayServer | null,
    topic: string,
    rank: number | null,
    endpoint: string,
    bind: boolean,
  ) {
    this.indexer = indexer;
    this.#queue = queue;
    this.#pub = pub;
    this.#replay = replay;
    this.#topic = Buffer.from(topic, 'utf8');
    this.#rank = rank;
    this.#endpoint = endpoint;
    this.#bind = bind;
    this.#writer = new SocketWriter(pub, () => {
      this.#sendFailed++;
    });
    void this.#watch();
  }

  static async create(options: KvEventPublisherOptions = {}): Promise<KvEventPublisher> {
    const o = withDefaults<KvEventsConfig>(KV_EVENTS_DEFAULTS, options);
    const rank = options.dataParallelRank ?? null;
    checkCount('hwm', o.hwm, 2 ** 31 - 1);
    if (typeof o.topic !== 'string') throw new KvPlaneError('ERR_INVALID_ARG', 'topic must be a string');
    const endpoint = endpointForRank(o.endpoint, rank ?? 0);
    const replayEndpoint = o.replayEndpoint ? endpointForRank(o.replayEndpoint, rank ?? 0) : null;
    const indexer = new LocalIndexer({
      blockSize: options.blockSize ?? 16,
      workerId: options.workerId,
      retainTokens: options.retainTokens,
      bufferSteps: o.bufferSteps,
      epoch: options.epoch,
      logFormat: options.format,
    });
    const queue = callNative(() => new native.NativeEventQueue(o.maxQueueSize));
    const pub = new Publisher({ sendHighWaterMark: o.hwm, linger: 0 });
    let replay: ReplayServer | null = null;
    try {
      const bind = shouldBind(endpoint);
      if (bind) await pub.bind(endpoint);
      else pub.connect(endpoint);
      if (replayEndpoint !== null) {
        replay = await ReplayServer.create({
          endpoint: replayEndpoint,
          bind: shouldBind(replayEndpoint),
          indexer,
          topic: Buffer.from(o.topic, 'utf8'),
          topicFrame: options.replayTopicFrame ?? true,
          sendTimeoutMs: options.replaySendTimeoutMs ?? 30_000,
          hwm: o.hwm,
        });
      }
      return new KvEventPublisher(indexer, queue, pub, replay, o.topic, rank, endpoint, bind);
    } catch (err) {
      pub.close();
      await replay?.close();
      indexer.close();
      throw new KvPlaneError('ERR_INVALID_ARG', `cannot open ${endpoint}: ${(err as Error).message}`, { cause: err });
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

  get epoch(): bigint {
    return this.indexer.epoch;
  }

  /** Events waiting in the publish queue (cheap: never waits on a drain in progress). */
  get queued(): number {
    return this.#closed ? 0 : this.#queue.length;
  }

  get dataParallelRank(): number | null {
    return this.#rank;
  }

  /** Enqueues events; returns how many were accepted (the rest were dropped and counted). */
  publish(events: readonly KvEvent[]): number {
    this.#open();
    const n = callNative(() => this.#queue.pushEvents(events));
    this.#schedule();
    return n;
  }

  /** Enqueues events given as columns (the bulk path); returns how many were accepted. */
  publishColumns(columns: EventColumns): number {
    this.#open();
    const n = callNative(() => this.#queue.pushColumns(...columnArgs(columns)));
    this.#schedule();
    return n;
  }

  stored(event: Omit<StoredEvent, 'type'>): number {
    return this.publish([{ type: 'stored', ...event }]);
  }

  removed(event: Omit<RemovedEvent, 'type'>): number {
    return this.publish([{ type: 'removed', ...event }]);
  }

  cleared(): number {
    return this.publish([{ type: 'cleared' }]);
  }

  /**
   * Calls `listener` with every batch published from now on (seqs and the encoded payloads, as
   * sent), after the ZMQ send is queued; returns a function that removes it.
   */
  onBatches(listener: Listener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * Also encodes every batch published from now on as SMG protobuf, once per batch, for gRPC
   * subscribers (`PublishedBatches.protoPayloads`).
   */
  enableProtoStream(): void {
    this.#open();
    this.indexer.setFormat('smg_proto', true);
  }

  /** Ranks whose source failed closed (unsupported layout), with the reason; empty when healthy. */
  get failClosed(): ReadonlyArray<{ dpRank: number; message: string }> {
    return [...this.#failClosed].map(([dpRank, message]) => ({ dpRank, message }));
  }

  /** Publishes everything queued and resolves once it is on the socket. */
  async flush(): Promise<void> {
    while (!this.#closed && (this.#inFlight || this.#queue.length > 0)) {
      if (this.#inFlight) await this.#inFlight;
      else this.#drainNow();
    }
    await this.#writer.flushed();
  }

  stats(): PublisherStats {
    return {
      queued: this.#closed ? 0 : this.#queue.length,
      events: this.#events,
      batches: this.#batches,
      lastSeq: this.#closed ? 0n : this.indexer.lastSeq,
      drops: { queue_full: this.#queue.dropped, send_failed: this.#sendFailed },
      gaps: this.#gaps,
      subscribers: this.#subscribers,
      replay: { ...(this.#replay?.counters ?? { requests: 0, malformed: 0, abandoned: 0, batchesSent: 0 }) },
      failClosed: [...this.failClosed],
    };
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Publishes what is queued, then closes the sockets and the index. */
  async close(): Promise<void> {
    if (this.#closed) return;
    await this.flush();
    this.#closed = true;
    await this.#replay?.close();
    this.#pub.close();
    this.indexer.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #open(): void {
    if (this.#closed) throw new KvPlaneError('ERR_CLOSED', 'the KvEventPublisher is closed');
  }

  #schedule(): void {
    if (this.#scheduled || this.#inFlight) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      if (!this.#closed && !this.#inFlight) this.#drainNow();
    });
  }

  /** One drain cycle off the JS thread; the next starts when it is done (seqs stay in order). */
  #drainNow(): void {
    const cycle = this.indexer
      .drainAsync(this.#queue, EVENTS_PER_CYCLE, Date.now() / 1000, this.#rank)
      .then(
        (out) => this.#sent(out),
        () => {
          // Only a closed index fails here; close() has already published what it could.
        },
      )
      .finally(() => {
        this.#inFlight = undefined;
        if (!this.#closed && this.#queue.length > 0) this.#schedule();
      });
    this.#inFlight = cycle;
  }

  #sent(out: native.PublishedOut): void {
    this.#events += out.events;
    this.#batches += out.seqs.length;
    this.#gaps += out.gaps;
    // Events that failed closed (ERR_UNSUPPORTED_LAYOUT) went out as a clear of the rank.
    for (const e of out.errors) this.#failClosed.set(this.#rank ?? 0, e.message);
    const payloads = out.encodings[0]?.payloads ?? [];
    for (let i = 0; i < out.seqs.length; i++) {
      this.#writer.push([this.#topic, seqFrame(out.seqs[i] as bigint), payloads[i] as Buffer]);
    }
    if (this.#listeners.size > 0) {
      const protoPayloads = out.encodings.find((e) => e.format === 'smg_proto')?.payloads ?? [];
      const batches = { seqs: out.seqs, payloads, protoPayloads };
      for (const l of this.#listeners) l(batches);
    }
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
