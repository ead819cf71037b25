import type { RouterMatches } from '../matches.js';

/** One instance's summary in a `/query` answer, in tokens (Mooncake KV Indexer RFC shape). */
export interface InstanceSummary {
  longest_matched: number;
  gpu: number;
  dp: Record<string, number>;
  cpu: number;
  disk: number;
}

/** A `/query` answer as Dynamo's standalone indexer writes it: tokens, not blocks. */
export interface QueryAnswerJson {
  scores: Record<string, Record<string, number>>;
  frequencies: number[];
  instances: Record<string, InstanceSummary>;
}

/**
 * `scores`: per instance and DP rank, the device (GPU) tokens matched, for ranks matching at
 * least one block; `instances`: per instance, the best rank's device tokens (`gpu`), each rank's
 * (`dp`), and how far host (`cpu`) and disk (`disk`, external pools included) continue the run.
 */
export function queryAnswer(m: RouterMatches, blockSize: number): QueryAnswerJson {
  const out: QueryAnswerJson = { scores: {}, frequencies: [], instances: {} };
  for (let i = 0; i < m.workerIds.length; i++) {
    const id = (m.workerIds[i] as bigint).toString();
    const rank = String(m.dpRanks[i]);
    const gpu = (m.device[i] as number) * blockSize;
    const cpu = (m.host[i] as number) * blockSize;
    const disk = (m.disk[i] as number) * blockSize;
    if (gpu > 0) {
      out.scores[id] ??= {};
      (out.scores[id] as Record<string, number>)[rank] = gpu;
    }
    out.instances[id] ??= { longest_matched: 0, gpu: 0, dp: {}, cpu: 0, disk: 0 };
    const inst = out.instances[id] as InstanceSummary;
    inst.dp[rank] = gpu;
    inst.gpu = Math.max(inst.gpu, gpu);
    inst.cpu = Math.max(inst.cpu, cpu);
    inst.disk = Math.max(inst.disk, disk);
    inst.longest_matched = Math.max(inst.gpu, inst.cpu, inst.disk);
  }
  return out;
}
