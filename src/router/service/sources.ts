import type { WorkerSource } from '../router_index.js';
import { HttpError } from './json.js';
import type { Registration } from './registry.js';

/** What a registration subscribes to. */
export function sourceOf(r: Registration): WorkerSource {
  if (r.endpoint.startsWith('grpc://')) return { kind: 'grpc', address: r.endpoint.slice('grpc://'.length) };
  return {
    kind: 'zmq',
    endpoint: r.endpoint,
    replayEndpoint: r.replayEndpoint,
    dialect: r.engine ?? 'vllm',
    // A kvplane node followed over ZMQ: what its replay cannot restore comes from /kv_recover.
    recoverUrl: r.url,
  };
}

/** A bound address's host replaced by the host the node was reached at (`*`, `0.0.0.0`, `::`). */
function reachable(endpoint: string, host: string): string {
  return endpoint.replace(/^(tcp:\/\/)(\*|0\.0\.0\.0|\[::\]|::)(:\d+)$/, `$1${host}$3`);
}

/**
 * A kvplane node's endpoints, from its `/healthz`: its gRPC server when it has one (snapshots,
 * epochs), else its ZMQ stream and replay socket.
 */
export async function discoverNode(
  url: string,
  timeoutMs = 5000,
): Promise<{ endpoint: string; replayEndpoint: string | null }> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new HttpError(400, `invalid node url \`${url}\``);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new HttpError(400, `invalid node url \`${url}\`: http or https`);
  let health: { endpoints?: { zmq?: string | null; replay?: string | null; grpc_port?: number | null } };
  try {
    const res = await fetch(new URL('/healthz', u), { signal: AbortSignal.timeout(timeoutMs) });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    health = (await res.json()) as typeof health;
  } catch (err) {
    throw new HttpError(502, `cannot read ${url}/healthz: ${(err as Error).message}`);
  }
  const e = health.endpoints;
  if (!e) throw new HttpError(502, `${url}/healthz names no endpoints: not a kvplane node`);
  if (e.grpc_port) return { endpoint: `grpc://${u.hostname}:${e.grpc_port}`, replayEndpoint: null };
  if (e.zmq) {
    return {
      endpoint: reachable(e.zmq, u.hostname),
      replayEndpoint: e.replay ? reachable(e.replay, u.hostname) : null,
    };
  }
  throw new HttpError(502, `${url} serves neither gRPC nor ZMQ`);
}
