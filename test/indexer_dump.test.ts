import { describe, expect, it } from 'vitest';
import { RouterIndex, readIndexerDump } from '../dist/index.mjs';

const dump = (blockSize: number) =>
  Buffer.from(
    JSON.stringify({
      'm:default': {
        block_size: blockSize,
        events: [
          {
            worker_id: 3,
            storage_tier: 'device',
            event: {
              data: { stored: { parent_hash: null, blocks: [{ block_hash: 1, tokens_hash: 11 }] } },
              dp_rank: 0,
            },
          },
          {
            worker_id: 3,
            event: { data: { stored: { parent_hash: 1, blocks: [{ block_hash: 2, tokens_hash: 12 }] } } },
          },
          { worker_id: 3, event: { data: 'cleared' } },
        ],
      },
    }),
  );

describe('readIndexerDump and RouterIndex.restore', () => {
  it('load an indexer dump into a router index once, by its blocks content hashes', () => {
    const [d] = readIndexerDump(dump(16));
    expect(d).toMatchObject({ name: 'm:default', blockSize: 16, segments: 2, skipped: 1 });
    const ix = new RouterIndex({ blockSize: 16 });
    expect(() => ix.restore(readIndexerDump(dump(32))[0] as NonNullable<typeof d>)).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
    expect(ix.restore(d as NonNullable<typeof d>)).toEqual({ segments: 2, blocks: 2 });
    expect(d?.segments).toBe(0);
    expect(ix.restore(d as NonNullable<typeof d>)).toEqual({ segments: 0, blocks: 0 });
    // Its dump: each block's key (the content hashes chained), and no content hashes (not kept).
    const segs = ix.dump();
    expect(segs.map((s) => [s.workerId, s.parent, [...s.blockHashes], [...s.contentHashes]])).toEqual([
      [3n, null, [1n, 2n], []],
    ]);
    expect(segs[0]?.keys[0]).toBe(11n);
    expect(segs[0]?.keys.length).toBe(2);
    // Kept: the dump carries them.
    const keeping = new RouterIndex({ blockSize: 16, contentHashes: true });
    keeping.restore(readIndexerDump(dump(16))[0] as NonNullable<typeof d>);
    expect(keeping.dump().map((s) => [...s.contentHashes])).toEqual([[11n, 12n]]);
    const m = ix.findMatchesByHash(BigUint64Array.of(11n, 12n, 13n));
    expect([[...m.workerIds], [...m.device]]).toEqual([[3n], [2]]);
    // A worker left out.
    const other = new RouterIndex({ blockSize: 16 });
    expect(other.restore(readIndexerDump(dump(16))[0] as NonNullable<typeof d>, [3n])).toEqual({
      segments: 0,
      blocks: 0,
    });
    for (const bad of [
      '',
      '[]',
      '{"m:default":{"events":[]}}',
      '{"m:default":{"block_size":16,"events":[{"worker_id":"3"}]}}',
    ])
      expect(() => readIndexerDump(Buffer.from(bad))).toThrow(expect.objectContaining({ code: 'ERR_DECODE' }));
  });
});
