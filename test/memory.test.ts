import { describe, expect, it } from 'vitest';
import { hashBlocks, LocalIndexer } from '../src/index.js';

/** RSS growth over `n` synchronous calls (no event-loop turn in between). */
function growth(n: number, fn: () => unknown): number {
  for (let i = 0; i < 1000; i++) fn();
  const before = process.memoryUsage().rss;
  for (let i = 0; i < n; i++) fn();
  return process.memoryUsage().rss - before;
}

describe('hot-path results', () => {
  // Results live in V8-allocated memory: a burst of calls must not hold every result until the
  // event loop turns (each hashBlocks result below is 4 KiB; 20k of them would be 80 MiB, so the
  // bound sits well below that, with room for V8's own GC timing).
  it('do not pile up during a synchronous burst of hashBlocks calls', () => {
    const tokens = Uint32Array.from({ length: 8192 }, (_, i) => i);
    expect(growth(20_000, () => hashBlocks(tokens, { blockSize: 16 }))).toBeLessThan(56 * 1024 * 1024);
  });

  it('do not pile up during a synchronous burst of findMatches calls', () => {
    using ix = new LocalIndexer({ blockSize: 16 });
    const tokens = Uint32Array.from({ length: 8192 }, (_, i) => i);
    ix.applyBatch({
      events: [
        {
          type: 'stored',
          blockHashes: BigUint64Array.from({ length: 512 }, (_, i) => BigInt(i + 1)),
          tokenIds: tokens,
          blockSize: 16,
        },
      ],
    });
    expect(growth(20_000, () => ix.findMatches(tokens))).toBeLessThan(56 * 1024 * 1024);
  });
});
