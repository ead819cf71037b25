import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { KvPlaneError } from '../../errors.js';
import type { Registration } from './registry.js';

/**
 * The indexer's registrations on disk, so a restarted indexer follows the same workers again
 * (and rebuilds each from its node). Written whole on every change, atomically (a temporary file
 * renamed over the old one).
 */
export function saveRegistrations(path: string, regs: readonly Registration[]): void {
  const body = {
    version: 1,
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

/** The registrations saved at `path`; none when it does not exist. */
export function loadRegistrations(path: string): Registration[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  let body: { version?: number; registrations?: Array<Record<string, unknown>> };
  try {
    body = JSON.parse(text);
  } catch (err) {
    throw new KvPlaneError('ERR_INVALID_ARG', `state file ${path} is not JSON: ${(err as Error).message}`);
  }
  if (body.version !== 1 || !Array.isArray(body.registrations)) {
    throw new KvPlaneError('ERR_INVALID_ARG', `state file ${path} is not a kvplane indexer state (version 1)`);
  }
  return body.registrations.map((r) => ({
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
}
