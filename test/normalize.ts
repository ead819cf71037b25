import type { KvEventBatchOut, KvEventOut } from '../src/index.js';

const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');

/** Opaque values in the fixtures' JSON form (bytes as {"$bin": hex}). */
function opaque(v: unknown): unknown {
  if (v instanceof Uint8Array) return { $bin: hex(v) };
  if (Array.isArray(v)) return v.map(opaque);
  if (typeof v === 'bigint') return Number(v);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, opaque(x)]));
  return v;
}

/** A decoded event in the fixtures' normalized JSON form (u64 values as decimal strings). */
export function normEvent(e: KvEventOut): Record<string, unknown> {
  const out: Record<string, unknown> = { type: e.type };
  const str = (v: bigint | number | undefined) => (v === undefined ? undefined : String(v));
  const set = (k: string, v: unknown) => {
    if (v !== undefined && v !== null) out[k] = v;
  };
  if (e.type === 'stored' || e.type === 'removed') set('block_hashes', Array.from(e.blockHashes ?? [], String));
  if (e.type === 'stored') {
    set('parent_block_hash', str(e.parentBlockHash));
    set('token_ids', Array.from(e.tokenIds ?? []));
    set('block_size', e.blockSize);
    set('lora_id', str(e.loraId));
    set('lora_name', e.loraName);
    set('cache_salt', e.cacheSalt);
    set('kv_cache_spec_kind', e.kvCacheSpecKind);
    set('session_id', e.sessionId);
    set('kv_cache_spec_sliding_window', str(e.kvCacheSpecSlidingWindow));
    set('extra_keys', e.extraKeys === undefined ? undefined : opaque(e.extraKeys));
    set('lookahead_token_ids', e.lookaheadTokenIds === undefined ? undefined : opaque(e.lookaheadTokenIds));
    if (e.hashBytes) {
      const hb: Record<string, unknown> = {};
      if (e.hashBytes.blocks) hb.blocks = e.hashBytes.blocks.map(hex);
      if (e.hashBytes.parent) hb.parent = hex(e.hashBytes.parent);
      out.hash_bytes = hb;
    }
  }
  if (e.type === 'removed' && e.hashBytes?.blocks) out.hash_bytes = e.hashBytes.blocks.map(hex);
  set('medium', e.medium);
  set('group_idx', e.groupIdx);
  set('locality', e.locality);
  set('ownership', e.ownership);
  if (e.type === 'updated') {
    set('block_hash', str(e.blockHash));
    set('cache_level', e.cacheLevel);
    set('priority', e.priority);
  }
  set('num_blocks_per_cache_level', e.numBlocksPerCacheLevel);
  return out;
}

export function normBatch(b: KvEventBatchOut, withSeq: boolean): Record<string, unknown> {
  return {
    ...(withSeq ? { seq: String(b.seq) } : {}),
    ts: b.ts,
    dp_rank: b.dpRank ?? null,
    events: b.events.map(normEvent),
  };
}

/** Key order does not matter in the comparison; sort for a stable deep-equal. */
export function sorted(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sorted);
  if (v !== null && typeof v === 'object')
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sorted((v as Record<string, unknown>)[k])]),
    );
  return v;
}
