import { describe, expect, it } from 'vitest';
import { hashBlocksAsync, KvPlaneError, LocalIndexer } from '../src/index.js';
import { matchesCount, matchesLayout } from '../src/layout.js';
import native from '../src/native.js';

describe('the JS/Rust boundary', () => {
  it('reads packed findMatches results with the offsets the binding packs them at', () => {
    for (let n = 0; n <= 65; n++) {
      const ts = matchesLayout(n);
      expect(ts).toEqual(native.matchesLayout(n));
      expect(matchesCount(ts.words)).toBe(n);
    }
  });

  it('rejects a failed off-thread task with the core error code, not a generic failure', async () => {
    const ix = new LocalIndexer({ blockSize: 4 });
    ix.applyBatch({ events: [{ type: 'stored', blockHashes: [1n], tokenIds: [1, 2, 3, 4], blockSize: 4 }] });
    // Keep libuv's four worker threads busy so the dump only runs after the indexer is closed.
    const tokens = new Uint32Array(40_000_000);
    const busy = Array.from({ length: 4 }, () => hashBlocksAsync(tokens, { blockSize: 16 }));
    const dump = ix.dumpTree();
    ix.close();
    const err = await dump.then(
      () => null,
      (e: unknown) => e,
    );
    await Promise.all(busy);
    expect(err).toBeInstanceOf(KvPlaneError);
    expect(err).toMatchObject({ code: 'ERR_CLOSED', message: 'the LocalIndexer is closed' });
    // The binding's own rejection already carries the code (no message parsing in TS).
    const raw = new native.NativeLocalIndexer({ blockSize: 4 });
    const busyAgain = Array.from({ length: 4 }, () => hashBlocksAsync(tokens, { blockSize: 16 }));
    const rawDump = raw.dumpTree();
    raw.close();
    await expect(rawDump).rejects.toMatchObject({ code: 'ERR_CLOSED' });
    await Promise.all(busyAgain);
  });
});
