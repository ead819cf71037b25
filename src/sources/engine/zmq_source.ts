import type { Dealer, Subscriber } from 'zeromq';
import type { Dialect } from '../../codec.js';
import { invalidArg, KvPlaneError } from '../../errors.js';
import { zeromq } from '../../optional.js';
import { endpointForRank, MAX_FRAME_BYTES, zmqAddress } from '../../transports/zmq/config.js';
import { END_OF_REPLAY, seqFrame } from '../../transports/zmq/writer.js';
import { type EventSink, type EventSource, type RelaySink, relaySink, type SourceHealth } from '../source.js';
import { type EngineBatch, type FollowerCounters, type FollowStep, RankFollower } from './follower.js';
import { type LatencySummary, RelayLatency } from './latency.js';
import { NativeZmqFeed } from './native_feed.js';

/**
 * A vLLM, SGLang or TensorRT-LLM engine's ZMQ KV-event publisher, as `kvplane serve --engine
 * vllm|sglang|trtllm` relays it.
 */
export interface EngineZmqOptions {
  engine: 'vllm' | 'sglang' | 'trtllm';
  /** Rank 0's publisher endpoint, as the relay connects to it (`tcp://HOST:5557`). */
  endpoint: string;
  /** Rank 0's replay endpoint; `null` for an engine without replay. */
  replayEndpoint?: string | null;
  /**
   * Data-parallel ranks. Default 1. vLLM and SGLang publish each rank on its own socket, offset
   * as the engine offsets it; TensorRT-LLM gathers its attention-DP ranks on rank 0's socket,
   * each batch naming its rank, so this is how many ranks a gap there clears.
   */
  dpSize?: number;
  /** Topic filter. Default `''` (everything). */
  topic?: string;
  /** The relay's own receive HWM per rank, in messages. Default 10,000. */
  receiveHwm?: number;
  /**
   * The engine's first seq, where a relay joining late fetches from. Default 0 (vLLM, SGLang,
   * TensorRT-LLM); a kvplane node relayed by another starts at its clock (use its oldest seq).
   */
  firstSeq?: bigint;
  /**
   * Engine batches found waiting together on a rank are relayed as one outbound batch, up to this
   * many payload bytes (one batch larger than that goes alone; never more than 1024 events a
   * batch). Default 65,536 (about 500 events of vLLM's one-block stores); 0 relays each engine
   * batch as its own. Only what has already arrived is merged: nothing waits for more.
   */
  coalesceBytes?: number;
  /**
   * Fetch what the engine published before joining from its replay socket at once, instead of
   * when the first live batch shows the gap (a router: an idle rank's blocks are known at once).
   * Default false.
   */
  fetchOnJoin?: boolean;
  /**
   * Loads the publisher's whole state for `ranks` (a kvplane node's `/kv_recover` tree dump) when
   * replay cannot restore it, and answers the seq that state reflects; the rank goes on from the
   * next seq. Without it such a rank is cleared and rebuilds from what follows.
   */
  resync?: (ranks: readonly number[]) => Promise<bigint>;
  /**
   * Reconnect attempts back off exponentially from 100 ms up to this many ms (ZMQ's
   * `reconnect_ivl_max`). Default: none, every 100 ms (an engine restarting is seen at once).
   */
  reconnectMaxMs?: number;
  /**
   * The live socket for each rank's publisher endpoint; `null` (or absent) for the default: a
   * native link relaying into the sink when it can (`native`), else zeromq.js's Subscriber. A
   * router passes its own native link here (`src/router/subscriptions/zmq.ts`).
   */
  liveFeed?: (endpoint: string) => LiveFeed | null;
  /**
   * Read each rank's live socket on the native link thread (crates/kvplane-zmq) and relay there
   * what arrives in order, when the sink is a stream or publisher and the endpoint is tcp or ipc;
   * the rest (joining, gaps, restarts) comes to the follower here. Default true; false reads it
   * with zeromq.js and relays every batch on the JS thread.
   */
  native?: boolean;
  /** How long a replay fetch may go without an answer before the rank is cleared. Default 5 s. */
  replayTimeoutMs?: number;
  /** Bad input from the engine (counted and skipped) and ranks cleared, for the node's log. */
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  /** Each rank follower's counts as they happen (`RankFollower`'s `onCount`). */
  onCount?: (rank: number, what: keyof FollowerCounters) => void;
}

/** What a rank's live socket reports, in order. */
export interface LiveHandlers {
  batch(seq: bigint, payload: Buffer): void;
  /** A message that was not `[topic, 8-byte seq, payload]`. */
  malformed(frames: number): void;
  /** A connection ended for bad input (a frame over the bound, a refused handshake), and why. */
  refused(why: string): void;
  /**
   * A connection that ended before its handshake (the peer closed or reset it: a port that is not
   * a publisher's), and why, with when the feed connects again.
   */
  failed(why: string): void;
  connected(): void;
  disconnected(): void;
  /** Batches the feed applied itself (`reopen`), reported before whatever it reports next. */
  appliedElsewhere(lastSeq: bigint, batches: number): void;
}

/** A rank's live socket: zeromq.js's Subscriber, or a link that reads it natively. */
export interface LiveFeed {
  start(h: LiveHandlers): void;
  /** More messages have already arrived (what waits to be relayed may grow first). */
  readonly more: boolean;
  readonly closed: boolean;
  close(): Promise<void>;
  /**
   * The follower expects `next` and holds nothing: the feed may apply batches from `next` on
   * itself, in order, until it reports something (`appliedElsewhere` first).
   */
  reopen?(next: bigint): void;
  /** Each batch the feed applied itself since last asked: its time in the relay (ms). */
  takeLatencies?(): Float64Array;
  /** What the feed applied itself since it last reported (`appliedElsewhere`), without taking it. */
  stint?(): { lastSeq: bigint | null; batches: number };
  /**
   * Takes over from the feed without it reporting anything (the relay could not apply a batch
   * it was handed after `reopen`): nothing more is applied by the feed until `reopen`. What it
   * applied since it last reported.
   */
  shut?(): { lastSeq: bigint | null; batches: number };
}

/** A native link relaying `endpoint` into the sink, or `null` (zeromq.js) where there is none. */
function nativeFeed(
  sink: RelaySink,
  endpoint: string,
  relayRank: number | null,
  o: EngineZmqOptions,
  coalesceBytes: number,
): LiveFeed | null {
  if (o.native === false || sink.followZmq === undefined) return null;
  const follow = sink.followZmq.bind(sink);
  return NativeZmqFeed.open(
    (onDelivery) =>
      follow(
        {
          endpoint,
          topic: o.topic ?? '',
          dpRank: relayRank ?? undefined,
          dialect: o.engine,
          reconnectMaxMs: o.reconnectMaxMs,
          maxUnread: o.receiveHwm ?? 10_000,
          coalesceBytes,
        },
        onDelivery,
      ),
    () => {},
  );
}

/** How long an engine replay may take, end marker included, before it counts as failed. */
const REPLAY_DEADLINE_MS = 60_000;
/** Replies of one replay that are not batches (nor its end marker) before it counts as failed. */
const REPLAY_MALFORMED_MAX = 1000;

/**
 * A connection libzmq drops without connecting again (a frame over `maxMessageSize`, a handshake
 * it refuses: libzmq ends such a session for good) is told from one it reconnects by the
 * `connect:retry` that follows a reconnecting drop at once; none within this many ms, and the
 * feed connects the endpoint again itself.
 */
const SESSION_ENDED_MS = 1000;
/** A feed whose sessions keep ending so connects again 1 s after the drop, doubling to this. */
const SESSION_RETRY_MAX_MS = 30_000;
/** The first wait before the state is loaded again after a load failed; it doubles to the max. */
const RESYNC_RETRY_MS = 10_000;
const RESYNC_RETRY_MAX_MS = 300_000;
/** libzmq's reconnect interval: a connection that ended before its handshake is retried after it. */
const ZMQ_RECONNECT_MS = 100;

/** The live socket as zeromq.js's Subscriber. */
class ZmqjsFeed implements LiveFeed {
  readonly #sub: Subscriber;
  readonly #endpoint: string;
  readonly #topic: string;
  #loops: Promise<unknown>[] = [];
  /** Armed by a drop until libzmq says it connects again (`SESSION_ENDED_MS`). */
  #endedTimer: NodeJS.Timeout | null = null;
  /** Sessions ended in a row with no batch between (the wait before connecting again doubles). */
  #ended = 0;
  /** Why libzmq refused the last handshake, if it did. */
  #handshakeError: string | null = null;
  /** Why the last handshake failed otherwise (the peer closed or reset the connection). */
  #handshakeFailure: string | null = null;
  /** The current connection completed its handshake. */
  #shaken = false;
  /** Connections in a row that ended before their handshake (the wait before the next doubles). */
  #failures = 0;
  readonly #reconnectMaxMs: number;
  #retryTimer: NodeJS.Timeout | null = null;

  constructor(endpoint: string, o: EngineZmqOptions) {
    this.#endpoint = endpoint;
    this.#reconnectMaxMs = o.reconnectMaxMs ?? ZMQ_RECONNECT_MS;
    this.#topic = o.topic ?? '';
    this.#sub = new (zeromq().Subscriber)({
      linger: 0,
      receiveHighWaterMark: o.receiveHwm ?? 10_000,
      maxMessageSize: MAX_FRAME_BYTES,
      ...(o.reconnectMaxMs ? { reconnectMaxInterval: o.reconnectMaxMs } : {}),
      // A publisher whose host died or that a partition cut off is noticed within about 25 s
      // however quiet, as the native link notices it.
      tcpKeepalive: 1,
      tcpKeepaliveIdle: 10,
      tcpKeepaliveInterval: 5,
      tcpKeepaliveCount: 3,
    });
  }

  get more(): boolean {
    return !this.#sub.closed && this.#sub.readable;
  }

  get closed(): boolean {
    return this.#sub.closed;
  }

  start(h: LiveHandlers): void {
    // An `inproc://` socket reports no events, not even its end once closed (a watcher would wait
    // on it for good, and keep the process running): it is connected from the start.
    const inproc = this.#endpoint.startsWith('inproc://');
    // Watch before connecting: the socket's events are reported from when they are first read.
    if (!inproc) this.#loops.push(this.#watch(h));
    this.#sub.connect(this.#endpoint);
    this.#sub.subscribe(this.#topic);
    if (inproc) h.connected();
    this.#loops.push(this.#receive(h));
  }

  async close(): Promise<void> {
    this.#disarm();
    if (this.#retryTimer) clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
    this.#sub.close();
    await Promise.allSettled(this.#loops);
  }

  async #watch(h: LiveHandlers): Promise<void> {
    try {
      for await (const ev of this.#sub.events) {
        if (ev.type === 'connect') {
          this.#disarm();
          this.#handshakeError = null;
          this.#handshakeFailure = null;
          this.#shaken = false;
        } else if (ev.type === 'handshake') {
          this.#shaken = true;
          this.#failures = 0;
          h.connected();
        } else if (ev.type === 'connect:retry' || ev.type === 'connect:delay') {
          this.#disarm();
        } else if (ev.type === 'handshake:error:protocol') {
          this.#handshakeError = `${ev.error.message} (${ev.error.code})`;
        } else if (ev.type === 'handshake:error:auth') {
          this.#handshakeError = `${ev.error.message} (status ${ev.error.status})`;
        } else if (ev.type === 'handshake:error:other') {
          this.#handshakeFailure = ev.error.message;
        } else if (ev.type === 'disconnect') {
          if (this.#shaken) h.disconnected();
          // A refused handshake ends the session for good (`#armEnded`); a peer that closed the
          // connection before it is retried by libzmq, at once: backed off here.
          if (this.#shaken || this.#handshakeError !== null) this.#armEnded(h);
          else this.#failed(h);
          this.#shaken = false;
        } else if (ev.type === 'end') break;
      }
    } catch {
      // The socket closed.
    }
  }

  /**
   * A connection that ended before its handshake: reported, and connected again after 100 ms
   * doubling up to `reconnectMaxMs` (libzmq would retry every 100 ms however often it failed).
   */
  #failed(h: LiveHandlers): void {
    const waitMs = Math.min(this.#reconnectMaxMs, ZMQ_RECONNECT_MS * 2 ** Math.min(this.#failures, 16));
    this.#failures++;
    const why = this.#handshakeFailure ?? 'the connection closed';
    h.failed(
      `${this.#endpoint}: ${why} before its handshake (${this.#failures} in a row); connecting again in ${waitMs} ms`,
    );
    if (waitMs > ZMQ_RECONNECT_MS) this.#connectAgainIn(waitMs);
  }

  /** Stops libzmq's own attempts at the endpoint, if any, and connects it again in `ms`. */
  #connectAgainIn(ms: number): void {
    if (this.#retryTimer) return;
    try {
      this.#sub.disconnect(this.#endpoint);
    } catch {
      // Already gone with its session.
    }
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = null;
      if (!this.#sub.closed) this.#sub.connect(this.#endpoint);
    }, ms);
  }

  #disarm(): void {
    if (this.#endedTimer) clearTimeout(this.#endedTimer);
    this.#endedTimer = null;
  }

  /** After a drop: if libzmq does not connect again, reports why and connects the endpoint again. */
  #armEnded(h: LiveHandlers): void {
    this.#disarm();
    this.#endedTimer = setTimeout(() => {
      this.#endedTimer = null;
      if (this.#sub.closed) return;
      const why = this.#handshakeError
        ? `handshake refused: ${this.#handshakeError}`
        : `the connection ended by a protocol error (a frame over ${MAX_FRAME_BYTES} bytes?)`;
      this.#handshakeError = null;
      // Counted from the drop: at once the first time, then 1 s, 2 s, ... up to 30 s later.
      const delayMs =
        Math.min(SESSION_RETRY_MAX_MS, SESSION_ENDED_MS * 2 ** Math.min(this.#ended, 5)) - SESSION_ENDED_MS;
      this.#ended++;
      h.refused(`${why}; connecting again ${delayMs === 0 ? 'now' : `in ${delayMs} ms`}`);
      this.#connectAgainIn(delayMs);
    }, SESSION_ENDED_MS);
  }

  async #receive(h: LiveHandlers): Promise<void> {
    try {
      for await (const frames of this.#sub) {
        const seq = frames[1];
        const payload = frames[2];
        if (frames.length !== 3 || seq?.length !== 8 || payload === undefined) h.malformed(frames.length);
        else {
          this.#ended = 0;
          h.batch(seq.readBigUInt64BE(), payload);
        }
      }
    } catch (err) {
      if (!this.#sub.closed) throw err;
    }
  }
}

export interface RankStats extends FollowerCounters {
  rank: number;
  endpoint: string;
  /** What reads the live socket: a native link relaying in order on its own thread, or zeromq.js. */
  feed: 'native' | 'zeromq.js';
  connected: boolean;
  /** The last engine seq applied, or `null`. */
  lastEngineSeq: bigint | null;
  /** A replay fetch is in progress (live batches are held meanwhile). */
  fetching: boolean;
  /** Messages that were not `[topic, 8-byte seq, payload]`. */
  malformed: number;
  /** Payloads that did not decode (then the rank is cleared). */
  undecodable: number;
  /**
   * The rank's last error, or `null`: a live connection ended for bad input (zeromq.js feed), its
   * state failing to load or loaded with a seq refused (`resync`).
   */
  lastError: string | null;
}

/**
 * The bytes of engine batches merged into one outbound batch, at most: the relay's own time per
 * batch grows with it (bench/README.md "Engine relay": with 64 KiB its p99 at half its top rate
 * is about 1 ms there, against 1.6-8.8 ms for groups of up to 64 batches, for about 10 % of the
 * throughput).
 */
const DEFAULT_COALESCE_BYTES = 65_536;

/** The engine's first seq: vLLM and SGLang number batches from 0. */
const ENGINE_FIRST_SEQ = 0n;

/** One DP rank: its SUB socket, its follower, and replay fetches. */
class RankLink {
  /** The subscription's rank (the socket it reads). */
  readonly rank: number;
  /** The rank batches are published under; `null`: the payload's own (TensorRT-LLM). */
  readonly #relayRank: number | null;
  /** The ranks this subscription's state covers: what a clear clears. */
  readonly ranks: readonly number[];
  readonly endpoint: string;
  readonly replayEndpoint: string | null;
  readonly follower: RankFollower;
  connected = false;
  malformed = 0;
  undecodable = 0;
  lastError: string | null = null;
  readonly #feed: LiveFeed;
  /** The live socket connected before and lost its connection since. */
  #lost = false;
  readonly #source: EngineZmqSource;
  readonly #sink: RelaySink;
  /** Replay fetches in progress, closed on stop. */
  readonly #fetches = new Map<Dealer, Promise<void>>();
  /** State loads in progress (`resync`). */
  readonly #resyncs = new Set<Promise<void>>();
  /** Loads of the state that failed in a row, and the timer of the next try. */
  #resyncFailures = 0;
  #resyncTimer: NodeJS.Timeout | null = null;
  /** Batches the follower said to apply, not relayed yet: what arrived together goes on as one. */
  #waiting: EngineBatch[] = [];
  #waitingBytes = 0;
  readonly #coalesceBytes: number;

  constructor(
    source: EngineZmqSource,
    sink: RelaySink,
    ranks: number[],
    relayRank: number | null,
    endpoint: string,
    replay: string | null,
  ) {
    this.#source = source;
    this.#sink = sink;
    this.rank = ranks[0] as number;
    this.ranks = ranks;
    this.#relayRank = relayRank;
    this.endpoint = endpoint;
    this.replayEndpoint = replay;
    this.follower = new RankFollower({
      replay: replay !== null,
      firstSeq: source.options.firstSeq ?? ENGINE_FIRST_SEQ,
      resync: source.options.resync !== undefined,
      onCount: (what) => source.options.onCount?.(this.rank, what),
      onRefused: (what, seq) => {
        const why = `seq ${seq} is further ahead of the live stream than any in flight`;
        // A loaded state was applied before its seq was refused: the rank is cleared after it.
        this.lastError = what === 'state' ? `loaded state refused: its ${why}` : `replay refused: ${why}`;
        this.#source.warn(what === 'state' ? 'loaded state refused' : 'engine replay refused', {
          rank: this.ranks.join(','),
          error: why,
        });
      },
    });
    this.#feed =
      source.options.liveFeed?.(endpoint) ??
      nativeFeed(sink, endpoint, relayRank, source.options, source.coalesceBytes) ??
      new ZmqjsFeed(endpoint, source.options);
    this.#coalesceBytes = source.coalesceBytes;
  }

  start(): void {
    this.#feed.start({
      batch: (seq, payload) => {
        this.#run(this.follower.live({ seq, payload, receivedAt: performance.now() }));
        // More already arrived: it joins what waits, up to the cap.
        if (!this.#feed.more) {
          this.#relayWaiting();
          this.#reopen();
        }
      },
      malformed: (frames) => {
        this.malformed++;
        this.#source.warn('malformed engine message skipped', { rank: this.rank, frames });
        this.#reopen();
      },
      refused: (why) => {
        this.malformed++;
        this.lastError = why;
        this.#source.warn('engine connection refused', { rank: this.rank, reason: why });
      },
      failed: (why) => {
        this.lastError = why;
      },
      connected: () => {
        this.connected = true;
        if (this.#lost) this.#run(this.follower.reconnected());
        this.#reopen();
      },
      disconnected: () => {
        this.connected = false;
        this.#lost = true;
      },
      appliedElsewhere: (lastSeq, batches) => this.follower.appliedElsewhere(lastSeq, batches),
    });
    if (this.#source.holding) this.follower.hold();
    if (this.#source.options.fetchOnJoin) this.#run(this.follower.join());
  }

  /** Holds live batches until `release` (`RankFollower.hold`). */
  hold(): void {
    this.#run(this.follower.hold());
  }

  /** Ends `hold` (`RankFollower.release`): what was held is applied, in order. */
  release(known: boolean): void {
    this.#run(this.follower.release(known));
    // Not known: the join fetch the hold put off, unless what was held began the rank already.
    if (!known && this.#source.options.fetchOnJoin) this.#run(this.follower.join());
    this.#relayWaiting();
    this.#reopen();
  }

  /** `native` (relayed on the link thread) or `zeromq.js`. */
  get feedKind(): 'native' | 'zeromq.js' {
    return this.#feed instanceof ZmqjsFeed ? 'zeromq.js' : 'native';
  }

  /** The times of the batches the feed relayed itself since last asked, or `null`. */
  feedLatencies(): Float64Array | null {
    return this.#feed.takeLatencies?.() ?? null;
  }

  /** What the feed applied itself and has not reported yet. */
  feedStint(): { lastSeq: bigint | null; batches: number } {
    return this.#feed.stint?.() ?? { lastSeq: null, batches: 0 };
  }

  /**
   * In order with nothing held or waiting: a feed that can apply batches itself takes over.
   * Called only once what a delivery or fetch asked for is done (never between steps).
   */
  #reopen(): void {
    if (this.#feed.reopen === undefined || this.#waiting.length > 0) return;
    const next = this.follower.inOrderNext;
    if (next !== null) this.#feed.reopen(next);
  }

  async stop(): Promise<void> {
    try {
      this.#relayWaiting();
    } catch {
      // The sink closed first: what waited goes with it.
    }
    if (this.#resyncTimer) clearTimeout(this.#resyncTimer);
    this.#resyncTimer = null;
    const closing = this.#feed.close();
    for (const d of this.#fetches.keys()) d.close();
    await Promise.allSettled([closing, ...this.#fetches.values(), ...this.#resyncs]);
  }

  #run(steps: FollowStep[]): void {
    for (const step of steps) {
      if (step.kind === 'apply') {
        const bytes = step.batch.payload.length;
        if (this.#waitingBytes + bytes > this.#coalesceBytes) this.#relayWaiting();
        this.#waiting.push(step.batch);
        this.#waitingBytes += bytes;
        if (this.#waitingBytes >= this.#coalesceBytes) this.#relayWaiting();
        continue;
      }
      this.#relayWaiting();
      if (step.kind === 'clear') {
        for (const r of this.ranks) this.#sink.clearRank(r);
        this.#source.warn('rank cleared', { rank: this.ranks.join(','), reason: step.reason });
      } else if (step.kind === 'resync') {
        const done = this.#resync(step.fetch, step.reason).finally(() => this.#resyncs.delete(done));
        this.#resyncs.add(done);
      } else {
        const dealer = new (zeromq().Dealer)({
          linger: 0,
          maxMessageSize: MAX_FRAME_BYTES,
          receiveTimeout: this.#source.options.replayTimeoutMs ?? 5000,
        });
        const done = this.#fetch(dealer, step.from, step.fetch).finally(() => this.#fetches.delete(dealer));
        this.#fetches.set(dealer, done);
      }
    }
  }

  /** Relays the waiting batches, as one batch when they decode; else each, skipping what does not. */
  #relayWaiting(): void {
    const batches = this.#waiting;
    if (batches.length === 0) return;
    this.#waiting = [];
    this.#waitingBytes = 0;
    if (batches.length > 1 && this.#relay(batches.map((b) => b.payload)) === null) {
      for (const b of batches) this.#relayed(b);
      return;
    }
    for (const b of batches) {
      const err = this.#relay(b.payload);
      if (err === null) {
        this.#relayed(b);
        continue;
      }
      this.undecodable++;
      // What the feed applied after this batch goes with the rank's state: taken up before the
      // clear, so that what follows the clear starts after it.
      const ahead = this.#feed.shut?.();
      if (ahead && ahead.lastSeq !== null) this.follower.appliedElsewhere(ahead.lastSeq, ahead.batches);
      this.#source.warn('undecodable engine batch skipped; rank cleared', {
        rank: this.rank,
        seq: b.seq.toString(),
        error: err.message,
      });
      this.#run(this.follower.lost());
    }
  }

  #relayed(b: EngineBatch): void {
    if (b.receivedAt !== undefined) this.#source.latency.add(b.receivedAt);
  }

  /** Relays payloads; the decode error if one does not decode (then nothing was published). */
  #relay(payloads: Buffer | Buffer[]): KvPlaneError | null {
    try {
      this.#sink.relay(payloads, this.#source.dialect, this.#relayRank);
      return null;
    } catch (err) {
      if (!(err instanceof KvPlaneError) || err.code === 'ERR_CLOSED') throw err;
      return err;
    }
  }

  /** Loads the publisher's whole state through the source's `resync`, then goes on from it. */
  async #resync(fetch: number, reason: string): Promise<void> {
    let last: bigint | null = null;
    try {
      last = await (this.#source.options.resync as NonNullable<EngineZmqOptions['resync']>)(this.ranks);
    } catch (err) {
      if (!this.#feed.closed) {
        this.lastError = `loading the state failed: ${(err as Error).message}`;
        this.#source.warn('loading the state failed; rank cleared', {
          rank: this.ranks.join(','),
          reason,
          error: (err as Error).message,
        });
      }
    }
    if (this.#feed.closed) return;
    this.#run(last === null ? this.follower.resyncFailed(fetch) : this.follower.resynced(fetch, last));
    this.#relayWaiting();
    this.#reopen();
    if (last !== null) this.#resyncFailures = 0;
    else this.#resyncLater();
  }

  /**
   * After a failed load the rank was cleared and holds only what came since: the state is loaded
   * again later, 10 s after the failure, doubling to 5 min while loads keep failing, until one
   * succeeds.
   */
  #resyncLater(): void {
    const waitMs = Math.min(RESYNC_RETRY_MAX_MS, RESYNC_RETRY_MS * 2 ** Math.min(this.#resyncFailures, 16));
    this.#resyncFailures++;
    if (this.#resyncTimer) clearTimeout(this.#resyncTimer);
    this.#resyncTimer = setTimeout(() => {
      this.#resyncTimer = null;
      if (!this.#feed.closed) this.#run(this.follower.resyncAgain());
    }, waitMs);
    this.#resyncTimer.unref();
  }

  /**
   * Asks the engine's replay socket for `from..`, feeding the follower until the end marker. A
   * replay that does not end within `REPLAY_DEADLINE_MS`, sends `REPLAY_MALFORMED_MAX` replies
   * that are not batches, or whose connection drops, fails (what the follower does with a replay
   * that timed out); one the follower refuses (a batch far ahead of the live stream) ends there.
   */
  async #fetch(dealer: Dealer, from: bigint, fetch: number): Promise<void> {
    let ok = false;
    const deadline = performance.now() + REPLAY_DEADLINE_MS;
    let malformed = 0;
    const endpoint = this.replayEndpoint as string;
    // A replay's connection that drops fails it at once (a ROUTER forgets a peer that reconnects):
    // libzmq ends it for a frame over the bound, or a handshake it refuses, and the engine may.
    // (`inproc://` reports no events.)
    const lost: { why: string | null } = { why: null };
    if (!endpoint.startsWith('inproc://')) void watchReplay(dealer, lost);
    try {
      dealer.connect(endpoint);
      await dealer.send([Buffer.alloc(0), seqFrame(from)]);
      for (;;) {
        const frames = await dealer.receive();
        // The follower moved on (a restart, another fetch): this replay is not wanted any more.
        if (!this.follower.fetchWanted(fetch)) break;
        if (performance.now() > deadline) throw new Error(`not ended within ${REPLAY_DEADLINE_MS / 1000} s`);
        // [empty, topic?, seq, payload]: the topic frame is there or not depending on the engine.
        const seq = frames[frames.length - 2];
        const payload = frames[frames.length - 1] as Buffer;
        if (frames.length < 3 || seq?.length !== 8) {
          this.malformed++;
          if (++malformed >= REPLAY_MALFORMED_MAX) throw new Error(`${malformed} replies that are not batches`);
          continue;
        }
        if (seq.equals(END_OF_REPLAY)) {
          ok = true;
          break;
        }
        this.#run(this.follower.replayed(fetch, { seq: seq.readBigUInt64BE(), payload }));
        // Refused (far ahead of the live stream): the follower ended this fetch.
        if (!this.follower.fetchWanted(fetch)) break;
        if (!dealer.readable) this.#relayWaiting();
      }
    } catch (err) {
      if (!this.#feed.closed) {
        this.#source.warn('engine replay failed', {
          rank: this.rank,
          from: from.toString(),
          error: lost.why ?? (err as Error).message,
        });
      }
    } finally {
      dealer.close();
    }
    if (!this.#feed.closed) {
      this.#run(this.follower.replayEnded(fetch, ok));
      this.#relayWaiting();
      this.#reopen();
    }
  }
}

/**
 * Closes a replay's `dealer` (its pending receive fails) when its connection drops, saying why in
 * `lost`; ends with the socket.
 */
async function watchReplay(dealer: Dealer, lost: { why: string | null }): Promise<void> {
  let refused: string | null = null;
  try {
    for await (const ev of dealer.events) {
      if (ev.type === 'handshake:error:protocol') refused = `handshake refused: ${ev.error.message} (${ev.error.code})`;
      else if (ev.type === 'disconnect') {
        lost.why = refused ?? `the connection ended (the engine closed it, or a frame over ${MAX_FRAME_BYTES} bytes)`;
        dealer.close();
      } else if (ev.type === 'end') break;
    }
  } catch {
    // The socket closed.
  }
}

/**
 * Relays a vLLM or SGLang engine's KV events (docs/protocol.md#engine-sources): one ZMQ SUB per
 * DP rank, payloads handed to the core as bytes, gaps filled from the engine's replay socket,
 * and a rank whose state is unknown (a gap it cannot fill, an engine restart) cleared downstream.
 */
export class EngineZmqSource implements EventSource {
  readonly name: string;
  readonly kind = 'zmq';
  readonly options: EngineZmqOptions;
  readonly dialect: Dialect;
  /** Live batches' time in the relay, read off the engine's socket to handed to the outputs. */
  readonly latency = new RelayLatency();
  /** `coalesceBytes`, checked. */
  readonly coalesceBytes: number;
  #links: RankLink[] = [];
  /** `start`'s opening, once begun: `stop` waits for it, so that what it opens is closed. */
  #starting: Promise<void> | null = null;
  #stopped = false;
  /** Live batches are held (`hold`) until `release`; links opened meanwhile hold from their start. */
  holding = false;

  constructor(options: EngineZmqOptions) {
    if (!['vllm', 'sglang', 'trtllm'].includes(options.engine)) {
      invalidArg(`engine ${options.engine}: vllm, sglang or trtllm`);
    }
    const dpSize = options.dpSize ?? 1;
    if (!Number.isInteger(dpSize) || dpSize < 1 || dpSize > 1024)
      invalidArg(`dpSize is ${dpSize}: an integer in 1..1024`);
    this.coalesceBytes = options.coalesceBytes ?? DEFAULT_COALESCE_BYTES;
    if (!Number.isInteger(this.coalesceBytes) || this.coalesceBytes < 0)
      invalidArg(`coalesceBytes is ${this.coalesceBytes}: an integer >= 0`);
    for (const e of [options.endpoint, options.replayEndpoint ?? '']) {
      if (e.includes('*')) invalidArg(`${e} is a bind address: give the engine's host (tcp://HOST:PORT) to connect to`);
    }
    // Gaps are fetched over a zeromq.js DEALER: without the package, this call fails, not a gap
    // minutes later on a callback.
    if (options.replayEndpoint) zeromq();
    this.options = options;
    this.name = options.engine;
    this.dialect = options.engine;
  }

  async start(sink: EventSink): Promise<void> {
    if (this.#starting !== null)
      throw new KvPlaneError('ERR_INVALID_ARG', `the ${this.name} source is already started`);
    // A source runs once: one stopped before it started would otherwise start to nothing.
    if (this.#stopped) throw new KvPlaneError('ERR_INVALID_ARG', `the ${this.name} source is stopped`);
    this.#starting = this.#open(sink);
    await this.#starting;
  }

  async #open(sink: EventSink): Promise<void> {
    const relay = relaySink(sink);
    await relay.flush();
    // Stopped while the sink flushed: nothing is opened (a link opened now would never close).
    if (this.#stopped) return;
    const o = this.options;
    const ranks = Array.from({ length: o.dpSize ?? 1 }, (_, r) => r);
    // The stream opens with every rank it serves cleared: a consumer drops what an earlier relay
    // told it about these ranks.
    for (const rank of ranks) relay.clearRank(rank);
    const endpoint = (rank: number) => zmqAddress(endpointForRank(o.endpoint, rank));
    const replay = (rank: number) => (o.replayEndpoint ? zmqAddress(endpointForRank(o.replayEndpoint, rank)) : null);
    // One socket per rank, except TensorRT-LLM's one socket for all its attention-DP ranks.
    const links =
      o.engine === 'trtllm'
        ? [new RankLink(this, relay, ranks, null, endpoint(0), replay(0))]
        : ranks.map((r) => new RankLink(this, relay, [r], r, endpoint(r), replay(r)));
    for (const link of links) {
      this.#links.push(link);
      link.start();
    }
  }

  /**
   * Holds every rank's live batches (applies none) until `release`, while their state is loaded
   * from elsewhere (a router's peer indexer).
   */
  hold(): void {
    this.holding = true;
    for (const l of this.#links) l.hold();
  }

  /** Ends `hold`. `known`: the ranks' state before what was held was loaded (`RankFollower.release`). */
  release(known: boolean): void {
    if (!this.holding) return;
    this.holding = false;
    for (const l of this.#links) l.release(known);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#starting?.catch(() => {});
    await Promise.all(this.#links.map((l) => l.stop()));
  }

  warn(msg: string, detail: Record<string, unknown>): void {
    this.options.onWarning?.(msg, { source: this.name, ...detail });
  }

  /** Per rank: connection, last engine seq, and what was filled, cleared and skipped. */
  ranks(): RankStats[] {
    return this.#links.map((l) => {
      // What a native link applied since it last reported counts as applied.
      const stint = l.feedStint();
      return {
        rank: l.rank,
        endpoint: l.endpoint,
        feed: l.feedKind,
        connected: l.connected,
        lastEngineSeq: stint.lastSeq ?? l.follower.lastSeq,
        fetching: l.follower.fetching,
        malformed: l.malformed,
        undecodable: l.undecodable,
        lastError: l.lastError,
        ...l.follower.counters,
        applied: l.follower.counters.applied + stint.batches,
      };
    });
  }

  stats(): Record<string, unknown> {
    return { ranks: this.ranks(), relayLatencyMs: this.relayLatency() };
  }

  /** The relay's own time per live batch, whichever side relayed it (JS, or a native link). */
  relayLatency(): LatencySummary {
    for (const l of this.#links) {
      const t = l.feedLatencies();
      if (t !== null) this.latency.addTimes(t);
    }
    return this.latency.summary();
  }

  /** Per DP rank, the engine batches before the relay's record of it that it never saw. */
  unknownBefore(): Map<number, bigint> {
    const out = new Map<number, bigint>();
    for (const l of this.#links) for (const r of l.ranks) out.set(r, l.follower.unknownBefore);
    return out;
  }

  health(): SourceHealth {
    if (this.#links.length === 0) return { state: 'stopped', reason: 'not started' };
    const down = this.#links.filter((l) => !l.connected).map((l) => l.rank);
    if (down.length > 0) return { state: 'disconnected', reason: `rank ${down.join(', ')} not connected` };
    return { state: 'ok' };
  }
}
