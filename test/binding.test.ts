import { describe, expect, it } from 'vitest';
import { KvPlaneError, LocalIndexer } from '../src/index.js';
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
    // A drain for a negative DP rank fails inside the task, on a worker thread.
    const queue = new native.NativeEventQueue(10);
    queue.pushEvents([{ type: 'cleared' }]);
    const raw = new native.NativeLocalIndexer({ blockSize: 4 });
    const err = await raw.drainAsync(queue, 10, 1, -1).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect(err).toMatchObject({ code: 'ERR_INVALID_ARG', message: 'dpRank -1 is negative' });
    queue.pushEvents([{ type: 'cleared' }]);
    const ix = new LocalIndexer({ blockSize: 4 });
    await expect(ix.drainAsync(queue, 10, 1, -1)).rejects.toSatisfy(
      (e) => e instanceof KvPlaneError && e.code === 'ERR_INVALID_ARG' && e.message === 'dpRank -1 is negative',
    );
  });
});
