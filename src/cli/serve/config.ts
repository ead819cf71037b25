import { KvPlaneError } from '../../errors.js';
import type { ZmqFormat } from '../../indexer.js';
import { camelKey } from '../../options.js';
import type { KvEventPublisherOptions } from '../../publisher.js';
import { checkSourceName, type EngineSettings } from '../../sources/registry.js';
import type { SimEngineOptions } from '../../sources/sim/engine.js';
import { kvEventsConfigFromJson } from '../../transports/zmq/config.js';

/** Everything `kvplane serve` runs with, after defaults, the config file and flags. */
export interface ServeConfig {
  /** The event source, by its registry name (`src/sources/registry.ts`). */
  engine: string;
  publisher: KvEventPublisherOptions;
  http: { host: string; port: number } | null;
  /** gRPC `SubscribeKvEvents`; off unless a port is given. TLS files are PEM paths. */
  grpc: GrpcConfig | null;
  /** File holding the bearer token required on gRPC and HTTP (else `KVPLANE_AUTH_TOKEN`). */
  authTokenFile: string | null;
  /** CURVE secret key file for the ZMQ sockets (docs/protocol.md#zmq-curve); none: plain ZMQ. */
  zmqCurveSecretFile: string | null;
  /** Allowed CURVE clients' public keys: a directory of `*.key` certificates or a key file. */
  zmqCurveClients: string | null;
  sim: SimEngineOptions;
  /** The engine a `vllm` / `sglang` source relays. */
  engineSource: EngineSettings;
  /** Stop after this many seconds (0: run until a signal). */
  durationSeconds: number;
  /** Status every this many seconds (a live line on a TTY, a JSON log line otherwise). */
  statusSeconds: number;
}

export interface GrpcConfig {
  host: string;
  port: number;
  maxLagBatches?: number;
  /** Snapshots in progress at once (default 4). */
  maxSnapshots?: number;
  /** The engine's own gRPC server, HOST:PORT: RPCs kvplane does not serve are forwarded to it. */
  upstream?: string;
  /** With `upstream`: the engine's GetLoads poll for load records, in ms (0: none). */
  loadPollMs?: number;
  /** Serve only this engine's service (`vllm`, `sglang`, `trtllm`, `tokenspeed`); default all. */
  engine?: string;
  tlsCert?: string;
  tlsKey?: string;
  tlsCa?: string;
}

export const SERVE_DEFAULTS: ServeConfig = {
  engine: 'sim',
  publisher: { endpoint: 'tcp://*:5557', replayEndpoint: 'tcp://*:5558' },
  http: { host: '127.0.0.1', port: 5559 },
  grpc: null,
  authTokenFile: null,
  zmqCurveSecretFile: null,
  zmqCurveClients: null,
  sim: {},
  engineSource: {},
  durationSeconds: 0,
  statusSeconds: 1,
};

export function bad(msg: string): never {
  throw new KvPlaneError('ERR_INVALID_ARG', msg);
}

/** The gRPC section, with defaults when a flag opens it (its port stays "unset" until given). */
export function grpcOf(c: ServeConfig): GrpcConfig {
  return c.grpc ?? { host: '0.0.0.0', port: 50051 };
}

const SIM_KEYS: Record<string, keyof SimEngineOptions> = {
  seed: 'seed',
  block_size: 'blockSize',
  num_blocks: 'numBlocks',
  requests_per_second: 'requestsPerSecond',
  step_ms: 'stepMs',
  system_prompts: 'systemPrompts',
  system_prompt_tokens: 'systemPromptTokens',
  documents: 'documents',
  document_tokens: 'documentTokens',
  zipf_exponent: 'zipfExponent',
  document_probability: 'documentProbability',
  max_turns: 'maxTurns',
  max_user_tokens: 'maxUserTokens',
  max_output_tokens: 'maxOutputTokens',
  max_request_steps: 'maxRequestSteps',
  vocab_size: 'vocabSize',
  hash_algo: 'hashAlgo',
  medium: 'medium',
};

const GRPC_KEYS: Record<string, keyof GrpcConfig> = {
  host: 'host',
  port: 'port',
  max_lag_batches: 'maxLagBatches',
  max_snapshots: 'maxSnapshots',
  upstream: 'upstream',
  load_poll_ms: 'loadPollMs',
  engine: 'engine',
  tls_cert: 'tlsCert',
  tls_key: 'tlsKey',
  tls_ca: 'tlsCa',
};

/** Applies a JSON config file: KVEventsConfig keys at the top (or under `kv_events_config`), plus `http`, `sim`, and the publisher extras. */
export function applyConfigFile(c: ServeConfig, json: Record<string, unknown>): void {
  const {
    http,
    grpc,
    auth_token_file,
    zmq_curve_secret_file,
    zmq_curve_clients,
    sim,
    kv_events_config,
    data_parallel_rank,
    block_size,
    format,
    replay_topic_frame,
    engine,
    engine_endpoint,
    engine_replay_endpoint,
    engine_dp_size,
    engine_topic,
    engine_url,
    engine_poll_ms,
    engine_coalesce_bytes,
    engine_hwm,
    replay_send_budget_bytes,
    native_zmq,
    ...rest
  } = json as Record<string, unknown> & { kv_events_config?: Record<string, unknown> };
  const events = kvEventsConfigFromJson({ ...(kv_events_config ?? {}), ...rest });
  if (events.publisher === 'null') bad('publisher "null" disables events: nothing to serve');
  delete events.publisher;
  Object.assign(c.publisher, events);
  if (engine !== undefined) c.engine = checkSourceName(String(engine));
  if (engine_endpoint !== undefined) c.engineSource.endpoint = engine_endpoint as string;
  if (engine_replay_endpoint !== undefined) c.engineSource.replayEndpoint = engine_replay_endpoint as string | null;
  if (engine_dp_size !== undefined) c.engineSource.dpSize = engine_dp_size as number;
  if (engine_topic !== undefined) c.engineSource.topic = engine_topic as string;
  if (engine_url !== undefined) c.engineSource.url = engine_url as string;
  if (engine_poll_ms !== undefined) c.engineSource.pollMs = engine_poll_ms as number;
  if (engine_coalesce_bytes !== undefined) c.engineSource.coalesceBytes = engine_coalesce_bytes as number;
  if (engine_hwm !== undefined) c.engineSource.receiveHwm = engine_hwm as number;
  if (replay_send_budget_bytes !== undefined) c.publisher.replaySendBudgetBytes = replay_send_budget_bytes as number;
  if (native_zmq !== undefined) {
    if (typeof native_zmq !== 'boolean') bad(`native_zmq is ${JSON.stringify(native_zmq)}: true or false`);
    c.publisher.nativeZmq = c.engineSource.native = native_zmq;
  }
  if (data_parallel_rank !== undefined) c.publisher.dataParallelRank = data_parallel_rank as number;
  if (block_size !== undefined) c.sim.blockSize = c.publisher.blockSize = block_size as number;
  if (format !== undefined) c.publisher.format = format as ZmqFormat;
  if (replay_topic_frame !== undefined) c.publisher.replayTopicFrame = replay_topic_frame as boolean;
  if (http === null) c.http = null;
  else if (http !== undefined) c.http = { ...(c.http ?? { host: '127.0.0.1', port: 5559 }), ...(http as object) };
  if (grpc === null) c.grpc = null;
  else if (grpc !== undefined) {
    for (const [k, v] of Object.entries(grpc as Record<string, unknown>)) {
      const name = camelKey(GRPC_KEYS, k);
      if (name === undefined) bad(`unknown grpc config key ${JSON.stringify(k)}`);
      c.grpc = { ...grpcOf(c), [name]: v };
    }
  }
  if (auth_token_file !== undefined) c.authTokenFile = auth_token_file as string | null;
  if (zmq_curve_secret_file !== undefined) c.zmqCurveSecretFile = zmq_curve_secret_file as string | null;
  if (zmq_curve_clients !== undefined) c.zmqCurveClients = zmq_curve_clients as string | null;
  for (const [k, v] of Object.entries((sim ?? {}) as Record<string, unknown>)) {
    const name = camelKey(SIM_KEYS, k);
    if (name === undefined) bad(`unknown sim config key ${JSON.stringify(k)}`);
    (c.sim as Record<string, unknown>)[name] = v;
  }
}
