import type { Router } from 'zeromq';
import { bindOrThrow } from '../../errors.js';
import type { LocalIndexer } from '../../indexer.js';
import { zeromq } from '../../optional.js';
import { trimMemorySoon } from '../memory.js';
import { ReplayCache } from './replay_cache.js';
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
/**
 * Replays served at once; later requests wait their turn. Each session may hold its send budget
 * in the socket, so this bounds what replays hold in all (16 × 8 MiB by default).
 */
export const MAX_REPLAY_SESSIONS = 16;
/** Requests that may wait for a session; beyond it a request is refused (the end marker alone) and counted. */
export const MAX_REPLAY_WAITING = 4096;
/** Requests one peer may have waiting; past them its next is refused as past `MAX_REPLAY_WAITING`. */
export const MAX_WAITING_PER_PEER = 64;
/** The largest frame a replay peer may send (a request's seq is 8 bytes; its delimiter empty). */
export const REQUEST_MAX_BYTES = 1024;
/**
 * How long a reply may wait on a full peer while requests of other peers wait for a session:
 * past it (or `sendTimeoutMs`, if shorter) the replay is abandoned, so peers that stop reading
 * hold the sessions for seconds, not the whole send timeout. A kvplane router gives up on a
 * replay after 5 s itself.
 */
export const CONTENDED_STALL_MS = 5000;
/** Batches fetched from the log per native call (each session holds one chunk's copies). */
const CHUNK = 8;
/** Logged batches kept for the replays in progress, shared by them (`ReplayCache`). */
const REPLAY_CACHE_BYTES = 64 * 1024 * 1024;

/** A request waiting for a session: its peer's identity (and as a map key), and its start. */
interface Waiting {
  id: Buffer;
  peer: string;
  start: bigint | null;
}

/** Counters of the replay socket. */
export interface ReplayCounters {
  requests: number;
  /** Requests that were not `[empty, 8-byte seq]` (answered with the end marker alone). */
  malformed: number;
  /** Replays abandoned: the peer left or stayed full past the send timeout. */
  abandoned: number;
  /** Requests refused (the end marker alone): `MAX_REPLAY_WAITING` in all, or `MAX_WAITING_PER_PEER` of its peer's, were already waiting. */
  refused: number;
  batchesSent: number;
  /** Batches copied out of the log for replays; the rest were sent from the replay cache. */
  batchesCopied: number;
}

/** Counters of a replay socket that has served nothing. */
export function noReplays(): ReplayCounters {
  return { requests: 0, malformed: 0, abandoned: 0, refused: 0, batchesSent: 0, batchesCopied: 0 };
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
  readonly counters: ReplayCounters = noReplays();
  readonly #cache = new ReplayCache(REPLAY_CACHE_BYTES);
  #loop: Promise<void> = Promise.resolve();
  #sessions = new Set<Promise<void>>();
  /** Requests waiting for a session, in order; `start` null: a malformed one (the end marker alone). */
  readonly #waiting: Waiting[] = [];
  /** Peers (identities) with a session running: a peer is served one request at a time. */
  readonly #busy = new Set<string>();
  /** Per peer, its requests waiting. */
  readonly #waitingOf = new Map<string, number>();

  private constructor(router: Router, opts: ReplayServerOptions) {
    this.#router = router;
    this.#opts = opts;
    this.#prefix = opts.topicFrame ? [opts.topic] : [];
    this.#writer = new SocketWriter(router, () => {
      this.counters.abandoned++;
    });
  }

  static async create(opts: ReplayServerOptions): Promise<ReplayServer> {
    const router = new (zeromq().Router)({
      // A request is a seq of 8 bytes: a peer sending a frame over this is disconnected by libzmq
      // as its header announces it, instead of being buffered (up to any size) to be refused.
      maxMessageSize: REQUEST_MAX_BYTES,
      mandatory: true,
      sendTimeout: 0,
      sendHighWaterMark: opts.hwm,
      linger: 0,
      ...opts.curve,
    });
    try {
      if (opts.bind) await bindOrThrow('the ZMQ replay socket', opts.endpoint, () => router.bind(opts.endpoint));
      else router.connect(opts.endpoint);
    } catch (err) {
      router.close();
      throw err;
    }
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
        const peer = id.toString('latin1');
        const mine = this.#waitingOf.get(peer) ?? 0;
        if (this.#waiting.length >= MAX_REPLAY_WAITING || mine >= MAX_WAITING_PER_PEER) {
          // Sent once, if the peer has room (else counted abandoned): waiting for it here would
          // take what the bound is for.
          this.counters.refused++;
          this.#writer.push([id, EMPTY, ...this.#prefix, END_OF_REPLAY, EMPTY]);
          continue;
        }
        // Every request gets an answer, so a REQ peer is never left waiting: a malformed one an
        // empty replay, in its turn and waited for as any reply.
        if (!wellFormed) this.counters.malformed++;
        this.#waiting.push({ id, peer, start: wellFormed ? start.readBigUInt64BE() : null });
        this.#waitingOf.set(peer, mine + 1);
        this.#startSessions();
      }
    } catch (err) {
      if (!this.#router.closed) throw err;
    }
  }

  /**
   * Starts waiting replays, oldest first, while fewer than `MAX_REPLAY_SESSIONS` run, each peer
   * one at a time: a peer that asks again and again (or stops reading) holds one session, not all.
   */
  #startSessions(): void {
    for (let i = 0; i < this.#waiting.length && this.#sessions.size < MAX_REPLAY_SESSIONS; ) {
      if (this.#router.closed) return;
      const { id, peer, start } = this.#waiting[i] as Waiting;
      if (this.#busy.has(peer)) {
        i++;
        continue;
      }
      this.#waiting.splice(i, 1);
      this.#unwait(peer);
      this.#busy.add(peer);
      const session = this.#replay(id, start).then((served) => {
        this.#busy.delete(peer);
        // A peer that left or stayed full past the send timeout would fail its other requests
        // the same way, each holding a session as long: they are dropped, counted.
        if (!served) this.#dropWaiting(peer);
      });
      const done = session.finally(() => {
        this.#sessions.delete(done);
        this.#startSessions();
        if (this.#sessions.size === 0) {
          this.#cache.clear();
          trimMemorySoon();
        }
      });
      this.#sessions.add(done);
    }
  }

  /** Drops `peer`'s waiting requests, each counted abandoned. */
  #dropWaiting(peer: string): void {
    if (!this.#waitingOf.has(peer)) return;
    for (let i = this.#waiting.length - 1; i >= 0; i--) {
      if ((this.#waiting[i] as Waiting).peer !== peer) continue;
      this.#waiting.splice(i, 1);
      this.counters.abandoned++;
    }
    this.#waitingOf.delete(peer);
  }

  #unwait(peer: string): void {
    const n = (this.#waitingOf.get(peer) ?? 1) - 1;
    if (n === 0) this.#waitingOf.delete(peer);
    else this.#waitingOf.set(peer, n);
  }

  /** Sends `id` its replay from `start` (null: the end marker alone); false once abandoned. */
  async #replay(id: Buffer, start: bigint | null): Promise<boolean> {
    const ix = this.#opts.indexer;
    // Replay up to the newest batch at the time of the request; live batches after it are the
    // live stream's.
    const last = ix.lastSeq;
    let next = start ?? last + 1n;
    try {
      while (next <= last) {
        const copied = this.#cache.misses;
        const { seqs, payloads } = this.#cache.read(ix, next, CHUNK);
        this.counters.batchesCopied += this.#cache.misses - copied;
        if (seqs.length === 0) break;
        for (let i = 0; i < seqs.length; i++) {
          const seq = seqs[i] as bigint;
          if (seq > last) break;
          await this.#sendTo([id, EMPTY, ...this.#prefix, seqFrame(seq), payloads[i] as Buffer]);
          this.counters.batchesSent++;
        }
        next = (seqs[seqs.length - 1] as bigint) + 1n;
      }
      await this.#sendTo([id, EMPTY, ...this.#prefix, END_OF_REPLAY, EMPTY]);
      return true;
    } catch {
      this.counters.abandoned++;
      return false;
    }
  }

  /** Whether requests of peers without a session wait for one. */
  #othersWaiting(): boolean {
    let theirs = this.#waiting.length;
    for (const peer of this.#busy) theirs -= this.#waitingOf.get(peer) ?? 0;
    return theirs > 0;
  }

  /**
   * Sends one reply to its peer. The ROUTER never blocks (send timeout 0), so one full peer holds
   * up no other: a peer at its HWM (EAGAIN) is retried with a short backoff until
   * `sendTimeoutMs` passes without the message going out (`CONTENDED_STALL_MS` while other peers
   * wait); a peer that left fails at once.
   */
  async #sendTo(frames: Buffer[]): Promise<void> {
    const since = Date.now();
    const deadline = since + this.#opts.sendTimeoutMs;
    const contended = since + Math.min(CONTENDED_STALL_MS, this.#opts.sendTimeoutMs);
    for (let wait = 1; ; wait = Math.min(wait * 2, 50)) {
      try {
        return await this.#writer.send(frames);
      } catch (err) {
        const full = (err as { code?: string }).code === 'EAGAIN';
        const now = Date.now();
        const late = now >= deadline || (now >= contended && this.#othersWaiting());
        if (!full || late || this.#router.closed) throw err;
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }

  async close(): Promise<void> {
    this.#router.close();
    await Promise.allSettled([this.#loop, ...this.#sessions]);
  }
}
