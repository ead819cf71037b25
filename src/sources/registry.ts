import { KvPlaneError } from '../errors.js';
import { TrtllmHttpSource } from './engine/trtllm_http.js';
import { EngineZmqSource } from './engine/zmq_source.js';
import type { SimEngineOptions } from './sim/engine.js';
import { SimSource } from './sim/source.js';
import type { EventSource } from './source.js';

/** What `kvplane serve` hands a source factory: the node's block size and the source's settings. */
export interface SourceSettings {
  blockSize?: number;
  /** The simulated engine's settings (`--sim-*`, the config file's `sim` section). */
  sim: SimEngineOptions;
  /** A real engine's publisher (`--engine-*`, the config file's `engine_*` keys). */
  engine?: EngineSettings;
  /** Warnings for the node's log. */
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
}

/** Where a real engine publishes, as `kvplane serve --engine-*` gives it. */
export interface EngineSettings {
  /** TensorRT-LLM's HTTP drain (`trtllm-serve`): polled instead of a ZMQ endpoint. */
  url?: string;
  pollMs?: number;
  endpoint?: string;
  replayEndpoint?: string | null;
  dpSize?: number;
  topic?: string;
  /** The relay's own receive HWM per rank, in messages. */
  receiveHwm?: number;
  /** Payload bytes of engine batches waiting together on a rank relayed as one, at most. */
  coalesceBytes?: number;
  /** Relay each rank on a native link (default true; `EngineZmqOptions.native`). */
  native?: boolean;
}

function engineZmq(engine: 'vllm' | 'sglang' | 'trtllm', s: SourceSettings): EngineZmqSource {
  const e = s.engine ?? {};
  if (e.endpoint === undefined) {
    throw new KvPlaneError(
      'ERR_INVALID_ARG',
      `--engine ${engine} needs --engine-endpoint tcp://HOST:PORT (the engine's KV events publisher)`,
    );
  }
  return new EngineZmqSource({ engine, ...e, endpoint: e.endpoint, onWarning: s.onWarning });
}

export interface SourceEntry {
  /** One line for `kvplane serve --help`. */
  help: string;
  create(settings: SourceSettings): EventSource;
}

/** Every source `kvplane serve --engine NAME` can run, by name. */
export const SOURCES: Readonly<Record<string, SourceEntry>> = {
  sim: {
    help: 'the built-in simulated engine',
    create: (s) => new SimSource({ blockSize: s.blockSize, ...s.sim }),
  },
  vllm: {
    help: "a vLLM engine's ZMQ KV events (--engine-endpoint, --engine-replay-endpoint, --engine-dp-size)",
    create: (s) => engineZmq('vllm', s),
  },
  sglang: {
    help: "an SGLang engine's ZMQ KV events (as vllm)",
    create: (s) => engineZmq('sglang', s),
  },
  trtllm: {
    help: "a TensorRT-LLM engine's KV events: its ZMQ publisher (--engine-endpoint), or trtllm-serve's HTTP drain polled (--engine-url, --engine-poll-ms)",
    create: (s) =>
      s.engine?.url !== undefined
        ? new TrtllmHttpSource({
            url: s.engine.url,
            pollMs: s.engine.pollMs,
            dpSize: s.engine.dpSize,
            onWarning: s.onWarning,
          })
        : engineZmq('trtllm', s),
  },
};

export function sourceNames(): string[] {
  return Object.keys(SOURCES);
}

/** Checks a source name against the registry. */
export function checkSourceName(name: string): string {
  if (!Object.hasOwn(SOURCES, name)) {
    throw new KvPlaneError('ERR_INVALID_ARG', `--engine ${name}: unknown engine; known: ${sourceNames().join(', ')}`);
  }
  return name;
}

/** Creates the named source. */
export function createSource(name: string, settings: SourceSettings): EventSource {
  return (SOURCES[checkSourceName(name)] as SourceEntry).create(settings);
}
