import type { Dialect } from '../../codec.js';
import { invalidArg } from '../../errors.js';
import type { KvEvent } from '../../events.js';
import type { FollowerCounters } from '../../sources/engine/follower.js';
import { NativeZmqFeed } from '../../sources/engine/native_feed.js';
import { EngineZmqSource } from '../../sources/engine/zmq_source.js';
import type { RelaySink } from '../../sources/source.js';
import { nodeGet } from '../../transports/http/node_get.js';
import {
  appliedSoTrimLater,
  emptyRecoveries,
  type RecoveryKind,
  type RouterTarget,
  type Subscription,
  type SubscriptionStats,
} from './subscription.js';

export interface ZmqSubscriptionOptions {
  workerId: bigint;
  /** The registration's DP rank: batches naming no rank are indexed under it. Default 0. */
  dpRank?: number;
  /** The publisher to connect to, `tcp://HOST:PORT` (vLLM's and SGLang's bind; this connects). */
  endpoint: string;
  /** The publisher's replay ROUTER; `null`: a gap clears the worker. */
  replayEndpoint?: string | null;
  /**
   * A kvplane node's HTTP URL: state its replay cannot restore (a range it no longer has, a
   * restart, joining) is loaded from its `/kv_recover` tree dump instead of cleared.
   */
  recoverUrl?: string | null;
  /** The bearer token `recoverUrl` asks for (a node started with `--auth-token-file`). */
  recoverToken?: string | null;
  /** Payload dialect. Default `vllm` (kvplane nodes publish it too). */
  dialect?: 'vllm' | 'sglang' | 'trtllm';
  /**
   * Whether this is the worker's only subscription: then a clear drops every rank of it (a node
   * publishing all its ranks on one socket); else only `dpRank`.
   */
  wholeWorker?: () => boolean;
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  /** Each recovery as it happens. */
  onRecovered?: (kind: RecoveryKind) => void;
}

/**
 * The largest `/kv_recover` tree dump read from a node (msgpack: about 80 bytes a block with its
 * tokens, so some 13 million blocks); a larger answer is refused as it arrives, not held whole.
 */
const TREE_DUMP_BYTES = 1 << 30;
/**
 * Tree dumps read at once in the process, whatever node or index they are for (each may be up to
 * `TREE_DUMP_BYTES`, held while decoded): the rest wait their turn, in order.
 */
const TREE_DUMPS_AT_ONCE = 2;
let treeDumpsReading = 0;
const treeDumpWaiters: Array<() => void> = [];

/**
 * Waits for a turn to read a tree dump (`signal`: stop waiting, an error); the function it gives
 * back ends the turn.
 */
async function treeDumpTurn(signal: AbortSignal): Promise<() => void> {
  signal.throwIfAborted();
  if (treeDumpsReading < TREE_DUMPS_AT_ONCE) treeDumpsReading++;
  else {
    await new Promise<void>((resolve, reject) => {
      const turn = () => {
        signal.removeEventListener('abort', leave);
        resolve();
      };
      const leave = () => {
        treeDumpWaiters.splice(treeDumpWaiters.indexOf(turn), 1);
        reject(signal.reason);
      };
      treeDumpWaiters.push(turn);
      signal.addEventListener('abort', leave, { once: true });
    });
  }
  return () => {
    // The turn passes straight to the next in line, if any.
    const next = treeDumpWaiters.shift();
    if (next) next();
    else treeDumpsReading--;
  };
}

/** The follower's counts that are recoveries, by the kind `recovered` names them. */
const RECOVERY_COUNTS: Partial<Record<keyof FollowerCounters, RecoveryKind>> = {
  gapsFilled: 'replay',
  unrecoverable: 'cleared',
  restarts: 'restart',
};

/**
 * A worker followed over an engine's ZMQ publisher (vLLM, SGLang, TensorRT-LLM, or a kvplane
 * node's vLLM-format stream), with the engine relay's follower: what was published before joining
 * and every seq gap are fetched from the replay socket before later batches are applied. A range
 * the publisher no longer has, a publisher without replay, or a restart (its seq falls back)
 * clears the worker, which rebuilds from what follows; with `recoverUrl` (a kvplane node) the
 * worker is loaded from the node's tree dump instead.
 */
export class ZmqSubscription implements Subscription {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly #source: EngineZmqSource;
  readonly #o: ZmqSubscriptionOptions;
  readonly #sink: RelaySink;
  #events = 0;
  #batches = 0;
  #lastBatchAt: number | null = null;
  #closed = false;
  /** Aborted by `stop`: a tree dump waiting for its turn, or being read, gives up. */
  readonly #stopping = new AbortController();
  #snapshots = 0;
  #lastError: string | null = null;
  /** The native link reading the publisher, when there is one. */
  #native: NativeZmqFeed | null = null;

  constructor(target: RouterTarget, o: ZmqSubscriptionOptions) {
    this.#o = o;
    this.workerId = o.workerId;
    this.dpRank = o.dpRank ?? 0;
    this.#source = new EngineZmqSource({
      engine: o.dialect ?? 'vllm',
      endpoint: o.endpoint,
      replayEndpoint: o.replayEndpoint ?? null,
      dpSize: 1,
      // Batches already waiting on the socket are applied in one call.
      coalesceBytes: 1 << 20,
      fetchOnJoin: true,
      // A node that is down is retried from 100 ms, doubling up to 5 s.
      reconnectMaxMs: 5000,
      onWarning: o.onWarning,
      onCount: (_rank, what) => {
        const kind = RECOVERY_COUNTS[what];
        if (kind) o.onRecovered?.(kind);
      },
      resync: o.recoverUrl ? () => this.#treeDump(target, o.recoverUrl as string) : undefined,
      liveFeed: target.followZmq ? (endpoint) => this.#nativeFeed(target, endpoint) : undefined,
    });
    const clear = () => target.clearWorker(this.workerId, o.wholeWorker?.() === false ? this.dpRank : null);
    const apply = (payloads: Uint8Array[], dialect: Dialect) => {
      this.#events += target.applyPayloads(this.workerId, this.dpRank, payloads, dialect);
      this.#batches += payloads.length;
      this.#lastBatchAt = Date.now();
      appliedSoTrimLater();
    };
    this.#sink = {
      publish(_events: readonly KvEvent[]): number {
        return invalidArg('a router subscription applies payloads only');
      },
      relay(payloads, dialect) {
        apply(Array.isArray(payloads) ? (payloads as Uint8Array[]) : [payloads as Uint8Array], dialect);
        return 0;
      },
      relayWithEventIds() {
        return invalidArg('a router subscription takes ZMQ payloads only');
      },
      clearRank: () => clear(),
      flush: async () => {},
    };
  }

  holdForPeer(): boolean {
    // A kvplane node's subscription loads the worker's state from the node itself.
    if (this.#o.recoverUrl) return false;
    this.#source.hold();
    return true;
  }

  releaseHold(known: boolean): void {
    this.#source.release(known);
  }

  start(): void {
    // A link that cannot open (an endpoint only zeromq.js speaks, without the package) is this
    // subscription's error, not the process's unhandled rejection.
    this.#source.start(this.#sink).catch((err: Error) => {
      this.#lastError = err.message;
      this.#o.onWarning?.('subscription could not start', { worker_id: this.workerId, error: err.message });
    });
  }

  /** A native link to `endpoint`, or `null` (zeromq.js) for an endpoint it does not speak. */
  #nativeFeed(target: RouterTarget, endpoint: string): NativeZmqFeed | null {
    const follow = target.followZmq as NonNullable<RouterTarget['followZmq']>;
    const o = this.#o;
    this.#native = NativeZmqFeed.open(
      (onDelivery) =>
        follow(
          {
            endpoint,
            workerId: this.workerId,
            dpRank: this.dpRank,
            dialect: o.dialect ?? 'vllm',
            reconnectMaxMs: 5000,
            maxUnread: 10_000,
          },
          onDelivery,
        ),
      () => appliedSoTrimLater(),
    );
    return this.#native;
  }

  /**
   * The node's whole state from its `/kv_recover` tree dump, replacing the worker's: its seq. A
   * node that refuses the connection (restarting) is asked again after 0.2, 0.4 and 0.8 s before
   * the load fails (the worker cleared, and loaded again later: `RankLink`); one that answers
   * too slowly or wrongly is not asked again at once.
   */
  async #treeDump(target: RouterTarget, url: string): Promise<bigint> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#treeDumpOnce(target, url);
      } catch (err) {
        if (attempt >= 3 || this.#closed || !/fetch failed/.test((err as Error).message)) throw err;
        await new Promise((r) => setTimeout(r, 200 * 2 ** attempt));
      }
    }
  }

  async #treeDumpOnce(target: RouterTarget, url: string): Promise<bigint> {
    const done = await treeDumpTurn(this.#stopping.signal);
    try {
      const body = await nodeGet(url, '/kv_recover?format=msgpack', {
        token: this.#o.recoverToken,
        limit: TREE_DUMP_BYTES,
        timeoutMs: 30_000,
        signal: this.#stopping.signal,
      });
      const answer = target.applyRecovery(this.workerId, body);
      if (answer.kind !== 'TreeDump') throw new Error(`expected a TreeDump, got ${answer.kind}`);
      this.#snapshots++;
      this.#o.onRecovered?.('tree_dump');
      this.#lastBatchAt = Date.now();
      appliedSoTrimLater();
      return answer.lastSeq;
    } catch (err) {
      // The rank's lastError once the retries are over (`loading the state failed: ...`).
      throw new Error(`${url}/kv_recover: ${(err as Error).message}`);
    } finally {
      done();
    }
  }

  async stop(): Promise<void> {
    this.#closed = true;
    this.#stopping.abort(new Error('unsubscribed'));
    await this.#source.stop();
  }

  stats(): SubscriptionStats {
    const r = this.#source.ranks()[0];
    // What the native link applied since it last handed over is not in the follower's counts yet.
    const n = this.#native?.stats();
    const lastAt = Math.max(this.#lastBatchAt ?? 0, n?.lastAppliedMs ?? 0);
    const recoveries = emptyRecoveries();
    recoveries.replay = r?.gapsFilled ?? 0;
    recoveries.cleared = r?.unrecoverable ?? 0;
    recoveries.snapshot = this.#snapshots;
    return {
      workerId: this.workerId,
      dpRank: this.dpRank,
      kind: 'zmq',
      endpoint: this.#o.endpoint,
      state: this.#closed ? 'closed' : r?.fetching ? 'recovering' : r?.connected ? 'live' : 'connecting',
      lastSeq: n?.stintLastSeq ?? r?.lastEngineSeq ?? null,
      epoch: null,
      batches: this.#batches + (n?.batches ?? 0),
      events: this.#events + (n?.events ?? 0),
      lastBatchAt: lastAt === 0 ? null : lastAt,
      recoveries,
      restarts: r?.restarts ?? 0,
      reconnects: Math.max(0, (n?.connects ?? 1) - 1),
      duplicates: (r?.duplicates ?? 0) + (n?.duplicates ?? 0),
      undecodable: r?.undecodable ?? 0,
      dropped: (n?.dropped ?? 0) + (r?.heldDropped ?? 0),
      malformed: r?.malformed ?? 0,
      linkBatches: n?.batches ?? 0,
      lastError: r?.lastError ?? this.#lastError ?? n?.lastError ?? null,
    };
  }
}
