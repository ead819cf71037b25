import { KvPlaneError } from '../../errors.js';
import type { EventSink, EventSource, SourceHealth } from '../source.js';
import { SimEngine, type SimEngineOptions, type SimStats } from './engine.js';

/** The built-in simulated engine as an event source (the default of `kvplane serve`). */
export class SimSource implements EventSource {
  readonly name = 'sim';
  readonly kind = 'sim';
  readonly #options: SimEngineOptions;
  #engine: SimEngine | null = null;
  #running = false;

  constructor(options: SimEngineOptions = {}) {
    this.#options = options;
  }

  /** The running engine, once started. */
  get engine(): SimEngine | null {
    return this.#engine;
  }

  async start(sink: EventSink): Promise<void> {
    if (this.#engine) throw new KvPlaneError('ERR_INVALID_ARG', 'the sim source is already started');
    this.#engine = new SimEngine(sink, this.#options);
    this.#engine.start();
    this.#running = true;
  }

  async stop(): Promise<void> {
    this.#engine?.stop();
    this.#running = false;
  }

  stats(): SimStats & Record<string, unknown> {
    return { ...(this.#engine?.stats ?? emptyStats()) };
  }

  health(): SourceHealth {
    if (this.#running) return { state: 'ok' };
    return { state: 'stopped', reason: this.#engine ? 'stopped' : 'not started' };
  }
}

function emptyStats(): SimStats {
  return { steps: 0, requests: 0, rejected: 0, running: 0, hitBlocks: 0, missBlocks: 0, evictions: 0, cachedBlocks: 0 };
}
