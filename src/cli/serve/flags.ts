import { readFileSync } from 'node:fs';
import type { ZmqFormat } from '../../indexer.js';
import { checkSourceName, SOURCES } from '../../sources/registry.js';
import { applyConfigFile, bad, grpcOf, SERVE_DEFAULTS, type ServeConfig } from './config.js';

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

/** Flags of `kvplane serve`, each with how it lands in the config. */
const FLAGS: Record<string, { help: string; apply: (c: ServeConfig, v: string) => void }> = {
  engine: {
    help: `event source: ${Object.entries(SOURCES)
      .map(([name, s]) => `${name} (${s.help})`)
      .join(', ')}`,
    apply: (c, v) => (c.engine = checkSourceName(v)),
  },
  'engine-endpoint': {
    help: "vllm/sglang: rank 0's KV events publisher to connect to, tcp://HOST:PORT (other ranks at port + rank)",
    apply: (c, v) => (c.engineSource.endpoint = v),
  },
  'engine-replay-endpoint': {
    help: "vllm/sglang: rank 0's replay endpoint, tcp://HOST:PORT (none: gaps clear the rank)",
    apply: (c, v) => (c.engineSource.replayEndpoint = v === 'none' ? null : v),
  },
  'engine-dp-size': {
    help: 'vllm/sglang: data-parallel ranks to relay (default 1)',
    apply: (c, v) => (c.engineSource.dpSize = int('engine-dp-size', v)),
  },
  'engine-hwm': {
    help: "vllm/sglang/trtllm: the relay's own receive HWM per rank, in messages (default 10000); past it the engine's batches are dropped and fetched again from its replay",
    apply: (c, v) => (c.engineSource.receiveHwm = int('engine-hwm', v)),
  },
  'engine-coalesce-bytes': {
    help: 'vllm/sglang/trtllm: engine batches found waiting together on a rank are relayed as one outbound batch of up to this many payload bytes (default 65536; 0: one outbound batch per engine batch)',
    apply: (c, v) => (c.engineSource.coalesceBytes = int('engine-coalesce-bytes', v)),
  },
  'native-zmq': {
    help: 'relay the engine and send the live ZMQ stream natively, off the JS thread (default true; false: zeromq.js, every batch through the JS thread)',
    apply: (c, v) => {
      c.publisher.nativeZmq = c.engineSource.native = bool('native-zmq', v);
    },
  },
  'engine-url': {
    help: "trtllm: trtllm-serve's URL, http://HOST:PORT, whose POST /kv_cache_events is polled (instead of ZMQ)",
    apply: (c, v) => (c.engineSource.url = v),
  },
  'engine-poll-ms': {
    help: 'trtllm with --engine-url: time between drains (default 100)',
    apply: (c, v) => (c.engineSource.pollMs = int('engine-poll-ms', v)),
  },
  'engine-topic': { help: 'vllm/sglang: topic filter (default all)', apply: (c, v) => (c.engineSource.topic = v) },
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
  hwm: {
    help: 'ZMQ send high-water mark per live subscriber, in messages (default 512: ~64 MiB of full batches)',
    apply: (c, v) => (c.publisher.hwm = int('hwm', v)),
  },
  'replay-send-budget': {
    help: 'bytes one replay peer may have queued before its replay waits, then is abandoned (default 8388608)',
    apply: (c, v) => (c.publisher.replaySendBudgetBytes = int('replay-send-budget', v)),
  },
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
    help: 'gRPC port for SubscribeKvEvents (SMG proto), e.g. 50051; "none" to disable (default none: no gRPC, unless another --grpc-* flag is given, which serves it on 50051)',
    apply: (c, v) => (c.grpc = v === 'none' ? null : { ...grpcOf(c), port: int('grpc-port', v) }),
  },
  'grpc-host': { help: 'gRPC host (default 0.0.0.0)', apply: (c, v) => (c.grpc = { ...grpcOf(c), host: v }) },
  'grpc-max-lag': {
    help: 'batches a gRPC subscriber may fall behind before RESOURCE_EXHAUSTED (default 1024)',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), maxLagBatches: int('grpc-max-lag', v) }),
  },
  'grpc-max-snapshots': {
    help: 'snapshots sent at once to subscribers from 0 (default 4; more wait their turn)',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), maxSnapshots: int('grpc-max-snapshots', v) }),
  },
  'grpc-upstream': {
    help: "the engine's own gRPC server (HOST:PORT): every other RPC (Generate, GetModelInfo, ...) is forwarded to it, and HealthCheck while kvplane is healthy",
    apply: (c, v) => (c.grpc = { ...grpcOf(c), upstream: v }),
  },
  'grpc-load-poll-ms': {
    help: "with --grpc-upstream: how often the engine's GetLoads is polled for the streams' load records, in ms (default 1000; 0: none)",
    apply: (c, v) => (c.grpc = { ...grpcOf(c), loadPollMs: int('grpc-load-poll-ms', v) }),
  },
  'grpc-engine': {
    help: 'serve only this engine service: vllm, sglang, trtllm or tokenspeed (default all four)',
    apply: (c, v) => (c.grpc = { ...grpcOf(c), engine: v }),
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
  'zmq-curve-secret-file': {
    help: 'CURVE secret key (a ZMQ certificate or the bare Z85 key): encrypt the ZMQ sockets; clients need the public key the "serving" line shows',
    apply: (c, v) => (c.zmqCurveSecretFile = v),
  },
  'zmq-curve-clients': {
    help: 'allowed CURVE clients: a directory of *.key certificates or a file of public keys (needs --zmq-curve-secret-file)',
    apply: (c, v) => (c.zmqCurveClients = v),
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
  return `Usage: kvplane serve --engine sim|vllm|sglang|trtllm [flags]\n\nRuns an engine node: the simulated engine or a relay of a real engine's KV events, the ZMQ publisher with replay, the HTTP recovery server and (with --grpc-port or any --grpc-* flag) gRPC SubscribeKvEvents.\n\n${lines.join('\n')}\n`;
}
