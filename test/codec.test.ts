import { execFileSync } from 'node:child_process';
import { decode as msgpackDecode } from '@msgpack/msgpack';
import { describe, expect, it } from 'vitest';
import {
  type Dialect,
  decodeBatch,
  decodeBatches,
  decodeRecoverAnswer,
  type EncodeFormat,
  encodeBatch,
  type KvEventBatch,
  type KvEventBatchOut,
  type KvEventOut,
  KvPlaneError,
  LocalIndexer,
} from '../src/index.js';
import { readJson, repoPath } from './fixtures.js';
import { normBatch, sorted } from './normalize.js';

interface CodecCase {
  name: string;
  dialect: Dialect;
  payload: string;
  error?: string;
  reencode?: EncodeFormat;
  expect?: { batches: unknown[]; unknown_events: number; event_ids?: string[][] };
}

const fixtures = readJson<{ cases: CodecCase[] }>('fixtures/codec.json');
const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');
const unhex = (s: string) => Buffer.from(s, 'hex');

describe('golden fixtures from msgspec, the protobuf runtime and TensorRT-LLM JSON', () => {
  it('has every generation, dialect and failure kind', () => {
    const names = fixtures.cases.map((c) => c.name.split('/')[0]);
    for (const gen of [
      'array6',
      'array7',
      'array8',
      'array10',
      'array12',
      'sglang_salted',
      'vllm_map_2026',
      'vllm_map',
      'sglang_map',
      'batch4',
      'trtllm_zmq',
      'smg_proto',
      'trtllm_json',
      'layout',
      'malformed',
    ])
      expect(names, gen).toContain(gen);
  });

  for (const c of fixtures.cases) {
    it(`${c.name} ${c.error ? `fails with ${c.error}` : 'decodes to the reference values'}`, () => {
      const payload = unhex(c.payload);
      if (c.error) {
        let err: unknown;
        try {
          decodeBatches(payload, c.dialect);
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(KvPlaneError);
        expect((err as KvPlaneError).code).toBe(c.error);
        return;
      }
      const d = decodeBatches(payload, c.dialect);
      const got = d.batches.map((b) => normBatch(b, c.dialect === 'smg_proto'));
      expect(sorted(got)).toEqual(sorted(c.expect?.batches));
      expect(d.unknownEvents).toBe(c.expect?.unknown_events);
      if (c.expect?.event_ids) expect(d.eventIds.map((ids) => Array.from(ids, String))).toEqual(c.expect.event_ids);
      if (c.reencode) {
        const [batch] = d.batches;
        expect(hex(encodeBatch(batch as unknown as KvEventBatch, c.reencode))).toBe(c.payload);
      }
    });
  }
});

describe('peers decode what kvplane encodes', () => {
  it('msgspec (vLLM and SGLang structs) and the official protobuf runtime read our bytes as we do', () => {
    const sources = fixtures.cases.filter(
      (c) => !c.error && c.dialect !== 'trtllm_json' && !c.name.includes('1300') && !c.name.startsWith('batch4'),
    );
    const cases: { format: EncodeFormat; hex: string; want: unknown }[] = [];
    for (const c of sources) {
      const batch = decodeBatches(unhex(c.payload), c.dialect).batches[0] as KvEventBatchOut;
      batch.seq = 77n;
      for (const format of ['vllm', 'vllm_legacy', 'sglang', 'smg_proto'] as const) {
        const bytes = encodeBatch(batch as unknown as KvEventBatch, format);
        const ours = decodeBatch(bytes, format === 'smg_proto' ? 'smg_proto' : format === 'sglang' ? 'sglang' : 'vllm');
        cases.push({ format, hex: hex(bytes), want: normBatch(ours, format === 'smg_proto') });
      }
    }
    const out = execFileSync('python3', [repoPath('scripts/codec_peer.py')], {
      input: JSON.stringify({ cases: cases.map(({ format, hex }) => ({ format, hex })) }),
      maxBuffer: 256 << 20,
    });
    const peers = JSON.parse(out.toString()) as Record<string, unknown>[];
    expect(peers).toHaveLength(cases.length);
    cases.forEach((c, i) => {
      const peer = { ...peers[i] };
      expect(peer.error, `${c.format} #${i}`).toBeUndefined();
      if (c.format === 'smg_proto') {
        const ids = peer.event_ids as string[];
        delete peer.event_ids;
        for (const [k, id] of ids.entries()) expect(BigInt(id)).toBe((77n << 32n) | BigInt(k));
      }
      expect(sorted(peer), `${c.format} #${i}`).toEqual(sorted(c.want));
    });
    expect(cases.length).toBeGreaterThan(200);
  }, 60_000);
});

describe('unknown protobuf groups, against the official protobuf runtime', () => {
  it('a group skipped whole is read as the runtime reads it; one ended by another field or never ended is refused by both', () => {
    const batch: KvEventBatch = {
      seq: 5n,
      ts: 1.5,
      events: [{ type: 'removed', blockHashes: [7n, 8n] }],
    } as unknown as KvEventBatch;
    const bytes = encodeBatch(batch, 'smg_proto');
    const key = (field: number, wire: number) => {
      const out: number[] = [];
      for (let v = field * 8 + wire; ; v >>>= 7) {
        if (v < 0x80) return [...out, v];
        out.push((v & 0x7f) | 0x80);
      }
    };
    // Field 99 (unknown to KvEventBatch) as a group holding a varint and a nested group.
    const inner = [...key(1, 0), 42, ...key(2, 3), ...key(3, 5), 1, 2, 3, 4, ...key(2, 4)];
    const variants = {
      whole: [...key(99, 3), ...inner, ...key(99, 4)],
      crossed: [...key(99, 3), ...inner, ...key(98, 4)],
      open: [...key(99, 3), ...inner],
    };
    const cases = Object.entries(variants).map(([name, group]) => ({
      name,
      bytes: Buffer.concat([Buffer.from(group), Buffer.from(bytes)]),
    }));
    const out = execFileSync('python3', [repoPath('scripts/codec_peer.py')], {
      input: JSON.stringify({ cases: cases.map((c) => ({ format: 'smg_proto', hex: hex(c.bytes) })) }),
    });
    const peers = JSON.parse(out.toString()) as Record<string, unknown>[];
    const ours = cases.map((c) => {
      try {
        return normBatch(decodeBatch(c.bytes, 'smg_proto'), true);
      } catch (err) {
        return { error: (err as KvPlaneError).code };
      }
    });
    expect(peers.map((p) => 'error' in p)).toEqual([false, true, true]);
    expect(ours.map((o) => 'error' in (o as object))).toEqual([false, true, true]);
    const peer = { ...peers[0] };
    delete peer.event_ids;
    expect(sorted(peer)).toEqual(sorted(ours[0]));
  });
});

describe('decoding and applying in one call', () => {
  const vllmCase = fixtures.cases.find((c) => c.name === 'vllm_map/1300-events') as CodecCase;

  it('applyEncoded indexes what applyBatch indexes from the same payload', () => {
    const bytes = unhex(vllmCase.payload);
    const decoded = decodeBatch(bytes, 'vllm');
    using a = new LocalIndexer({ blockSize: 16, epoch: 1n });
    using b = new LocalIndexer({ blockSize: 16, epoch: 1n });
    const r = a.applyEncoded(bytes, 'vllm');
    expect(r.events).toBe(1300);
    expect(r.batches.map((x) => x.seq)).toEqual([1n, 2n]); // 1300 events: split at 1024
    const events = decoded.events;
    b.applyBatch({ dpRank: decoded.dpRank, events: events.slice(0, 1024) as KvEventBatch['events'] });
    b.applyBatch({ dpRank: decoded.dpRank, events: events.slice(1024) as KvEventBatch['events'] });
    const [sa, sb] = [a.stats(), b.stats()];
    expect(sa.blocks).toBeGreaterThan(1000);
    expect(sa.memberships).toBe(sb.memberships);
    expect(sa.drops).toEqual(sb.drops);
    const stored = events.find((e) => e.type === 'stored' && e.parentBlockHash === undefined) as KvEventOut;
    const q = (stored.tokenIds as Uint32Array).slice(0, 16);
    expect(a.findMatches(q)).toEqual(b.findMatches(q));
    expect(Array.from(a.findMatches(q).blocks)).toEqual([1]);
  });

  it('refuses bytes that do not decode without applying anything, with typed errors', () => {
    using ix = new LocalIndexer({ blockSize: 16 });
    expect(() => ix.applyEncoded(Buffer.from([0x93, 0xc1]), 'vllm')).toThrow(
      expect.objectContaining({ code: 'ERR_DECODE' }),
    );
    expect(() => ix.applyEncoded(Buffer.from([0x90]), 'nope' as Dialect)).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
    expect(ix.stats().lastSeq).toBe(0n);
  });

  it('fails a rank closed on an unsupported layout and says why', () => {
    using ix = new LocalIndexer({ blockSize: 16 });
    const partial = encodeBatch(
      {
        dpRank: 3,
        events: [{ type: 'stored', blockHashes: [1n], tokenIds: new Uint32Array(10), blockSize: 16 }],
      },
      'vllm',
    );
    expect(() => decodeBatch(partial, 'vllm')).toThrow(
      expect.objectContaining({ code: 'ERR_UNSUPPORTED_LAYOUT', message: expect.stringContaining('dp_rank 3') }),
    );
    const r = ix.applyEncoded(partial, 'vllm');
    expect(r.batches[0]?.errors[0]?.code).toBe('ERR_UNSUPPORTED_LAYOUT');
    expect(ix.stats().perWorker.find((w) => w.dpRank === 3)?.needsRecovery).toBe(true);
  });

  it('rejects unknown dialects and formats', () => {
    expect(() => decodeBatches(Buffer.alloc(1), 'x' as Dialect)).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
    expect(() => encodeBatch({ events: [] }, 'x' as EncodeFormat)).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
    expect(() => decodeBatches(42 as unknown as Uint8Array, 'vllm')).toThrow(KvPlaneError);
  });
});

describe('/kv_recover answers', () => {
  const big = (1n << 64n) - 5n;
  function indexer() {
    const ix = new LocalIndexer({ blockSize: 2, bufferSteps: 2, epoch: (1n << 63n) + 9n });
    ix.applyBatch({
      dpRank: 0,
      events: [{ type: 'stored', blockHashes: [big, 7n], tokenIds: [1, 2, 3, 4], blockSize: 2 }],
    });
    for (let i = 0; i < 3; i++)
      ix.applyBatch({
        dpRank: 0,
        events: [
          { type: 'stored', blockHashes: [100n + BigInt(i)], parentBlockHash: 7n, tokenIds: [5, i], blockSize: 2 },
        ],
      });
    return ix;
  }

  it('writes Events, TreeDump, TooNew and InvalidRange as JSON with exact u64 integers', async () => {
    using ix = indexer();
    const events = (await ix.recover(3n)).toString();
    expect(events).toMatch(/^\{"Events":\{"batches":\[\{"seq":3,/);
    expect(events).toContain('"last_seq":4,"epoch":9223372036854775817}}');
    const dump = (await ix.recover(1n)).toString();
    expect(dump).toContain(`"block_hashes":[${big},7]`);
    expect(dump).toMatch(/^\{"TreeDump":\{"workers":\[\{"worker_id":0,"dp_rank":0,"events":\[/);
    expect(JSON.parse(dump).TreeDump.workers[0].events).toHaveLength(4);
    expect((await ix.recover(9n)).toString()).toBe('{"TooNew":{"last_seq":4,"epoch":9223372036854775817}}');
    expect(JSON.parse((await ix.recover(4n, 3n)).toString()).InvalidRange.reason).toBe('end 3 < start 4');
  });

  it('writes the same answers as msgpack, events in vLLM encoding', async () => {
    using ix = indexer();
    const dump = msgpackDecode(await ix.recover(undefined, undefined, 'msgpack'), { useBigInt64: true }) as {
      TreeDump: {
        workers: { events: { type: string; block_hashes: (bigint | number)[] }[] }[];
        epoch: bigint;
        last_seq: bigint;
      };
    };
    expect(dump.TreeDump.epoch).toBe((1n << 63n) + 9n);
    // (@msgpack/msgpack gives bigints only for 64-bit markers; small values come as numbers.)
    expect(BigInt(dump.TreeDump.last_seq)).toBe(4n);
    expect(dump.TreeDump.workers[0]?.events[0]).toMatchObject({ type: 'BlockStored', block_hashes: [big, 7] });
    const ev = msgpackDecode(await ix.recover(4n, 4n, 'msgpack'), { useBigInt64: true }) as {
      Events: { batches: { seq: bigint }[] };
    };
    expect(ev.Events.batches.map((b) => BigInt(b.seq))).toEqual([4n]);
    await expect(ix.recover(1n, 2n, 'xml' as 'json')).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' });
  });

  it('reads a msgpack answer back as the indexer gives it (a router recovering from a node)', async () => {
    using ix = indexer();
    // Events (a bounded part, with the seq to ask next), the tree dump, and the two refusals.
    for (const [start, end] of [
      [3n, 4n],
      [4n, 4n],
      [undefined, undefined],
      [9n, undefined],
      [4n, 3n],
    ] as const) {
      const read = decodeRecoverAnswer(await ix.recover(start, end, 'msgpack'));
      expect(read).toEqual(start === undefined ? await ix.dumpTree() : ix.getEvents(start, end));
    }
    expect(decodeRecoverAnswer(await ix.recover(1n, undefined, 'msgpack')).kind).toBe('TreeDump');
    expect(() => decodeRecoverAnswer(Buffer.from('{"TooNew":{}}'))).toThrow(
      expect.objectContaining({ code: 'ERR_DECODE' }),
    );
  });
});
