import { KvPlaneError } from '../errors.js';
import { checkPeerUrl } from '../router/service/peers.js';
import { IndexerServer, type IndexerServerOptions } from '../router/service/server.js';
import { readToken } from './token.js';

export interface IndexerConfig extends IndexerServerOptions {
  durationSeconds: number;
}

const HELP = `Usage: kvplane indexer [flags]

A router-side KV indexer serving Dynamo's standalone indexer HTTP API (/register, /unregister,
/workers, /query, /query_by_hash, /dump, /register_peer, /deregister_peer, /peers, /reopen_logs,
/health, /metrics). Workers are registered over HTTP, by their ZMQ publisher (endpoint,
replay_endpoint), an SMG-proto gRPC server (endpoint grpc://HOST:PORT) or, for a kvplane node, its
HTTP URL (url).

Flags:
  --host HOST             address to serve on (default 0.0.0.0)
  --port PORT             HTTP port (default 8090)
  --block-size N          block size of the workers given with --workers
  --model-name NAME       model of the workers given with --workers (default "default")
  --routing-group NAME    routing group of the workers given with --workers (default "default")
  --workers LIST          workers to follow from the start: "id[:dp_rank]=endpoint,..."
                          (e.g. "1=tcp://host:5557,1:1=tcp://host:5558")
  --peers LIST            peer indexers following the same workers ("http://host:8090,..."),
                          kvplane's or Dynamo's: before serving, the indexer loads the /dump of
                          the first that answers (1 s after following --workers)
  --dump-tokens-hash      /dump writes each block's tokens_hash, so that Dynamo indexers can start
                          from it (--peers): costs 8 bytes a block (kvplane peers need nothing)
  --access-log PATH       append a JSON line per answered request (POST /reopen_logs reopens it)
  --access-log-local-time the access log's times in the local time zone (default UTC)
  --trace-id-header NAME  the header the access log writes as trace_id (default x-trace-id)
  --threads N             accepted for Dynamo's command lines; changes nothing (each index takes
                          queries alongside its one writer)
  --state-file PATH       keep registrations and peers here; a restarted indexer follows them again
  --node-token-file PATH  file holding the bearer token of the kvplane nodes it follows (those
                          started with --auth-token-file): sent to their /healthz, /kv_recover
                          and gRPC, and then needed on /register, /unregister and the peer
                          routes (or set KVPLANE_NODE_TOKEN)
  --zmq-receive MODE      native (default): ZMQ publishers are read on a thread of kvplane's own,
                          in-order batches applied there; js: every message read with zeromq.js
  --duration SECONDS      stop after this long (default: until SIGINT/SIGTERM)
`;

function bad(msg: string): never {
  throw new KvPlaneError('ERR_INVALID_ARG', msg);
}

export function indexerHelp(): string {
  return HELP;
}

/** `--workers "id[:rank]=endpoint,..."`, as Dynamo's flag. */
export function parseWorkers(list: string, blockSize: number | undefined, modelName: string, routingGroup: string) {
  if (list.trim() === '') return [];
  if (blockSize === undefined) bad('--workers needs --block-size');
  return list.split(',').map((item) => {
    const m = /^(\d+)(?::(\d+))?=(.+)$/.exec(item.trim());
    if (!m) bad(`--workers entry ${JSON.stringify(item)}: id[:dp_rank]=endpoint`);
    return {
      instanceId: BigInt(m[1] as string),
      dpRank: Number(m[2] ?? 0),
      endpoint: m[3] as string,
      modelName,
      routingGroup,
      blockSize,
    };
  });
}

export function parseIndexerArgs(argv: string[]): IndexerConfig {
  const v: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (!arg.startsWith('--')) bad(`unexpected argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2);
    if (SWITCHES.includes(name)) {
      if (eq > 0) bad(`--${name} takes no value`);
      v[name] = 'true';
      continue;
    }
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) bad(`--${name} needs a value`);
    v[name] = value;
  }
  const known = [
    'host',
    'port',
    'block-size',
    'model-name',
    'routing-group',
    'workers',
    'state-file',
    'node-token-file',
    'duration',
    'zmq-receive',
    'peers',
    'access-log',
    'access-log-local-time',
    'dump-tokens-hash',
    'trace-id-header',
    'threads',
  ];
  for (const k of Object.keys(v)) if (!known.includes(k)) bad(`unknown flag --${k}`);
  const int = (name: string, min: number, max: number): number | undefined => {
    const s = v[name];
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < min || n > max)
      bad(`--${name} is ${JSON.stringify(s)}: an integer in ${min}..${max}`);
    return n;
  };
  const blockSize = int('block-size', 1, 1 << 20);
  int('threads', 1, 1024);
  return {
    host: v.host ?? '0.0.0.0',
    port: int('port', 0, 65535) ?? 8090,
    stateFile: v['state-file'],
    nodeToken: readToken(v['node-token-file'] ?? null, 'KVPLANE_NODE_TOKEN', '--node-token-file'),
    workers: parseWorkers(v.workers ?? '', blockSize, v['model-name'] ?? 'default', v['routing-group'] ?? 'default'),
    durationSeconds: int('duration', 0, 1e9) ?? 0,
    zmqReceive: zmqReceive(v['zmq-receive']),
    peers: peerList(v.peers ?? ''),
    accessLog: v['access-log'],
    accessLogLocalTime: v['access-log-local-time'] === 'true',
    dumpTokensHash: v['dump-tokens-hash'] === 'true',
    traceIdHeader: traceHeader(v['trace-id-header']),
  };
}

/** Flags that take no value. */
const SWITCHES = ['access-log-local-time', 'dump-tokens-hash'];

/** `--peers "url,url"`: each an http(s) URL. */
function peerList(list: string): string[] {
  const urls = list
    .split(',')
    .map((u) => u.trim())
    .filter((u) => u !== '');
  for (const u of urls) {
    try {
      checkPeerUrl(u);
    } catch (err) {
      bad(`--peers: ${(err as Error).message}`);
    }
  }
  return urls;
}

function traceHeader(name: string | undefined): string | undefined {
  if (name !== undefined && !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name))
    bad(`--trace-id-header is ${JSON.stringify(name)}: an HTTP header name`);
  return name;
}

function zmqReceive(s: string | undefined): 'native' | 'js' {
  if (s === undefined || s === 'native' || s === 'js') return s ?? 'native';
  return bad(`--zmq-receive is ${JSON.stringify(s)}: native or js`);
}

export async function startIndexer(
  c: IndexerConfig,
  onWarning: (msg: string, detail: Record<string, unknown>) => void,
): Promise<IndexerServer> {
  return IndexerServer.create({ ...c, onWarning });
}
