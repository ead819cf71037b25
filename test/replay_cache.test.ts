import { describe, expect, it } from 'vitest';
import { LocalIndexer } from '../src/index.js';
import { ReplayCache } from '../src/transports/zmq/replay_cache.js';

const BS = 4;

function publish(ix: LocalIndexer, n: number, from: number): void {
  for (let i = 0; i < n; i++) {
    const h = BigInt(from + i);
    ix.applyBatch({
      dpRank: 0,
      events: [
        {
          type: 'stored',
          blockHashes: [h],
          parentBlockHash: null,
          tokenIds: Uint32Array.from({ length: BS }, (_, t) => (from + i) * BS + t),
          blockSize: BS,
        },
      ],
    });
  }
}

/** What the cache answers must be what the log answers, seq for seq and byte for byte. */
function sameAsLog(ix: LocalIndexer, cache: ReplayCache, start: bigint, max: number): bigint[] {
  const got = cache.read(ix, start, max);
  const want = ix.replay(start, max);
  // The cache may stop early (at a seq it does not hold); what it gives is the log's prefix.
  expect(got.seqs).toEqual(Array.from(want.seqs).slice(0, got.seqs.length));
  for (const [i, p] of got.payloads.entries()) expect(p.equals(want.payloads[i] as Buffer)).toBe(true);
  return got.seqs;
}

describe('replay cache', () => {
  it('answers as the log does, and never from batches the log no longer retains', () => {
    using ix = new LocalIndexer({ blockSize: BS, workerId: 7n, epoch: 1n, bufferSteps: 16 });
    publish(ix, 16, 0);
    const first = ix.oldestSeq as bigint;
    const cache = new ReplayCache(1 << 20);
    // A first read copies out of the log; the same stretch again comes from the cache.
    expect(sameAsLog(ix, cache, first, 8)).toHaveLength(8);
    expect(cache.misses).toBe(8);
    expect(sameAsLog(ix, cache, first, 8)).toHaveLength(8);
    expect(cache.hits).toBe(8);
    // The log turns over: its first 8 batches are gone. A replay from before them starts at the
    // oldest retained batch, as the log's own answer does, not at the cached ones.
    publish(ix, 8, 100);
    expect(ix.oldestSeq).toBe(first + 8n);
    expect(sameAsLog(ix, cache, first, 8)[0]).toBe(first + 8n);
    expect(sameAsLog(ix, cache, first + 8n, 16)).not.toHaveLength(0);
  });

  it('stays within its bytes, dropping its oldest batches first', () => {
    using ix = new LocalIndexer({ blockSize: BS, workerId: 7n, epoch: 1n, bufferSteps: 64 });
    publish(ix, 64, 0);
    const oldest = ix.oldestSeq as bigint;
    const one = ix.replay(oldest, 1).payloads[0]?.length as number;
    const cache = new ReplayCache(one * 10);
    for (let s = oldest; s < oldest + 64n; s += 8n) sameAsLog(ix, cache, s, 8);
    expect(cache.bytes).toBeLessThanOrEqual(one * 10);
    // The newest are kept, the oldest were dropped.
    const misses = cache.misses;
    sameAsLog(ix, cache, oldest + 60n, 4);
    expect(cache.misses).toBe(misses);
    sameAsLog(ix, cache, oldest, 4);
    expect(cache.misses).toBe(misses + 4);
    cache.clear();
    expect(cache.bytes).toBe(0);
  });
});
