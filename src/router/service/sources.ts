import { nodeGet } from '../../transports/http/node_get.js';
import type { WorkerSource } from '../router_index.js';
import { HttpError } from './json.js';
import { checkEndpoint, type Registration } from './registry.js';

/** HTTP/2 keepalive pings to a kvplane node's gRPC server (`GrpcSubscriptionOptions.keepaliveMs`). */
const KVPLANE_NODE_KEEPALIVE_MS = 30_000;

/** What a registration subscribes to; `token`: the bearer token kvplane nodes ask for. */
export function sourceOf(r: Registration, token?: string): WorkerSource {
  if (r.endpoint.startsWith('grpc://')) {
    const address = r.endpoint.slice('grpc://'.length);
    // A kvplane node (found by URL) takes pings at any rate: a hung one is noticed in 40 s.
    return { kind: 'grpc', address, token, ...(r.url !== null ? { keepaliveMs: KVPLANE_NODE_KEEPALIVE_MS } : {}) };
  }
  return {
    kind: 'zmq',
    endpoint: r.endpoint,
    replayEndpoint: r.replayEndpoint,
    dialect: r.engine ?? 'vllm',
    // A kvplane node followed over ZMQ: what its replay cannot restore comes from /kv_recover.
    recoverUrl: r.url,
    recoverToken: r.url === null ? null : token,
  };
}

/** A bound address's host replaced by the host the node was reached at (`*`, `0.0.0.0`, `::`). */
function reachable(endpoint: string, host: string): string {
  return endpoint.replace(/^(tcp:\/\/)(\*|0\.0\.0\.0|\[::\]|::)(:\d+)$/, `$1${host}$3`);
}

/** A kvplane node's HTTP URL, checked: anything but an `http:` or `https:` URL is a 400. */
export function nodeUrl(url: string): URL {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new HttpError(400, `invalid node url \`${url}\``);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new HttpError(400, `invalid node url \`${url}\`: http or https`);
  return u;
}

/** The most of a node's `/healthz` answer that is read: a kvplane node's is under a kilobyte. */
const HEALTH_BYTES = 1 << 20;

/**
 * A kvplane node's endpoints, from its `/healthz`: its gRPC server when it has one (snapshots,
 * epochs), else its ZMQ stream and replay socket. The answer is checked as a registration's own
 * endpoints are: one that is not a kvplane node's (too large, a redirect, endpoints that are not
 * endpoints) is a 502.
 */
export async function discoverNode(
  url: string,
  token?: string,
  timeoutMs = 5000,
): Promise<{ endpoint: string; replayEndpoint: string | null }> {
  const u = nodeUrl(url);
  let health: unknown;
  try {
    health = JSON.parse((await nodeGet(u, '/healthz', { token, limit: HEALTH_BYTES, timeoutMs })).toString('utf8'));
  } catch (err) {
    throw new HttpError(502, `cannot read ${url}/healthz: ${(err as Error).message}`);
  }
  const e = (health as { endpoints?: unknown } | null)?.endpoints;
  if (typeof e !== 'object' || e === null) {
    throw new HttpError(502, `${url}/healthz names no endpoints: not a kvplane node`);
  }
  const { zmq, replay, grpc_port: grpcPort } = e as Record<string, unknown>;
  const notNode = (what: string): never => {
    throw new HttpError(502, `${url}/healthz: ${what}: not a kvplane node's`);
  };
  const endpoint = (v: unknown, what: string): string => {
    if (typeof v !== 'string') return notNode(`${what} ${JSON.stringify(v)}`);
    const ep = reachable(v, u.hostname);
    try {
      checkEndpoint(ep);
    } catch (err) {
      return notNode((err as Error).message);
    }
    return ep;
  };
  if (grpcPort !== undefined && grpcPort !== null) {
    if (typeof grpcPort !== 'number' || !Number.isInteger(grpcPort) || grpcPort < 1 || grpcPort > 65535) {
      return notNode(`grpc_port ${JSON.stringify(grpcPort)}`);
    }
    return { endpoint: `grpc://${u.hostname}:${grpcPort}`, replayEndpoint: null };
  }
  if (zmq !== undefined && zmq !== null) {
    return {
      endpoint: endpoint(zmq, 'zmq'),
      replayEndpoint: replay === undefined || replay === null ? null : endpoint(replay, 'replay'),
    };
  }
  throw new HttpError(502, `${url} serves neither gRPC nor ZMQ`);
}
