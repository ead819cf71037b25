import { readFileSync } from 'node:fs';
import { KvPlaneError } from '../errors.js';
import { type GrpcTlsOptions, KvGrpcServer } from '../grpc/server.js';
import type { ZmqFormat } from '../indexer.js';
import { camelKey } from '../options.js';
import { kvEventsConfigFromJson } from '../publisher/config.js';
import { KvEventPublisher, type KvEventPublisherOptions } from '../publisher/publisher.js';
import { KvHttpServer } from '../server/http.js';
import { SimEngine, type SimEngineOptions } from '../sim/engine.js';

/** Everything `kvplane serve` runs with, after defaults, the config file and flags. */
export interface ServeConfig {
  engine: 'sim';
  publisher: KvEventPublisherOptions;
  http: { host: string; port: number } | null;
  /** gRPC `SubscribeKvEvents`; off unless a port is given. TLS files are PEM paths. */
  grpc: GrpcConfig | null;
  /** File holding the bearer token required on gRPC and HTTP (else `KVPLANE_AUTH_TOKEN`). */
  authTokenFile: string | null;
  sim: SimEngineOptions;
  /** Stop after this many seconds (0: run until a signal). */
  durationSeconds: number;
  /** Status every this many seconds (a live line on a TTY, a JSON log line otherwise). */
  statusSeconds: number;
}

export interface GrpcConfig {
  host: string;
  port: number;
  maxLagBatches?: number;
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
  sim: {},
  durationSeconds: 0,
  statusSeconds: 1,
};

function bad(msg: string): never {
  throw new KvPlaneError('ERR_INVALID_ARG', msg);
}

function int(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || v.trim() === '') bad(`--${name} is ${JSON.stringify(v)}: an integer`);
  return n;
}

function num(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isFinite(n) || v.trim() === '') bad(`--${name} is ${JSON.stringify(v)}: a number`);
  return n;
}

function bool(name: string, v: string): boolean {
  if (v === 'true' || v === '1') return true;
  if (v === 'false' || v === '0') return false;
  return bad(`--${name} is ${JSON.stringify(v)}: true or false`);
}

/** The gRPC section, with defaults when a flag opens it (its port stays "unset" until given). */
function grpcOf(c: ServeConfig): GrpcConfig {
  return c.grpc ?? { host: '0.0.0.0', port: 50051 };
}

/** Flags of `kvplane serve`, each with how it lands in the config. */
const FLAGS: Record<string, { help: string; apply: (c: ServeConfig, v: string) => void }> = {
  engine: {
    help: 'event source: sim (the built-in simulated engine)',
    apply: (c, v) => {
      if (v !== 'sim') bad(`--engine ${v}: this version serves the simulated engine (sim)`);
      c.engine = v;
    },
  },
  config: { help: 'JSON config file (KVEventsConfig names, snake_case or camelCase)', apply: () => {} },
  endpoint: { help: 'live ZMQ endpoint (default tcp://*:5557)', apply: (c, v) => (c.publisher.endpoint = v) },
  'replay-endpoint': {
    help: 'replay ROUTER endpoint, "none" to disable (default tcp://*:5558)',
    apply: (c, v) => (c.publisher.replayEndpoint = v === 'none' ? null : v),
  },
  'buffer-steps': {
    help: 'batches kept for replay (default 10000)',
    apply: (c, v) => (c.publisher.bufferSteps = int('buffer-steps', v)),
  },
  hwm: { help: 'ZMQ send high-water mark (default 100000)', apply: (c, v) => (c.publisher.hwm = int('hwm', v)) },
  'max-queue-size': {
    help: 'events queued before drops (default 100000)',
    apply: (c, v) => (c.publisher.maxQueueSize = int('max-queue-size', v)),
  },
  topic: { help: 'topic frame (default empty)', apply: (c, v) => (c.publisher.topic = v) },
  'dp-rank': {
    help: 'data-parallel rank: port offset and dp_rank of batches',
    apply: (c, v) => (c.publisher.dataParallelRank = int('dp-rank', v)),
  },
  format: {
    help: 'payload format: vllm (default), vllm_legacy, sglang',
    apply: (c, v) => (c.publisher.format = v as ZmqFormat),
  },
  'replay-topic-frame': {
    help: 'replay replies carry the topic frame (default true)',
    apply: (c, v) => (c.publisher.replayTopicFrame = bool('replay-topic-frame', v)),
  },
  'block-size': {
    help: 'tokens per KV block (default 16)',
    apply: (c, v) => {
      c.publisher.blockSize = int('block-size', v);
      c.sim.blockSize = c.publisher.blockSize;
    },
  },
  'http-host': {
    help: 'HTTP host (default 127.0.0.1)',
    apply: (c, v) => (c.http = { ...(c.http ?? { port: 5559 }), host: v }),
  },
  'http-port': {
    help: 'HTTP port for /kv_recover, /healthz, /metrics; "none" to disable (default 5559)',
    apply: (c, v) =>
      (c.http = v === 'none' ? null : { ...(c.http ?? { host: '127.0.0.1' }), port: int('http-port', v) }),
  },
  'grpc-port': {
    help: 'gRPC port for SubscribeKvEvents (SMG proto), e.g. 50051; "none" to disable (default none)',
    apply: (c, v) => (c.grpc = v === 'none' ? null : { ...grpcOf(c), port: int('grpc-port', v) }),
  },
  'grpc-host': { help: 'gRPC host (default 0.0.0.0)', apply: (c, v) => (c.grpc = { ...grpcOf(c), host: v }) },
  'grpc-max-lag': {
    help: 'batches a gRPC subscriber may fall behind before RESOURCE_EXHAUSTED (default 1024)',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), maxLagBatches: int('grpc-max-lag', v) }),
  },
  'grpc-tls-cert': {
    help: 'PEM certificate chain: serve gRPC over TLS',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), tlsCert: v }),
  },
  'grpc-tls-key': {
    help: 'PEM private key for --grpc-tls-cert',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), tlsKey: v }),
  },
  'grpc-tls-ca': {
    help: 'PEM CA bundle: require client certificates it signed',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), tlsCa: v }),
  },
  'auth-token-file': {
    help: 'file holding a bearer token required on gRPC and HTTP (or set KVPLANE_AUTH_TOKEN)',
    apply: (c, v) => (c.authTokenFile = v),
  },
  'sim-seed': { help: 'workload seed (default 1)', apply: (c, v) => (c.sim.seed = int('sim-seed', v)) },
  'sim-rate': {
    help: 'new conversations per second (default 20)',
    apply: (c, v) => (c.sim.requestsPerSecond = num('sim-rate', v)),
  },
  'sim-blocks': {
    help: 'KV blocks in the pool (default 16384)',
    apply: (c, v) => (c.sim.numBlocks = int('sim-blocks', v)),
  },
  'sim-step-ms': { help: 'engine step in ms (default 20)', apply: (c, v) => (c.sim.stepMs = int('sim-step-ms', v)) },
  duration: {
    help: 'stop after this many seconds (default: run until SIGINT/SIGTERM)',
    apply: (c, v) => (c.durationSeconds = num('duration', v)),
  },
  'status-interval': {
    help: 'seconds between status updates (default 1)',
    apply: (c, v) => (c.statusSeconds = num('status-interval', v)),
  },
};

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
  tls_cert: 'tlsCert',
  tls_key: 'tlsKey',
  tls_ca: 'tlsCa',
};

/** Applies a JSON config file: KVEventsConfig keys at the top (or under `kv_events_config`), plus `http`, `sim`, and the publisher extras. */
function applyConfigFile(c: ServeConfig, json: Record<string, unknown>): void {
  const {
    http,
    grpc,
    auth_token_file,
    sim,
    kv_events_config,
    data_parallel_rank,
    block_size,
    format,
    replay_topic_frame,
    engine,
    ...rest
  } = json as Record<string, unknown> & { kv_events_config?: Record<string, unknown> };
  const events = kvEventsConfigFromJson({ ...(kv_events_config ?? {}), ...rest });
  if (events.publisher === 'null') bad('publisher "null" disables events: nothing to serve');
  delete events.publisher;
  Object.assign(c.publisher, events);
  if (engine !== undefined) FLAGS.engine?.apply(c, String(engine));
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
  for (const [k, v] of Object.entries((sim ?? {}) as Record<string, unknown>)) {
    const name = camelKey(SIM_KEYS, k);
    if (name === undefined) bad(`unknown sim config key ${JSON.stringify(k)}`);
    (c.sim as Record<string, unknown>)[name] = v;
  }
}

/** Builds the config from `argv` (after `serve`): defaults, then `--config`, then flags. */
export function parseServeArgs(argv: readonly string[]): ServeConfig {
  const c: ServeConfig = structuredClone(SERVE_DEFAULTS);
  const flags: Array<[string, string]> = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (!arg.startsWith('--')) bad(`unexpected argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2);
    if (!(name in FLAGS)) bad(`unknown flag --${name} (see kvplane serve --help)`);
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) bad(`--${name} needs a value`);
    flags.push([name, value]);
  }
  const file = flags.find(([n]) => n === 'config');
  if (file) applyConfigFile(c, JSON.parse(readFileSync(file[1], 'utf8')) as Record<string, unknown>);
  for (const [name, value] of flags) FLAGS[name]?.apply(c, value);
  return c;
}

export function serveHelp(): string {
  const lines = Object.entries(FLAGS).map(([n, f]) => `  --${n.padEnd(20)} ${f.help}`);
  return `Usage: kvplane serve --engine sim [flags]\n\nRuns an engine node: the simulated engine, the ZMQ publisher with replay, the HTTP recovery server and (with --grpc-port) gRPC SubscribeKvEvents.\n\n${lines.join('\n')}\n`;
}

/** A running `serve`: the engine, the publisher, the HTTP and gRPC servers. */
export interface Serving {
  publisher: KvEventPublisher;
  http: KvHttpServer | null;
  grpc: KvGrpcServer | null;
  sim: SimEngine;
  stop(): Promise<void>;
}

/** The bearer token: the file's first line, else `KVPLANE_AUTH_TOKEN`; none when neither is set. */
function readAuthToken(file: string | null): string | undefined {
  const token =
    file !== null ? (readFileSync(file, 'utf8').split(/\r?\n/)[0] ?? '').trim() : process.env.KVPLANE_AUTH_TOKEN;
  if (token === undefined || (file === null && token === '')) return undefined;
  if (token === '') bad(`--auth-token-file ${file}: the file holds no token`);
  return token;
}

function readTls(g: GrpcConfig): GrpcTlsOptions | undefined {
  if (g.tlsCert === undefined && g.tlsKey === undefined) {
    if (g.tlsCa !== undefined) bad('--grpc-tls-ca needs --grpc-tls-cert and --grpc-tls-key');
    return undefined;
  }
  if (g.tlsCert === undefined || g.tlsKey === undefined) bad('--grpc-tls-cert and --grpc-tls-key go together');
  return {
    cert: readFileSync(g.tlsCert),
    key: readFileSync(g.tlsKey),
    ca: g.tlsCa === undefined ? undefined : readFileSync(g.tlsCa),
  };
}

/** Starts the simulated engine, the publisher (with replay) and the HTTP server. */
export async function startServe(c: ServeConfig): Promise<Serving> {
  const authToken = readAuthToken(c.authTokenFile);
  const tls = c.grpc ? readTls(c.grpc) : undefined;
  const publisher = await KvEventPublisher.create({ blockSize: c.sim.blockSize, ...c.publisher });
  let http: KvHttpServer | null = null;
  let grpc: KvGrpcServer | null = null;
  try {
    if (c.grpc) {
      grpc = await KvGrpcServer.create({
        publisher,
        host: c.grpc.host,
        port: c.grpc.port,
        maxLagBatches: c.grpc.maxLagBatches,
        authToken,
        tls,
      });
    }
    if (c.http) {
      http = await KvHttpServer.create({
        publisher,
        ...c.http,
        authToken,
        grpc,
        sources: [{ name: 'sim', kind: 'sim' }],
      });
    }
  } catch (err) {
    await grpc?.close();
    await publisher.close();
    throw err;
  }
  const sim = new SimEngine(publisher, { blockSize: c.publisher.blockSize, ...c.sim });
  sim.start();
  let stopped: Promise<void> | undefined;
  return {
    publisher,
    http,
    grpc,
    sim,
    stop() {
      stopped ??= (async () => {
        sim.stop();
        await grpc?.close();
        await http?.close();
        await publisher.close();
      })();
      return stopped;
    },
  };
}
