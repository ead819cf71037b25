import { describe, expect, it } from 'vitest';
import { hashBlocks, type KvEvent, type KvEventBatch, KvPlaneError, LocalIndexer, type Matches } from '../src/index.js';

const BS = 4;
const tokens = (n: number, base = 0) => Uint32Array.from({ length: n * BS }, (_, i) => base + i);
/** Engine hashes differ from kvplane's keys: any opaque ids will do. */
const engineHashes = (n: number, base: bigint) => BigUint64Array.from({ length: n }, (_, i) => base + BigInt(i));

function stored(n: number, base: bigint, parent: bigint | null = null, tokenBase = 0): KvEvent {
  return {
    type: 'stored',
    blockHashes: engineHashes(n, base),
    parentBlockHash: parent,
    tokenIds: tokens(n, tokenBase),
    blockSize: BS,
  };
}

function byWorker(m: Matches): Record<string, number> {
  const out: Record<string, number> = {};
  m.workerIds.forEach((id, i) => {
    out[`${id}/${m.dpRanks[i]}`] = m.blocks[i] ?? -1;
  });
  return out;
}

function indexer(): LocalIndexer {
  return new LocalIndexer({ blockSize: BS, workerId: 7n, epoch: 99n });
}

describe('LocalIndexer', () => {
  it('matches the leading cached blocks of each DP rank', () => {
    using ix = indexer();
    ix.applyBatch({ dpRank: 0, events: [stored(6, 100n)] });
    ix.applyBatch({ dpRank: 1, events: [stored(2, 200n)] });
    const m = ix.findMatches(tokens(8));
    expect(byWorker(m)).toEqual({ '7/0': 6, '7/1': 2 });
    expect([...m.treeSizes]).toEqual([6n, 2n]);
    // the same query given as chained hashes
    const seqHashes = hashBlocks(tokens(8), { algo: 'xxh3', blockSize: BS });
    expect(byWorker(ix.findMatches({ seqHashes }))).toEqual({ '7/0': 6, '7/1': 2 });
    // the same query as plain numbers; a number that is not a token id, or a non-number, refused
    expect(byWorker(ix.findMatches([...tokens(8)]))).toEqual({ '7/0': 6, '7/1': 2 });
    expect(() => ix.findMatches([1, 2.5])).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    expect(() => ix.findMatches([1, null] as unknown as number[])).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG', message: 'query: token at index 1 is null, not a number' }),
    );
    // a worker filter
    expect(byWorker(ix.findMatches(tokens(8), { workers: [{ workerId: 7n, dpRank: 1 }] }))).toEqual({ '7/1': 2 });
  });

  it('returns every field right for odd and even numbers of matched workers', () => {
    using ix = indexer();
    for (let r = 0; r < 5; r++) {
      ix.applyBatch({ dpRank: r, events: [stored(r + 1, 1000n * BigInt(r + 1))] });
      const m = ix.findMatches(tokens(8));
      expect([...m.dpRanks]).toEqual(Array.from({ length: r + 1 }, (_, i) => i));
      expect([...m.blocks]).toEqual(Array.from({ length: r + 1 }, (_, i) => i + 1));
      expect([...m.treeSizes]).toEqual(Array.from({ length: r + 1 }, (_, i) => BigInt(i + 1)));
      expect([...m.workerIds]).toEqual(Array.from({ length: r + 1 }, () => 7n));
    }
  });

  it('chains stores from a parent, removes, and clears one rank only', () => {
    using ix = indexer();
    ix.applyBatch({ dpRank: 0, events: [stored(2, 100n), stored(2, 300n, 101n, 2 * BS)] });
    expect(byWorker(ix.findMatches(tokens(4)))).toEqual({ '7/0': 4 });
    ix.applyBatch({ dpRank: 0, events: [{ type: 'removed', blockHashes: [301n] }] });
    expect(byWorker(ix.findMatches(tokens(4)))).toEqual({ '7/0': 3 });
    ix.applyBatch({ dpRank: 1, events: [stored(1, 500n)] });
    ix.applyBatch({ dpRank: 0, events: [{ type: 'cleared' }] });
    expect(byWorker(ix.findMatches(tokens(4)))).toEqual({ '7/1': 1 });
    expect(ix.stats().memberships).toBe(1);
    expect(ix.stats().tokenBytes).toBe(BS * 4);
  });

  it('counts unknown parents, unknown removes and duplicates, and flags the rank for recovery', () => {
    using ix = indexer();
    ix.applyBatch({
      events: [stored(2, 100n), stored(2, 100n), stored(1, 900n, 12345n, 64), { type: 'removed', blockHashes: [777n] }],
    });
    const s = ix.stats();
    expect(s.drops).toEqual({ unknown_parent: 1, unknown_removed: 1, duplicate_store: 2, unsupported_layout: 0 });
    expect(s.perWorker[0]).toMatchObject({ workerId: 7n, dpRank: 0, blocks: 2, needsRecovery: true });
  });

  it('fails closed on a stored event whose tokens do not fill its blocks', () => {
    using ix = indexer();
    ix.applyBatch({ events: [stored(2, 100n)] });
    const partial: KvEvent = {
      type: 'stored',
      blockHashes: [5n],
      parentBlockHash: 101n,
      tokenIds: [1, 2],
      blockSize: BS,
    };
    const r = ix.applyBatch({ events: [partial] });
    expect(r.errors).toHaveLength(1);
    expect(r.errors[0]).toBeInstanceOf(KvPlaneError);
    expect(r.errors[0]?.code).toBe('ERR_UNSUPPORTED_LAYOUT');
    expect(r.errors[0]?.message).toMatch(/^Unsupported BlockStored layout/);
    expect(ix.findMatches(tokens(2)).workerIds.length).toBe(0);
    expect(ix.stats().drops.unsupported_layout).toBe(1);
  });

  it('answers recovery with Events, TreeDump, TooNew and InvalidRange', async () => {
    using ix = new LocalIndexer({ blockSize: BS, workerId: 7n, epoch: 99n, bufferSteps: 3 });
    expect(ix.applyBatch({ events: [stored(2, 100n)] }).seq).toBe(1n);
    for (let i = 0; i < 4; i++) {
      ix.applyBatch({ seq: BigInt(i + 2), events: [stored(1, 200n + BigInt(i), 101n, 1000 + i * 10)] });
    }
    const events = ix.getEvents(4n);
    expect(events.kind).toBe('Events');
    if (events.kind !== 'Events') throw new Error('unreachable');
    expect(events.batches.map((b) => b.seq)).toEqual([4n, 5n]);
    expect(events.epoch).toBe(99n);
    expect(events.batches[0]?.events[0]?.blockHashes).toEqual(new BigUint64Array([202n]));
    expect(ix.getEvents(6n)).toMatchObject({ kind: 'TooNew', lastSeq: 5n });
    expect(ix.getEvents(5n, 4n)).toMatchObject({ kind: 'InvalidRange' });
    const dump = ix.getEvents(1n);
    expect(dump.kind).toBe('TreeDump');
    if (dump.kind !== 'TreeDump') throw new Error('unreachable');
    expect(dump.lastSeq).toBe(5n);
    // parents before children, one event per chain segment, tokens included
    const evs = dump.workers[0]?.events ?? [];
    expect(evs[0]?.blockHashes).toEqual(new BigUint64Array([100n, 101n]));
    expect(evs[0]?.tokenIds).toEqual(tokens(2));
    expect(evs.slice(1).every((e) => e.parentBlockHash === 101n)).toBe(true);
    expect(await ix.dumpTree()).toEqual(dump);
  });

  it('rebuilds identical matches from a tree dump', async () => {
    using ix = indexer();
    ix.applyBatch({ dpRank: 0, events: [stored(5, 100n)] });
    ix.applyBatch({ dpRank: 0, events: [stored(3, 400n, 102n, 999)] });
    ix.applyBatch({ dpRank: 2, events: [stored(3, 600n)] });
    const dump = await ix.dumpTree();
    using fresh = indexer();
    for (const w of dump.workers) {
      fresh.applyBatch({ dpRank: w.dpRank, events: w.events as KvEvent[] });
    }
    const q = [tokens(6), Uint32Array.from([...tokens(3), ...Array.from({ length: 3 * BS }, (_, i) => 999 + i)])];
    for (const query of q) expect(fresh.findMatches(query)).toEqual(ix.findMatches(query));
  });

  it('applies columns as the same batches applyBatch makes of the same events', () => {
    // 1500 events: chains of stored blocks (some rooted), a few removals, then a clear.
    const n = 1500;
    const kinds = new Uint8Array(n);
    const hashCounts = new Uint32Array(n);
    const hashes: bigint[] = [];
    const parents = new BigUint64Array(n);
    const hasParent = new Uint8Array(n);
    const toks: number[] = [];
    const events: KvEvent[] = [];
    for (let i = 0; i < n - 1; i++) {
      if (i % 10 === 9) {
        kinds[i] = 1;
        hashCounts[i] = 1;
        hashes.push(1000n + BigInt(i - 1));
        events.push({ type: 'removed', blockHashes: new BigUint64Array([1000n + BigInt(i - 1)]), medium: 'GPU' });
        continue;
      }
      const count = 1 + (i % 3);
      const hs = engineHashes(count, 100_000n + BigInt(i) * 10n);
      const parent = i % 10 === 0 ? null : (hashes[hashes.length - 1] ?? null);
      const t = tokens(count, i * 100);
      hashCounts[i] = count;
      hashes.push(...hs);
      if (parent !== null) {
        parents[i] = parent;
        hasParent[i] = 1;
      }
      toks.push(...t);
      events.push({
        type: 'stored',
        blockHashes: hs,
        parentBlockHash: parent,
        tokenIds: t,
        blockSize: BS,
        medium: 'GPU',
      });
    }
    kinds[n - 1] = 2;
    events.push({ type: 'cleared' });
    using byColumns = indexer();
    const cols = {
      kinds,
      hashCounts,
      hashes: BigUint64Array.from(hashes),
      parents,
      hasParent,
      tokens: Uint32Array.from(toks),
      blockSize: BS,
      medium: 'GPU',
    };
    const applied = byColumns.applyColumns(
      {
        ...cols,
        kinds: kinds.subarray(0, n - 1),
        hashCounts: hashCounts.subarray(0, n - 1),
        parents: parents.subarray(0, n - 1),
        hasParent: hasParent.subarray(0, n - 1),
      },
      { dpRank: 3, ts: 5 },
    );
    expect(applied.map((b) => b.seq)).toEqual([1n, 2n]);
    using byEvents = indexer();
    byEvents.applyBatch({ ts: 5, dpRank: 3, events: events.slice(0, 1024) });
    byEvents.applyBatch({ ts: 5, dpRank: 3, events: events.slice(1024, n - 1) });
    expect(byColumns.getEvents(1n)).toEqual(byEvents.getEvents(1n));
    expect(byColumns.stats()).toEqual(byEvents.stats());
    // events 0 and 1: one block, then two chained under it
    const query = Uint32Array.from([...tokens(1, 0), ...tokens(2, 100)]);
    expect(byColumns.findMatches(query)).toEqual(byEvents.findMatches(query));
    expect(byColumns.findMatches(query).blocks[0]).toBe(3);
    // the clear as a column event
    const last = byColumns.applyColumns(
      {
        ...cols,
        kinds: kinds.subarray(n - 1),
        hashCounts: hashCounts.subarray(n - 1),
        hashes: new BigUint64Array(),
        parents: parents.subarray(n - 1),
        hasParent: hasParent.subarray(n - 1),
        tokens: new Uint32Array(),
      },
      { dpRank: 3 },
    );
    expect(last.map((b) => b.seq)).toEqual([3n]);
    expect(byColumns.stats().memberships).toBe(0);
  });

  it('refuses inconsistent columns with ERR_INVALID_ARG and applies nothing', () => {
    using ix = indexer();
    const good = {
      kinds: new Uint8Array([0, 0]),
      hashCounts: new Uint32Array([1, 1]),
      hashes: new BigUint64Array([1n, 2n]),
      parents: new BigUint64Array([0n, 1n]),
      hasParent: new Uint8Array([0, 1]),
      tokens: tokens(2),
      blockSize: BS,
    };
    for (const bad of [
      { ...good, tokens: tokens(1) },
      { ...good, hashCounts: new Uint32Array([1, 2]) },
      { ...good, kinds: new Uint8Array([0, 7]) },
      { ...good, hasParent: new Uint8Array([0]) },
      // wrong array types
      { ...good, hashes: [1n, 2n] as unknown as BigUint64Array },
      { ...good, tokens: new Uint8Array(32) as unknown as Uint32Array },
      { ...good, kinds: undefined as unknown as Uint8Array },
      // a LoRA id outside i64
      { ...good, loraId: 2n ** 63n },
    ]) {
      expect(() => ix.applyColumns(bad)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    }
    expect(ix.stats().memberships).toBe(0);
    expect(ix.lastSeq).toBe(0n);
    expect(ix.applyColumns(good)[0]?.seq).toBe(1n);
    expect(ix.stats().memberships).toBe(2);
  });

  it('throws typed errors for bad input and after close', () => {
    const ix = indexer();
    const bad: Array<[string, () => unknown]> = [
      ['a seq that skips', () => ix.applyBatch({ seq: 9n, events: [] })],
      ['an unknown event type', () => ix.applyBatch({ events: [{ type: 'moved' } as unknown as KvEvent] })],
      [
        'a stored event without hashes',
        () => ix.applyBatch({ events: [{ type: 'stored', tokenIds: [], blockSize: 4 } as unknown as KvEvent] }),
      ],
      [
        'a token above 2^32-1',
        () =>
          ix.applyBatch({
            events: [{ type: 'stored', blockHashes: [1n], tokenIds: [2 ** 32, 0, 0, 0], blockSize: 4 }],
          }),
      ],
      ['a negative hash', () => ix.applyBatch({ events: [{ type: 'removed', blockHashes: [-1n] }] })],
      [
        'a LoRA id outside i64',
        () =>
          ix.applyBatch({
            events: [
              { type: 'stored', blockHashes: [1n], tokenIds: [1, 2, 3, 4], blockSize: 4, loraId: 2n ** 64n + 7n },
            ],
          }),
      ],
      ['a negative dpRank', () => ix.applyBatch({ dpRank: -1, events: [] })],
      [
        'more than 1024 events',
        () => ix.applyBatch({ events: Array.from({ length: 1025 }, () => ({ type: 'cleared' }) as KvEvent) }),
      ],
      ['a number where a bigint belongs', () => ix.getEvents(3 as unknown as bigint)],
      [
        'seqHashes that are not a BigUint64Array',
        () => ix.findMatches({ seqHashes: [1n] as unknown as BigUint64Array }),
      ],
      ['no options', () => new LocalIndexer(undefined as never)],
      ['block size 0', () => new LocalIndexer({ blockSize: 0 })],
      ['bufferSteps 0', () => new LocalIndexer({ blockSize: 4, bufferSteps: 0 })],
      ['keyBy engine without engineHash', () => new LocalIndexer({ blockSize: 4, keyBy: 'engine' })],
    ];
    for (const [name, fn] of bad) {
      expect(fn, name).toThrow(KvPlaneError);
      try {
        fn();
      } catch (e) {
        expect((e as KvPlaneError).code, name).toBe('ERR_INVALID_ARG');
      }
    }
    expect(ix.stats().lastSeq).toBe(0n);
    ix.close();
    expect(ix.closed).toBe(true);
    for (const fn of [
      () => ix.applyBatch({ events: [] }),
      () => ix.findMatches([1, 2, 3, 4]),
      () => ix.stats(),
      () => ix.getEvents(),
    ]) {
      expect(fn).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
    }
  });

  it('keys by the engine hash for hash-only events', () => {
    using ix = new LocalIndexer({ blockSize: 16, keyBy: 'engine', engineHash: { algo: 'vllm_sha256' } });
    const t = Uint32Array.from({ length: 48 }, (_, i) => i * 7);
    const h = hashBlocks(t, { algo: 'vllm_sha256', blockSize: 16 });
    const batch: KvEventBatch = { events: [{ type: 'stored', blockHashes: h, tokenIds: [], blockSize: 16 }] };
    expect(ix.applyBatch(batch).errors).toEqual([]);
    expect([...ix.findMatches(t).blocks]).toEqual([3]);
    expect([...ix.findMatches(t.subarray(0, 32)).blocks]).toEqual([2]);
  });
});
