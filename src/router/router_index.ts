import { EventEmitter } from 'node:events';
import type * as Native from '../../index.js';
import { type AbortOptions, runThenAbortable } from '../abort.js';
import type { Dialect } from '../codec.js';
import { callNative, invalidArg, KvPlaneError } from '../errors.js';
import native from '../native.js';
import { nativeTokens } from '../tokens.js';
import type { DumpedIndex } from './indexer_dump.js';
import type { FindMatchesRequest, RouterMatches } from './matches.js';
import { GrpcSubscription, type GrpcSubscriptionOptions } from './subscriptions/grpc.js';
import type { RecoveryKind, RouterTarget, Subscription, SubscriptionStats } from './subscriptions/subscription.js';
import { ZmqSubscription, type ZmqSubscriptionOptions } from './subscriptions/zmq.js';

export interface RouterIndexOptions {
  /** Tokens per KV block of the model's engines; events of another block size are not indexed. */
  blockSize: number;
  /** Closing the signal closes the index and its subscriptions. */
  signal?: AbortSignal;
  /** Subscriptions' warnings (gaps, reconnects, rebuilds), for the router's log. */
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  /**
   * How ZMQ subscriptions read their publishers: `native` (default) reads `tcp://` and `ipc://`
   * endpoints on a thread of their own and applies in-order batches there; `js` reads every
   * message with zeromq.js.
   */
  zmqReceive?: 'native' | 'js';
  /**
   * Keep each block's own content hash (8 bytes a block): dumps then carry it (`contentHashes`,
   * Dynamo's `tokens_hash`), which Dynamo's indexer needs to start from this one's dump. Default
   * false: dumps carry each block's key, which another kvplane index starts from.
   */
  contentHashes?: boolean;
}

/** Where a worker's events come from. */
export type WorkerSource =
  | ({ kind: 'grpc' } & Omit<GrpcSubscriptionOptions, 'workerId' | 'onWarning'>)
  | ({ kind: 'zmq' } & Omit<ZmqSubscriptionOptions, 'workerId' | 'onWarning' | 'wholeWorker'>);

/**
 * One dumped chain segment of a worker's blocks in one tier: the engine's block hashes, each
 * block's key, and each block's own content hash (Dynamo's `tokens_hash`) when the index keeps
 * them (`contentHashes` option; else empty).
 */
export interface RouterDumpSegment {
  tier: 'device' | 'host' | 'disk';
  workerId: bigint;
  dpRank: number;
  parent: bigint | null;
  blockHashes: BigUint64Array;
  contentHashes: BigUint64Array;
  keys: BigUint64Array;
}

export interface RouterIndexStats {
  tiers: Array<{ tier: string; blocks: number; memberships: number; bytes: number }>;
  workers: Array<{ workerId: bigint; dpRank: number; tier: string; blocks: number; needsRecovery: boolean }>;
  /** Events not indexed, by reason (every drop is counted). */
  drops: Record<string, number>;
  /**
   * Engine events applied from the subscriptions' payloads, by kind (`stored`, `removed`,
   * `cleared`) and outcome (`ok`, `parent_block_not_found`, `block_not_found`, `invalid_block`),
   * as Dynamo's indexer counts them. Not the router's own clears, nor recoveries.
   */
  events: Array<{ kind: string; outcome: string; count: number }>;
  subscriptions: SubscriptionStats[];
}

/** What a router index tells its listeners (`index.on(...)`). */
export interface RouterIndexEvents {
  /** A subscription restored a worker's state: how, as its stats count it. */
  recovered: [{ workerId: bigint; dpRank: number; kind: RecoveryKind }];
  /** A subscription's warning (gaps, reconnects, rebuilds), as `onWarning` gets it. */
  warning: [message: string, detail: Record<string, unknown>];
}

/**
 * A router's view of many engine nodes (docs/architecture.md#router-side): one index of every
 * `(workerId, dpRank)` of one model and routing group, per storage tier, kept current by
 * subscriptions that recover from gaps and restarts by themselves, and asked which workers hold
 * the longest prefix of a request.
 */
export class RouterIndex extends EventEmitter<RouterIndexEvents> {
  readonly blockSize: number;
  readonly #native: Native.NativeRouterIndex;
  readonly #subs = new Map<string, Subscription>();
  readonly #onWarning: RouterIndexOptions['onWarning'];
  readonly #zmqReceive: 'native' | 'js';
  #closed = false;
  readonly #abort: (() => void) | null = null;

  constructor(opts: RouterIndexOptions) {
    super();
    const bs = opts.blockSize;
    if (!Number.isInteger(bs) || bs < 1) invalidArg(`blockSize is ${bs}: a positive integer`);
    this.#native = callNative(() => new native.NativeRouterIndex(bs, opts.contentHashes ?? false));
    this.blockSize = bs;
    this.#onWarning = (msg, detail) => {
      opts.onWarning?.(msg, detail);
      this.emit('warning', msg, detail);
    };
    this.#zmqReceive = opts.zmqReceive ?? 'native';
    if (this.#zmqReceive !== 'native' && this.#zmqReceive !== 'js')
      invalidArg(`zmqReceive is ${this.#zmqReceive}: native or js`);
    if (opts.signal) {
      const signal = opts.signal;
      const onAbort = () => void this.close();
      if (signal.aborted) this.#closed = true;
      else {
        signal.addEventListener('abort', onAbort, { once: true });
        this.#abort = () => signal.removeEventListener('abort', onAbort);
      }
    }
  }

  get closed(): boolean {
    return this.#closed;
  }

  #open(): Native.NativeRouterIndex {
    if (this.#closed) throw new KvPlaneError('ERR_CLOSED', 'the router index is closed');
    return this.#native;
  }

  /** The native side, as subscriptions apply to it (closed: nothing is applied). */
  #target(): RouterTarget {
    const n = this.#native;
    return {
      applyPayload: (w, r, b, d) => callNative(() => n.applyPayload(w, r, b, d)),
      applyPayloads: (w, r, b, d) => callNative(() => n.applyPayloads(w, r, b, d)),
      applyNumbered: (w, r, b, e) => callNative(() => n.applyNumbered(w, r, b, e)),
      clearWorker: (w, r) => callNative(() => n.clearWorker(w, r)),
      applyRecovery: (w, a) => callNative(() => n.applyRecovery(w, a)),
      followZmq: this.#zmqReceive === 'native' ? (o, cb) => callNative(() => n.followZmq(o, cb)) : undefined,
    };
  }

  /** Per worker holding the request's first block: how many leading blocks it holds, by tier. */
  findMatches(tokens: Uint32Array | readonly number[], req: FindMatchesRequest = {}): RouterMatches {
    const n = this.#open();
    const toks = nativeTokens(tokens);
    return callNative(() => n.query(toks, req.loraName ?? null, req.cacheSalt ?? null));
  }

  /**
   * `findMatches` for a request given as its blocks' unchained content hashes (XXH3-64 of each
   * block's tokens as u32 LE, seeded 1337 plus its namespace, as Dynamo's `LocalBlockHash`).
   */
  findMatchesByHash(hashes: BigUint64Array | readonly bigint[]): RouterMatches {
    const n = this.#open();
    const h = hashes instanceof BigUint64Array ? hashes : BigUint64Array.from(hashes);
    return callNative(() => n.queryByHash(h));
  }

  /** Applies an encoded payload of `dialect` to worker `workerId` (batches naming no rank: `dpRank`). */
  applyPayload(workerId: bigint, payload: Uint8Array, dialect: Dialect, dpRank = 0): number {
    const n = this.#open();
    return callNative(() => n.applyPayload(workerId, dpRank, payload, dialect)).events;
  }

  /** Applies a node's `/kv_recover` answer (msgpack): `Events` in order, a `TreeDump` replacing the worker. */
  applyRecovery(workerId: bigint, answer: Uint8Array): { kind: string; lastSeq: bigint; epoch: bigint } {
    const n = this.#open();
    return callNative(() => n.applyRecovery(workerId, answer));
  }

  /** Drops every block of worker `workerId` (only `dpRank` when given). */
  clearWorker(workerId: bigint, dpRank?: number): void {
    const n = this.#open();
    callNative(() => n.clearWorker(workerId, dpRank ?? null));
  }

  /**
   * Follows worker `workerId` (its DP rank `dpRank` for a per-rank ZMQ publisher) from `source`
   * until `unsubscribe`. One subscription per `(workerId, dpRank)`.
   */
  subscribe(workerId: bigint, source: WorkerSource): Subscription {
    this.#open();
    const rank = source.dpRank ?? 0;
    const key = `${workerId}:${rank}`;
    if (this.#subs.has(key)) invalidArg(`worker ${workerId} rank ${rank} is already subscribed`);
    const target = this.#target();
    const onRecovered = (kind: RecoveryKind) => this.emit('recovered', { workerId, dpRank: rank, kind });
    const sub =
      source.kind === 'grpc'
        ? new GrpcSubscription(target, { ...source, workerId, onWarning: this.#onWarning, onRecovered })
        : new ZmqSubscription(target, {
            ...source,
            workerId,
            onWarning: this.#onWarning,
            onRecovered,
            wholeWorker: () => [...this.#subs.values()].filter((s) => s.workerId === workerId).length <= 1,
          });
    this.#subs.set(key, sub);
    sub.start();
    return sub;
  }

  /**
   * Stops following `workerId` (only `dpRank` when given) and drops what it held (`signal`: stop
   * waiting; the subscriptions still stop and their blocks are still dropped).
   */
  async unsubscribe(workerId: bigint, dpRank?: number, options: AbortOptions = {}): Promise<void> {
    const stops: Promise<void>[] = [];
    for (const [key, sub] of this.#subs) {
      if (sub.workerId !== workerId || (dpRank !== undefined && sub.dpRank !== dpRank)) continue;
      this.#subs.delete(key);
      stops.push(sub.stop());
    }
    // Cleared once they are stopped, so nothing they receive meanwhile survives.
    const done = Promise.all(stops).then(() => {
      if (!this.#closed) this.clearWorker(workerId, dpRank);
    });
    await runThenAbortable(options.signal, () => done);
  }

  subscription(workerId: bigint, dpRank = 0): Subscription | undefined {
    return this.#subs.get(`${workerId}:${dpRank}`);
  }

  /** Every worker's blocks per tier, as chain segments, parents first (one worker's with `workerId`). */
  dump(workerId?: bigint): RouterDumpSegment[] {
    const n = this.#open();
    // A root's parent comes over as absent: `null`, as typed.
    return callNative(() => n.dump(workerId ?? null)).map((s) => ({
      ...s,
      parent: s.parent ?? null,
    })) as RouterDumpSegment[];
  }

  /**
   * `dump` as the `events` of Dynamo's indexer `/dump` entry, JSON written by the core: pieces of
   * about `pieceBlocks` blocks, each a run of events joined by commas (join the pieces with commas
   * inside `[` `]`).
   */
  dumpJson(pieceBlocks = 4096): Buffer[] {
    const n = this.#open();
    return callNative(() => n.dumpJson(pieceBlocks));
  }

  /**
   * Stores an index of another indexer's dump (`readIndexerDump`) over what this one holds, as
   * an indexer starting from a peer does, but for the workers in `skipWorkers`; a segment whose
   * parent is unknown is counted as a drop.
   */
  restore(dump: DumpedIndex, skipWorkers: readonly bigint[] = []): { segments: number; blocks: number } {
    const n = this.#open();
    if (dump.blockSize !== this.blockSize)
      invalidArg(`the dump's block size is ${dump.blockSize}, the index's ${this.blockSize}`);
    return callNative(() => n.restore(dump, BigUint64Array.from(skipWorkers)));
  }

  /** Each subscription's state and counters (cheaper than `stats()`: no index walk). */
  subscriptionStats(): SubscriptionStats[] {
    return [...this.#subs.values()].map((x) => x.stats());
  }

  stats(): RouterIndexStats {
    const n = this.#open();
    const s = callNative(() => n.stats());
    return {
      tiers: s.tiers,
      workers: s.workers,
      drops: Object.fromEntries(s.drops.map((d) => [d.reason, d.count])),
      events: s.events,
      subscriptions: [...this.#subs.values()].map((x) => x.stats()),
    };
  }

  /** Stops every subscription; the index answers nothing after (`signal`: stop waiting for them). */
  async close(options: AbortOptions = {}): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#abort?.();
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    await runThenAbortable(options.signal, () => Promise.all(subs.map((s) => s.stop())).then(() => undefined));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
