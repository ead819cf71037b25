import type * as Native from '../../../index.js';
import { trimMemorySoon } from '../../transports/memory.js';

/**
 * A router's subscription to one worker's stream (docs/architecture.md#router-side): it keeps
 * that worker's part of a `RouterIndex` current, recovering from gaps and restarts by itself.
 */

/** What a subscription applies its worker's batches to: a `RouterIndex`'s native side. */
export interface RouterTarget {
  applyPayload(workerId: bigint, rank: number, bytes: Uint8Array, dialect: string): { events: number };
  /** Payloads that arrived together, in one call; nothing applied if one does not decode. */
  applyPayloads(workerId: bigint, rank: number, payloads: Uint8Array[], dialect: string): number;
  applyNumbered(
    workerId: bigint,
    rank: number,
    bytes: Uint8Array,
    expected?: bigint | null,
  ): { outcome: string; seq: bigint; events: number; snapshotRest: number };
  clearWorker(workerId: bigint, rank?: number | null): void;
  /** A node's `/kv_recover` answer (msgpack): `Events` applied in order, a `TreeDump` replacing the worker. */
  applyRecovery(workerId: bigint, answer: Uint8Array): { kind: string; lastSeq: bigint };
  /**
   * Reads a ZMQ publisher natively, applying its in-order batches to this index on the link
   * thread (absent: zeromq.js only). Throws `ERR_INVALID_ARG` for endpoints it cannot connect to.
   */
  followZmq?(opts: Native.ZmqLinkOptions, onDelivery: (d: Native.ZmqDeliveryOut) => void): Native.NativeZmqLink;
}

/** How a worker's state was recovered, by kind. */
export interface RecoveryCounts {
  /** Resumed from the last applied seq (the node still had it). */
  resume: number;
  /** Rebuilt from a snapshot or tree dump (joining, an expired cursor, a restart). */
  snapshot: number;
  /** Gaps filled from an engine's replay socket. */
  replay: number;
  /** State unknown and nothing to rebuild it from: the worker was cleared. */
  cleared: number;
}

/** How a subscription restored a worker's state (`RouterIndex`'s `recovered` event). */
export type RecoveryKind = 'resume' | 'snapshot' | 'replay' | 'tree_dump' | 'cleared' | 'restart';

export interface SubscriptionStats {
  workerId: bigint;
  /** The registration's DP rank (the batches' own ranks are indexed under theirs). */
  dpRank: number;
  kind: 'grpc' | 'zmq';
  endpoint: string;
  /** `connecting`, `recovering` (a snapshot or replay is being applied), `live`, `backoff`, `closed`. */
  state: string;
  /** The last seq applied (the node's or engine's numbering), or `null`. */
  lastSeq: bigint | null;
  /** The node's epoch (gRPC to a kvplane node), or `null`. */
  epoch: bigint | null;
  batches: number;
  events: number;
  /** Of `batches`, those a native ZMQ link applied on its own thread (in order, never crossing into JS). */
  linkBatches: number;
  /** `Date.now()` of the last batch applied, or `null`. */
  lastBatchAt: number | null;
  recoveries: RecoveryCounts;
  /** Node restarts seen (epoch change, or an engine's seq falling back). */
  restarts: number;
  /** Times the stream was lost and opened again. */
  reconnects: number;
  /** Batches skipped as already applied. */
  duplicates: number;
  /** Batches that did not decode (then the worker's state is rebuilt). */
  undecodable: number;
  /**
   * Live batches dropped: by the subscription's own receive bound (a native ZMQ link's), or held
   * past 10,000 while a replay or load was under way (then a gap, or the worker cleared).
   */
  dropped: number;
  /** Messages that were not batches (a ZMQ frame count or seq size), live or replayed: skipped. */
  malformed: number;
  lastError: string | null;
}

export interface Subscription {
  readonly workerId: bigint;
  readonly dpRank: number;
  start(): void;
  stop(): Promise<void>;
  stats(): SubscriptionStats;
  /**
   * Holds what arrives (applies none) while the worker's state is loaded from a peer indexer:
   * for a subscription that cannot load it from its own source (a plain ZMQ publisher). False
   * when it does not hold (it recovers by itself).
   */
  holdForPeer?(): boolean;
  /** Ends `holdForPeer`; `known`: the worker's state was loaded, and what was held goes on from it. */
  releaseHold?(known: boolean): void;
}

/** Capped exponential backoff: 100 ms doubling to 5 s, back to the start after a success. */
export class Backoff {
  #next = 100;
  constructor(
    readonly minMs = 100,
    readonly maxMs = 5000,
  ) {
    this.#next = minMs;
  }

  /** The delay before the next attempt (then it doubles). */
  delay(): number {
    const d = this.#next;
    this.#next = Math.min(this.maxMs, this.#next * 2);
    return d * (0.8 + 0.4 * Math.random());
  }

  reset(): void {
    this.#next = this.minMs;
  }
}

/**
 * After batches were applied: the allocator's freed memory goes back to the OS once ingest pauses
 * (decoding frees what it allocated, and glibc would otherwise keep it). At most every 250 ms.
 */
let lastTrimCall = 0;
export function appliedSoTrimLater(): void {
  const now = Date.now();
  if (now - lastTrimCall < 250) return;
  lastTrimCall = now;
  trimMemorySoon();
}

export function emptyRecoveries(): RecoveryCounts {
  return { resume: 0, snapshot: 0, replay: 0, cleared: 0 };
}
