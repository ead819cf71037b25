import { EventEmitter } from 'node:events';
import type * as Native from '../../index.js';
import { type AbortOptions, abortable, runThenAbortable } from '../abort.js';
import type { Dialect, EncodeFormat } from '../codec.js';
import { KvPlaneError } from '../errors.js';
import type { EventColumns, KvEvent, RemovedEvent, StoredEvent } from '../events.js';
import { LocalIndexer, type ZmqFormat } from '../indexer.js';
import { type BatchConsumer, batchesIn } from './batches.js';
import { DrainScheduler } from './drain.js';
import { type BatchIterationOptions, type BatchIterator, iterateBatches } from './iterate.js';
import { EventQueue } from './queue.js';

/** How often a stream with no consumer takes up what its links relayed (its counts, its events). */
const LAZY_TAKE_MS = 10;

export interface KvEventStreamOptions {
  /** The engine's DP rank, written as the batches' `dp_rank`. Default: none (`dp_rank` nil, worker rank 0). */
  dataParallelRank?: number | null;
  /** Tokens per KV block, for the index's token queries. Default 16. */
  blockSize?: number;
  /** This node's worker id in the index. Default `0n`. */
  workerId?: bigint;
  /** The log's format: what replay serves and the ZMQ stream carries. Default `'vllm'`. */
  format?: ZmqFormat;
  /** Keep block tokens for tree dumps (`/kv_recover`). Default `true`. */
  retainTokens?: boolean;
  /** This incarnation's epoch. Default: random. */
  epoch?: bigint;
  /** Batches the replay log keeps. Default: the LocalIndexer's. */
  bufferSteps?: number;
  /** Events the publish queue holds before it drops. Default: the queue's. */
  maxQueueSize?: number;
  /**
   * The first batch's seq. Default `'clock'`: above every seq an earlier incarnation can have
   * issued, so a cursor from before a restart is always expired (docs/protocol.md#restarts).
   */
  firstSeq?: bigint | 'clock';
  /**
   * Open the stream with `AllBlocksCleared` for its rank, so a consumer that kept an earlier
   * incarnation's state drops it. Default `true`.
   */
  openWithClear?: boolean;
}

export interface StreamStats {
  /** Events waiting in the publish queue. */
  queued: number;
  /** Events published (in batches). */
  events: number;
  batches: number;
  lastSeq: bigint;
  /** Events the full queue dropped; they also show as skipped seqs. */
  queueFull: number;
  /** Seqs skipped where the queue lost events. */
  gaps: number;
}

interface Consumer {
  format: EncodeFormat;
  fn: BatchConsumer;
}

/** What a stream tells its listeners (`stream.on(...)`, and the same on a publisher). */
export interface KvStreamEvents {
  /** `count` seqs were skipped before `seq`: events the full queue dropped, a gap downstream. */
  gap: [{ seq: bigint; count: number }];
  /** Events a full publish queue refused (also counted in `stats().queueFull`). */
  drop: [{ reason: 'queue_full'; events: number }];
  /** A rank's events failed closed (unsupported layout): the rank went out as cleared. */
  failClosed: [{ dpRank: number; message: string }];
}

/**
 * One numbered KV event stream (docs/architecture.md#data-flow): `publish()` enqueues and returns
 * at once; each drain cycle, off the JS thread, applies up to 1024 events per batch to the
 * `LocalIndexer`, encodes each batch once per format consumed, logs it under the next seq, and
 * hands the encoded batches to the consumers in seq order. The stream knows no transport:
 * transports `consume()` the format they send.
 */
export class KvEventStream extends EventEmitter<KvStreamEvents> {
  readonly indexer: LocalIndexer;
  readonly logFormat: ZmqFormat;
  readonly dataParallelRank: number | null;
  readonly #queue: EventQueue;
  readonly #drain: DrainScheduler;
  readonly #consumers: Consumer[] = [];
  readonly #onClose: Array<() => Promise<void> | void> = [];
  readonly #failClosed = new Map<number, string>();
  #closed = false;
  #closing: Promise<void> | null = null;
  #events = 0;
  #batches = 0;
  #gaps = 0;
  /** Native links relaying into this stream (`followZmq`). */
  #links = 0;
  /** A take of the links' batches due soon, while no consumer waits for them. */
  #lazyTake: ReturnType<typeof setTimeout> | null = null;

  constructor(options: KvEventStreamOptions = {}) {
    super();
    this.dataParallelRank = options.dataParallelRank ?? null;
    this.logFormat = options.format ?? 'vllm';
    this.indexer = new LocalIndexer({
      blockSize: options.blockSize ?? 16,
      workerId: options.workerId,
      retainTokens: options.retainTokens,
      bufferSteps: options.bufferSteps,
      epoch: options.epoch,
      logFormat: options.format,
      firstSeq: options.firstSeq ?? 'clock',
    });
    try {
      this.#queue = new EventQueue(options.maxQueueSize ?? 100_000);
    } catch (err) {
      this.indexer.close();
      throw err;
    }
    this.#drain = new DrainScheduler(this.indexer, this.#queue, this.dataParallelRank, (out) => {
      this.#published(out);
      // Batches a link published while the drain ran come after the drain's.
      this.#takeDeferred(true);
    });
    if (options.openWithClear ?? true) this.cleared();
  }

  get epoch(): bigint {
    return this.indexer.epoch;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Events waiting in the publish queue (cheap: never waits on a drain in progress). */
  get queued(): number {
    return this.#closed ? 0 : this.#queue.length;
  }

  /** Enqueues events; returns how many were accepted (the rest were dropped and counted). */
  publish(events: readonly KvEvent[]): number {
    this.#open();
    const n = this.#queue.push(events);
    this.#drain.schedule();
    if (n < events.length) this.emit('drop', { reason: 'queue_full', events: events.length - n });
    return n;
  }

  /** Enqueues events given as columns (the bulk path); returns how many were accepted. */
  publishColumns(columns: EventColumns): number {
    this.#open();
    const n = this.#queue.pushColumns(columns);
    this.#drain.schedule();
    if (n < columns.kinds.length) this.emit('drop', { reason: 'queue_full', events: columns.kinds.length - n });
    return n;
  }

  /**
   * Relays an engine's encoded payload (vLLM / SGLang msgpack, TensorRT-LLM) from DP rank
   * `dpRank`: the bulk path, decoded, indexed and re-encoded once in Rust, and published at once
   * under the next seqs with that rank (no JS object per event). Several payloads (consecutive
   * batches of one engine subscription that were waiting together) are published as one batch
   * per run of one rank, under the first one's timestamp. Returns the events relayed. A payload
   * that does not decode throws (`ERR_DECODE`, naming it) and publishes nothing. Not to be mixed
   * with `publish` while its queue drains (`ERR_INVALID_ARG`): the seqs would interleave.
   */
  relay(payloads: Uint8Array | readonly Uint8Array[], dialect: Dialect, dpRank: number | null): number {
    this.#open();
    this.#ordered();
    const out = this.indexer.relayCoalesced(payloads instanceof Uint8Array ? [payloads] : payloads, dialect, dpRank);
    this.#published(out);
    return out.events;
  }

  /**
   * `relay` for a payload whose events carry the engine's event ids (TensorRT-LLM's JSON drain),
   * each batch under its own rank. `nextIds` holds, per rank, the event id expected next, and is
   * updated; a batch that does not follow (ids skipped: the engine dropped events; ids falling
   * back: it restarted) is preceded by `AllBlocksCleared` for its rank. Returns those breaks.
   */
  relayWithEventIds(
    bytes: Uint8Array,
    dialect: Dialect,
    nextIds: Map<number, bigint>,
  ): Array<{ dpRank: number; kind: 'gap' | 'restart' }> {
    this.#open();
    this.#ordered();
    const ranks = Int32Array.from(nextIds.keys());
    const ids = BigUint64Array.from(nextIds.values());
    const out = this.indexer.relayWithEventIds(bytes, dialect, ranks, ids);
    this.#published(out.published);
    nextIds.clear();
    out.ranks.forEach((r, i) => {
      nextIds.set(r, out.nextIds[i] as bigint);
    });
    return Array.from(out.breakRanks, (dpRank, i) => ({ dpRank, kind: out.breakKinds[i] as 'gap' | 'restart' }));
  }

  /**
   * Relays an engine rank's live socket natively (crates/kvplane-zmq): while its follower keeps
   * the gate open, each batch is relayed on the link thread as `relay` would (and sent there by a
   * native ZMQ publisher); this stream's consumers get those batches on the JS thread, in seq order
   * with everything else. What the follower must handle goes to `onDelivery`. `ERR_INVALID_ARG`
   * for an endpoint a link does not speak.
   */
  followZmq(opts: Native.EngineLinkOptions, onDelivery: (d: Native.ZmqDeliveryOut) => void): Native.NativeZmqLink {
    this.#open();
    const link = this.indexer.followZmq(opts, onDelivery, () => this.#linkPublished());
    this.#links++;
    return link;
  }

  /**
   * A link published batches: they go to the consumers at once. With no consumer (a node read over
   * its native ZMQ PUB alone) only this stream's counts wait for them, so they are taken up at
   * most every `LAZY_TAKE_MS`, not for every batch the link relays.
   */
  #linkPublished(): void {
    if (this.#consumers.length > 0) {
      this.#takeDeferred();
      return;
    }
    this.#lazyTake ??= setTimeout(() => {
      this.#lazyTake = null;
      this.#takeDeferred();
    }, LAZY_TAKE_MS).unref();
  }

  /**
   * Hands what links published to the consumers, unless a drain is under way (`afterDrain`: it
   * has just ended): the drain's batches, published before, must reach them first.
   */
  #takeDeferred(afterDrain = false): void {
    if (this.#links === 0 || this.#closed || (this.#drain.busy && !afterDrain)) return;
    // Only what a consumer here takes is copied out (a native PUB sent the logged bytes already).
    this.#published(this.indexer.takeDeferred([...new Set(this.#consumers.map((c) => c.format))]));
  }

  /**
   * Publishes `AllBlocksCleared` for DP rank `dpRank` at once: the rank's state is unknown (a gap
   * its engine cannot fill, an engine restart), so the index and every consumer drop it.
   */
  clearRank(dpRank: number | null): void {
    this.#open();
    this.#ordered();
    this.#published(this.indexer.clearRank(dpRank, Date.now() / 1000));
  }

  #ordered(): void {
    if (this.#drain.busy || this.#queue.length > 0) {
      throw new KvPlaneError(
        'ERR_INVALID_ARG',
        'relay() and clearRank() cannot run while queued events are being published',
      );
    }
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
   * Calls `fn` with every batch published from now on, encoded in `format` (once per batch, for
   * all consumers of that format), in seq order; returns a function that stops it. Consumers are
   * called in the order they subscribed.
   */
  consume(format: EncodeFormat, fn: BatchConsumer): () => void {
    this.#open();
    const consumer = { format, fn };
    this.#consumers.push(consumer);
    this.indexer.setFormat(format, true);
    return () => {
      const i = this.#consumers.indexOf(consumer);
      if (i < 0) return;
      this.#consumers.splice(i, 1);
      if (!this.#closed && !this.#consumers.some((c) => c.format === format)) this.indexer.setFormat(format, false);
    };
  }

  /**
   * Every batch published from now on, as an async iterator: `for await (const { seqs, payloads }
   * of stream.batches({ signal }))`. It ends when the loop breaks, the signal aborts or the stream
   * closes; a loop more than `maxQueued` drains behind loses the oldest (counted in `dropped`).
   */
  batches(options: BatchIterationOptions = {}): BatchIterator {
    return iterateBatches(
      (format, fn) => this.consume(format, fn),
      (fn) => this.onClose(fn),
      options,
    );
  }

  /**
   * Runs `fn` when the stream closes, after its last batch and before the index closes; returns a
   * function that takes it back.
   */
  onClose(fn: () => Promise<void> | void): () => void {
    this.#onClose.push(fn);
    return () => {
      const i = this.#onClose.indexOf(fn);
      if (i >= 0) this.#onClose.splice(i, 1);
    };
  }

  /** Ranks whose source failed closed (unsupported layout), with the reason; empty when healthy. */
  get failClosed(): ReadonlyArray<{ dpRank: number; message: string }> {
    return [...this.#failClosed].map(([dpRank, message]) => ({ dpRank, message }));
  }

  /** Resolves once everything queued has been published and handed to the consumers. */
  async flush(options: AbortOptions = {}): Promise<void> {
    await abortable(options.signal, () => this.#drain.idle());
  }

  stats(): StreamStats {
    return {
      queued: this.queued,
      events: this.#events,
      batches: this.#batches,
      lastSeq: this.#closed ? 0n : this.indexer.lastSeq,
      queueFull: this.#queue.dropped,
      gaps: this.#gaps,
    };
  }

  /**
   * Publishes what is queued, runs the close hooks (transports), then closes the index
   * (`signal`: stop waiting; the close goes on). Calls made while it closes wait for the same close.
   */
  async close(options: AbortOptions = {}): Promise<void> {
    this.#closing ??= this.#close();
    await runThenAbortable(options.signal, () => this.#closing as Promise<void>);
  }

  async #close(): Promise<void> {
    await this.flush();
    if (this.#lazyTake) clearTimeout(this.#lazyTake);
    this.#lazyTake = null;
    this.#takeDeferred();
    this.#closed = true;
    this.#drain.stop();
    // A copy: a hook may take itself back while they run.
    for (const fn of [...this.#onClose]) await fn();
    this.indexer.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #open(): void {
    if (this.#closed) throw new KvPlaneError('ERR_CLOSED', 'the KvEventStream is closed');
  }

  #published(out: Native.PublishedOut): void {
    this.#events += out.events;
    this.#batches += out.seqs.length;
    this.#gaps += out.gaps;
    // Events that failed closed (ERR_UNSUPPORTED_LAYOUT) went out as a clear of their batch's rank.
    for (const e of out.errors) {
      const rank = e.dpRank ?? 0;
      this.#failClosed.set(rank, e.message);
      this.emit('failClosed', { dpRank: rank, message: e.message });
    }
    if (out.gaps > 0) this.emit('gap', { seq: out.seqs[0] ?? 0n, count: out.gaps });
    // A consumer may stop (its own or another's) while they are called: those left get the batches.
    for (const c of [...this.#consumers]) {
      if (!this.#consumers.includes(c)) continue;
      const batches = batchesIn(out, c.format);
      if (batches) c.fn(batches);
    }
  }
}
