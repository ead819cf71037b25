import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { KvPlaneError } from '../../errors.js';
import type { Registration } from './registry.js';

/** What the indexer keeps on disk. */
export interface IndexerState {
  registrations: Registration[];
  /** Peer indexers (`--peers`, `/register_peer`): a restarted indexer recovers from them. */
  peers: string[];
}

/**
 * The indexer's registrations and peers on disk, so a restarted indexer follows the same workers
 * again (and rebuilds each from its node, or from a peer). Written whole on every change,
 * atomically (a temporary file renamed over the old one).
 */
export function saveState(
  path: string,
  state: { registrations: readonly Registration[]; peers: readonly string[] },
): void {
  const regs = state.registrations;
  const body = {
    version: 1,
    peers: state.peers,
    registrations: regs.map((r) => ({
      instance_id: r.instanceId.toString(),
      dp_rank: r.dpRank,
      model_name: r.modelName,
      routing_group: r.routingGroup,
      block_size: r.blockSize,
      endpoint: r.endpoint,
      replay_endpoint: r.replayEndpoint,
      url: r.url,
      engine: r.engine ?? 'vllm',
    })),
  };
  const tmp = `${path}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(body, null, 2)}\n`);
  renameSync(tmp, path);
}

/** The state saved at `path`; none when it does not exist (a file of an earlier version has no peers). */
export function loadState(path: string): IndexerState {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { registrations: [], peers: [] };
    throw err;
  }
  let body: { version?: number; registrations?: Array<Record<string, unknown>>; peers?: unknown };
  try {
    body = JSON.parse(text);
  } catch (err) {
    throw new KvPlaneError('ERR_INVALID_ARG', `state file ${path} is not JSON: ${(err as Error).message}`);
  }
  if (body.version !== 1 || !Array.isArray(body.registrations)) {
    throw new KvPlaneError('ERR_INVALID_ARG', `state file ${path} is not a kvplane indexer state (version 1)`);
  }
  const peers = Array.isArray(body.peers) ? body.peers.filter((p): p is string => typeof p === 'string') : [];
  const registrations = body.registrations.map((r) => ({
    instanceId: BigInt(r.instance_id as string),
    dpRank: r.dp_rank as number,
    modelName: r.model_name as string,
    routingGroup: r.routing_group as string,
    blockSize: r.block_size as number,
    endpoint: r.endpoint as string,
    replayEndpoint: (r.replay_endpoint as string | null) ?? null,
    url: (r.url as string | null) ?? null,
    engine: (r.engine as Registration['engine']) ?? 'vllm',
  }));
  return { registrations, peers };
}
