import { invalidArg, KvPlaneError } from '../../errors.js';
import { BodyTooLargeError, bodyUpTo } from '../../transports/http/body.js';
import { MAX_FRAME_BYTES } from '../../transports/zmq/config.js';
import { type EventSink, type EventSource, type RelaySink, relaySink, type SourceHealth } from '../source.js';

/** TensorRT-LLM's HTTP event drain, as `kvplane serve --engine trtllm --engine-url` polls it. */
export interface TrtllmHttpOptions {
  /** `trtllm-serve`'s base URL (`http://HOST:PORT`); the relay POSTs to `/kv_cache_events`. */
  url: string;
  /** Time between drains. Default 100 ms. */
  pollMs?: number;
  /** Attention-DP ranks (each event names its own): cleared at start and on an unreadable drain. Default 1. */
  dpSize?: number;
  /** A drain that takes longer is abandoned (and counted). Default 5 s. */
  timeoutMs?: number;
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
}

export interface TrtllmRankStats {
  rank: number;
  /** The event id expected next, or `null` before the first. */
  nextEventId: bigint | null;
  /** Event ids skipped (TensorRT-LLM's bounded buffer dropped events): the rank was cleared. */
  gaps: number;
  /** Event ids falling back (a restarted engine): the rank was cleared. */
  restarts: number;
}

/** The largest drain read (one drain is all the engine buffered since the last): as a ZMQ frame. */
const DRAIN_BYTES = MAX_FRAME_BYTES;

/**
 * Relays TensorRT-LLM's KV events by polling `POST /kv_cache_events` on `trtllm-serve`
 * (docs/protocol.md#engine-sources): each drain is destructive and returns a JSON list of V1 or
 * V2 events; the list goes to the core as bytes, each batch under its `attention_dp_rank`, and a
 * rank whose event ids do not continue (a gap, or a restart falling back to 0) is cleared
 * downstream before the batch that broke them.
 */
export class TrtllmHttpSource implements EventSource {
  readonly name = 'trtllm';
  readonly kind = 'http';
  readonly #opts: Required<Omit<TrtllmHttpOptions, 'onWarning'>> & Pick<TrtllmHttpOptions, 'onWarning'>;
  readonly #nextIds = new Map<number, bigint>();
  readonly #ranks = new Map<number, TrtllmRankStats>();
  #sink: RelaySink | null = null;
  #loop: Promise<void> | null = null;
  #stopping = false;
  #abort: AbortController | null = null;
  #connected = false;
  #counters = { polls: 0, emptyDrains: 0, failedPolls: 0, undecodable: 0, oversizeDrains: 0, events: 0 };

  constructor(options: TrtllmHttpOptions) {
    const url = URL.canParse(options.url) ? new URL('/kv_cache_events', options.url) : null;
    if (url === null) invalidArg(`--engine-url ${options.url}: an http://HOST:PORT URL`);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') invalidArg(`--engine-url ${options.url}: http or https`);
    const dpSize = options.dpSize ?? 1;
    if (!Number.isInteger(dpSize) || dpSize < 1 || dpSize > 1024)
      invalidArg(`dpSize is ${dpSize}: an integer in 1..1024`);
    this.#opts = { pollMs: 100, timeoutMs: 5000, ...options, url: url.href, dpSize };
  }

  async start(sink: EventSink): Promise<void> {
    if (this.#loop) throw new KvPlaneError('ERR_INVALID_ARG', 'the trtllm source is already started');
    const relay = relaySink(sink);
    await relay.flush();
    for (let r = 0; r < this.#opts.dpSize; r++) relay.clearRank(r);
    this.#sink = relay;
    this.#loop = this.#poll();
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    this.#abort?.abort();
    await this.#loop;
  }

  async #poll(): Promise<void> {
    while (!this.#stopping) {
      await this.#drainOnce();
      if (!this.#stopping) await new Promise((r) => setTimeout(r, this.#opts.pollMs));
    }
  }

  async #drainOnce(): Promise<void> {
    this.#counters.polls++;
    this.#abort = new AbortController();
    const timer = setTimeout(() => this.#abort?.abort(), this.#opts.timeoutMs);
    let body: Buffer;
    try {
      const res = await fetch(this.#opts.url, { method: 'POST', signal: this.#abort.signal });
      body = await bodyUpTo(res, DRAIN_BYTES);
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${body.subarray(0, 200).toString()}`);
      this.#connected = true;
    } catch (err) {
      if (this.#stopping) return;
      if (err instanceof BodyTooLargeError) {
        // Drained from the engine and not read: what it held is lost for every rank.
        this.#counters.oversizeDrains++;
        this.#warn('TensorRT-LLM drain over the bound refused; ranks cleared', { error: err.message });
        this.#clearAll();
        return;
      }
      this.#counters.failedPolls++;
      if (this.#connected) this.#warn('TensorRT-LLM event drain failed', { error: (err as Error).message });
      this.#connected = false;
      return;
    } finally {
      clearTimeout(timer);
    }
    const text = body.toString('utf8').trim();
    if (text === '' || text === '[]' || text === 'null') {
      this.#counters.emptyDrains++;
      return;
    }
    const sink = this.#sink as RelaySink;
    try {
      const breaks = sink.relayWithEventIds(body, 'trtllm_json', this.#nextIds);
      for (const b of breaks) {
        const st = this.#rank(b.dpRank);
        if (b.kind === 'gap') st.gaps++;
        else st.restarts++;
        this.#warn('rank cleared', { rank: b.dpRank, reason: b.kind });
      }
      for (const [r, id] of this.#nextIds) this.#rank(r).nextEventId = id;
    } catch (err) {
      if (!(err instanceof KvPlaneError) || err.code === 'ERR_CLOSED') throw err;
      // The drain is gone from the engine: whatever it held is lost for every rank.
      this.#counters.undecodable++;
      this.#warn('undecodable TensorRT-LLM drain skipped; ranks cleared', { error: err.message });
      this.#clearAll();
    }
  }

  /** Every rank cleared downstream, and their event ids forgotten (the next drain starts them). */
  #clearAll(): void {
    for (let r = 0; r < this.#opts.dpSize; r++) this.#sink?.clearRank(r);
    this.#nextIds.clear();
  }

  #rank(rank: number): TrtllmRankStats {
    let st = this.#ranks.get(rank);
    if (!st) {
      st = { rank, nextEventId: null, gaps: 0, restarts: 0 };
      this.#ranks.set(rank, st);
    }
    return st;
  }

  #warn(msg: string, detail: Record<string, unknown>): void {
    this.#opts.onWarning?.(msg, { source: this.name, ...detail });
  }

  stats(): Record<string, unknown> {
    return { ...this.#counters, ranks: [...this.#ranks.values()].map((r) => ({ ...r })) };
  }

  health(): SourceHealth {
    if (!this.#loop) return { state: 'stopped', reason: 'not started' };
    if (!this.#connected) return { state: 'disconnected', reason: `no drain from ${this.#opts.url}` };
    return { state: 'ok' };
  }
}
