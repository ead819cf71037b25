import type * as Native from '../../../index.js';
import { callNative } from '../../errors.js';
import native from '../../native.js';
import { ENGINE_METHODS } from './engine_methods.js';
import { status } from './status.js';
import type { GrpcUpstream } from './upstream.js';

/**
 * Poll intervals an answer stays current for: how old a sent record may be, and how long a poll
 * may take (a slow engine's answer is still one worth sending).
 */
const CURRENT_FOR_INTERVALS = 3;

/** The engine's latest load, as the streams' records carry it. */
export interface CurrentLoad {
  loads: Native.NativeEngineLoads;
  /** Age of the `GetLoads` answer behind it. */
  ageMs: number;
}

/** Where a stream reads the engine's load from. */
export interface LoadFeed {
  /** The latest answer, or `null` when there is none recent enough to send. */
  current(): CurrentLoad | null;
}

export interface LoadPollStats {
  /** The engine service answering `GetLoads`, once found. */
  service: string | null;
  polls: number;
  failures: number;
}

/**
 * Polls the engine's own `GetLoads` through the upstream (docs/protocol.md#load-records), so the
 * `SubscribeKvEvents` streams carry its load as `EngineLoad` records. The service answering it is
 * found by asking each registered one that declares `GetLoads` (TensorRT-LLM's does not). An
 * answer older than three intervals is not sent: the gateway then polls `GetLoads` itself, through
 * the proxy, as it does with any servicer without records.
 */
export class EngineLoadPoller implements LoadFeed {
  readonly #upstream: GrpcUpstream;
  readonly #services: string[];
  readonly #intervalMs: number;
  readonly #onPoll: () => void;
  readonly #request = callNative(() => native.getLoadsRequest());
  #latest: { loads: Native.NativeEngineLoads; at: number } | null = null;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  readonly stats: LoadPollStats = { service: null, polls: 0, failures: 0 };

  /** `onPoll` runs after each answer (the streams' heartbeat). */
  constructor(upstream: GrpcUpstream, services: readonly string[], intervalMs: number, onPoll: () => void) {
    this.#upstream = upstream;
    this.#services = services.filter((s) => ENGINE_METHODS[s]?.some((m) => m.name === 'GetLoads'));
    this.#intervalMs = intervalMs;
    this.#onPoll = onPoll;
  }

  start(): void {
    if (this.#services.length > 0) void this.#loop();
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
  }

  current(): CurrentLoad | null {
    const l = this.#latest;
    if (l === null) return null;
    const ageMs = Date.now() - l.at;
    return ageMs > CURRENT_FOR_INTERVALS * this.#intervalMs ? null : { loads: l.loads, ageMs };
  }

  async #loop(): Promise<void> {
    while (!this.#stopped) {
      await this.#poll();
      if (this.#stopped) return;
      await new Promise<void>((resolve) => {
        this.#timer = setTimeout(resolve, this.#intervalMs);
      });
    }
  }

  async #poll(): Promise<void> {
    const known = this.stats.service;
    for (const service of known === null ? this.#services : [known]) {
      try {
        const deadlineMs = CURRENT_FOR_INTERVALS * this.#intervalMs;
        const answer = await this.#upstream.unary(`/${service}/GetLoads`, this.#request, deadlineMs);
        this.#latest = { loads: callNative(() => new native.NativeEngineLoads(answer, service)), at: Date.now() };
        this.stats.service = service;
        this.stats.polls++;
        this.#onPoll();
        return;
      } catch (err) {
        // Another engine's service: try the next one (and look again if the engine changed).
        if ((err as { code?: number }).code === status.UNIMPLEMENTED) {
          this.stats.service = null;
          continue;
        }
        break;
      }
    }
    this.stats.failures++;
  }
}
