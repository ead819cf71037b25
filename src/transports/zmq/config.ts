import { invalidArg } from '../../errors.js';
import { camelKey } from '../../options.js';

/**
 * Publisher settings under the names of vLLM's `KVEventsConfig` (camelCase here; the snake_case
 * names are accepted by `kvEventsConfigFromJson`).
 */
export interface KvEventsConfig {
  /**
   * Live stream endpoint. Default `'tcp://*:5557'`. Bound if it has `*`, `::`, `ipc://` or
   * `inproc://`, else connected (vLLM's rule); `bind:` or `connect:` before the address says which.
   */
  endpoint?: string;
  /** Replay ROUTER endpoint; none by default (no replay). */
  replayEndpoint?: string | null;
  /** Batches retained for replay and `/kv_recover`. Default 10,000. */
  bufferSteps?: number;
  /**
   * ZMQ send high-water mark of the live socket, per subscriber, in messages. Default 512: about
   * 64 MiB of full batches (`hwmForBytes(LIVE_SEND_BUDGET_BYTES)`). kvplane's batches carry up to
   * 1024 events, so vLLM's default of 100,000 messages would let one stalled subscriber hold
   * gigabytes.
   */
  hwm?: number;
  /** Events the publish queue holds before it drops (and counts) them. Default 100,000. */
  maxQueueSize?: number;
  /** Topic frame of every message. Default `''`. */
  topic?: string;
}

/**
 * Bytes of a full batch, what send HWMs are sized from: 1024 events of a block or two with their
 * tokens (the simulated engine's batches measure about 115 KiB at 1024 events).
 */
export const FULL_BATCH_BYTES = 128 * 1024;
/** What one live subscriber may hold queued in the publisher. */
export const LIVE_SEND_BUDGET_BYTES = 64 * 1024 * 1024;
/** What one replay peer may hold queued in the publisher before its replay waits (then is abandoned). */
export const REPLAY_SEND_BUDGET_BYTES = 8 * 1024 * 1024;

/**
 * The largest message read from a node by the engine replay's DEALER and a gRPC subscription: a
 * larger one ends the connection (or the call) instead of being buffered whole. The native link's
 * bound is the same (`max_frame` in crates/kvplane-zmq/src/link.rs).
 */
export const MAX_FRAME_BYTES = 256 * 1024 * 1024;

/**
 * A send HWM, in messages, holding about `bytes` of full batches. ZMQ counts a socket's queue in
 * messages, not bytes: the budget holds for batches up to `FULL_BATCH_BYTES`.
 */
export function hwmForBytes(bytes: number): number {
  return Math.max(8, Math.ceil(bytes / FULL_BATCH_BYTES));
}

export const KV_EVENTS_DEFAULTS = {
  endpoint: 'tcp://*:5557',
  replayEndpoint: null,
  bufferSteps: 10_000,
  hwm: hwmForBytes(LIVE_SEND_BUDGET_BYTES),
  maxQueueSize: 100_000,
  topic: '',
} as const satisfies Required<KvEventsConfig>;

const SNAKE: Record<string, keyof KvEventsConfig> = {
  endpoint: 'endpoint',
  replay_endpoint: 'replayEndpoint',
  buffer_steps: 'bufferSteps',
  hwm: 'hwm',
  max_queue_size: 'maxQueueSize',
  topic: 'topic',
};

/** vLLM `KVEventsConfig` keys that configure the engine, not the publisher: accepted, not used here. */
const ENGINE_KEYS = new Set(['enable_kv_cache_events', 'publisher', 'enableKvCacheEvents']);

/**
 * Reads a `KVEventsConfig` object from JSON (snake_case or camelCase keys). Unknown keys are an
 * `ERR_INVALID_ARG` so typos do not pass silently.
 */
export function kvEventsConfigFromJson(json: Record<string, unknown>): KvEventsConfig & { publisher?: string } {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(json)) {
    if (ENGINE_KEYS.has(key)) {
      if (key === 'publisher') out.publisher = value;
      continue;
    }
    const name = camelKey(SNAKE, key);
    if (name === undefined) invalidArg(`unknown KV events config key ${JSON.stringify(key)}`);
    out[name] = value;
  }
  if (out.publisher !== undefined && out.publisher !== 'zmq' && out.publisher !== 'null') {
    invalidArg(`publisher is ${JSON.stringify(out.publisher)}: "zmq" or "null"`);
  }
  return out as KvEventsConfig & { publisher?: string };
}

/** An endpoint with an explicit mode: `bind:` or `connect:` before the ZMQ address. */
const MODE = /^(bind|connect):(?=[a-z]+:\/\/)/;

/**
 * Whether an endpoint is bound. `bind:tcp://127.0.0.1:5557` binds (serving on loopback only) and
 * `connect:...` connects, whatever the address; otherwise vLLM's rule: bind when the address is a
 * wildcard or a local transport, connect to anything else.
 */
export function shouldBind(endpoint: string): boolean {
  const mode = MODE.exec(endpoint)?.[1];
  if (mode !== undefined) return mode === 'bind';
  return (
    endpoint.includes('*') ||
    endpoint.includes('::') ||
    endpoint.startsWith('ipc://') ||
    endpoint.startsWith('inproc://')
  );
}

/** The ZMQ address of an endpoint, without its `bind:` / `connect:` mode. */
export function zmqAddress(endpoint: string): string {
  return endpoint.replace(MODE, '');
}

/**
 * Why an endpoint will connect rather than serve, or `null` when it binds: vLLM's rule connects
 * to a specific address, which is easy to mistake for serving on it.
 */
export function connectWarning(endpoint: string): string | null {
  if (shouldBind(endpoint) || MODE.test(endpoint)) return null;
  return `${endpoint} will connect to that address, not serve on it (vLLM's rule binds only *, ::, ipc:// and inproc://); write bind:${endpoint} to serve on it, or connect:${endpoint} to silence this`;
}

/**
 * The endpoint of DP rank `rank`: tcp ports are offset by the rank, inproc names get `_dp{rank}`
 * (rank 0 keeps the endpoint as it is). A `bind:` / `connect:` mode is kept.
 */
export function endpointForRank(endpoint: string, rank: number): string {
  if (!Number.isInteger(rank) || rank < 0) invalidArg(`dataParallelRank is ${rank}: a non-negative integer`);
  if (rank === 0) return endpoint;
  const mode = MODE.exec(endpoint)?.[0] ?? '';
  const address = zmqAddress(endpoint);
  if (address.startsWith('inproc://')) return `${mode}${address}_dp${rank}`;
  if (address.startsWith('tcp://')) {
    const m = /^(tcp:\/\/.*):(\d+)$/.exec(address);
    if (!m) invalidArg(`endpoint ${endpoint} has no port to offset for DP rank ${rank}`);
    return `${mode}${m[1]}:${Number(m[2]) + rank}`;
  }
  return endpoint;
}

/** The largest count grpc-js takes in its options (32-bit integers). */
export const INT32_MAX = 2 ** 31 - 1;

/** `v` checked as an integer in `1..max` (`ERR_INVALID_ARG` naming `name` otherwise). */
export function checkCount(name: string, v: number, max: number): number {
  if (!Number.isInteger(v) || v < 1 || v > max) invalidArg(`${name} is ${v}: an integer in 1..${max}`);
  return v;
}
