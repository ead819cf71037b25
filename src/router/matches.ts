/**
 * Per worker holding a request's first block in some tier: parallel arrays, index `i` is one
 * `(workerId, dpRank)`. Counts are in blocks.
 */
export interface RouterMatches {
  workerIds: BigUint64Array;
  dpRanks: Uint32Array;
  /** Leading blocks of the request held in device (GPU) memory. */
  device: Uint32Array;
  /** `device` plus the blocks the host tier holds right after them. */
  host: Uint32Array;
  /** `host` plus the blocks the disk (and external) tier holds right after them. */
  disk: Uint32Array;
  /** Blocks the worker holds in device memory in all. */
  treeSizes: BigUint64Array;
}

export interface FindMatchesRequest {
  /** The LoRA adapter the request runs with: its blocks are keyed in that adapter's namespace. */
  loraName?: string | null;
  /** The request's cache salt: only blocks stored under the same salt match. */
  cacheSalt?: string | null;
}
