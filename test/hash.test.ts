import { describe, expect, it } from 'vitest';
import {
  digestsHex,
  type HashAlgo,
  hashBlocks,
  hashBlocksAsync,
  KvPlaneError,
  signedView,
  toInt64,
  toUint64,
  trtllmCacheSaltId,
} from '../src/index.js';
import { fixtureOptions, type HashFixture, readJson } from './fixtures.js';

type Vector = string | { hex: string; u64: string };
interface SpecVectors {
  cases: Record<string, { tokens: number[]; block_size: number } & Record<string, unknown>>;
}

const spec = readJson<SpecVectors>('fixtures/spec-vectors.json');
const golden = readJson<{
  references: Record<string, string>;
  trtllm_salt_ids: Array<{ salt: string; sha256: string; blake3: string }>;
  cases: HashFixture[];
}>('fixtures/hashes.json');

function u64(s: string): bigint {
  return BigInt.asUintN(64, BigInt(s));
}

describe('spec vectors', () => {
  for (const [name, c] of Object.entries(spec.cases)) {
    for (const [key, want] of Object.entries(c)) {
      if (key === 'tokens' || key === 'block_size') continue;
      it(`${name}: ${key} matches the spec vector`, () => {
        const tokens = Uint32Array.from(c.tokens);
        if (key === 'xxh3_content') {
          expect(hashBlocks(tokens, { algo: 'xxh3_content', blockSize: c.block_size })).toEqual(
            new BigUint64Array([u64(want as string)]),
          );
          return;
        }
        const vectors = want as Vector[];
        const got = hashBlocks(tokens, { algo: key as HashAlgo, blockSize: c.block_size });
        expect([...got]).toEqual(vectors.map((v) => u64(typeof v === 'string' ? v : v.u64)));
        if (key === 'trtllm_v2_sha256') {
          const d = hashBlocks(tokens, { algo: 'trtllm_v2_sha256', blockSize: c.block_size, digests: true });
          expect(digestsHex(d)).toEqual(vectors.map((v) => (v as { hex: string }).hex));
        }
      });
    }
  }
});

describe('golden fixtures from the reference implementations', () => {
  it('cover every algorithm', () => {
    const algos = new Set(golden.cases.map((c) => c.algo));
    for (const a of [
      'xxh3',
      'xxh3_content',
      'vllm_sha256_cbor',
      'vllm_sha256',
      'vllm_xxhash_cbor',
      'vllm_xxhash',
      'sglang_sha256',
      'trtllm_v1_block_key',
      'trtllm_v2_sha256',
    ]) {
      expect(algos.has(a as HashAlgo), a).toBe(true);
    }
  });

  for (const f of golden.cases) {
    it(`${f.algo}: ${f.name}`, () => {
      const opts = fixtureOptions(f);
      const tokens = Uint32Array.from(f.tokens);
      if (f.digests) {
        const got = hashBlocks(tokens, { ...opts, digests: true });
        expect([...got.hashes].map(String)).toEqual(f.hashes);
        expect(digestsHex(got)).toEqual(f.digests);
      } else {
        expect([...hashBlocks(tokens, opts)].map(String)).toEqual(f.hashes);
      }
      if (f.signed) expect([...signedView(hashBlocks(tokens, opts))].map(String)).toEqual(f.signed);
      if (f.options?.cache_salt_id !== undefined) {
        // The precomputed salt id hashes the same as the salt string.
        expect([...hashBlocks(tokens, fixtureOptions(f, true))].map(String)).toEqual(f.hashes);
      }
    });
  }
});

describe('hashBlocks', () => {
  const tokens = Uint32Array.from({ length: 100 }, (_, i) => (i * 2654435761) >>> 0);

  it('accepts a plain number array the same as a Uint32Array', () => {
    const a = hashBlocks(tokens, { algo: 'vllm_sha256', blockSize: 16 });
    const b = hashBlocks([...tokens], { algo: 'vllm_sha256', blockSize: 16 });
    expect(b).toEqual(a);
    expect(a.length).toBe(6);
  });

  it('defaults to xxh3', () => {
    expect(hashBlocks(tokens, { blockSize: 16 })).toEqual(hashBlocks(tokens, { algo: 'xxh3', blockSize: 16 }));
  });

  it('continues a chain from a parent hash or digest exactly as hashing the whole', () => {
    const whole = hashBlocks(tokens, { algo: 'xxh3', blockSize: 10 });
    const tail = hashBlocks(tokens.subarray(40), { algo: 'xxh3', blockSize: 10, parent: whole[3] });
    expect([...tail]).toEqual([...whole.subarray(4)]);
    for (const algo of ['vllm_sha256_cbor', 'sglang_sha256', 'trtllm_v2_sha256'] as const) {
      const w = hashBlocks(tokens, { algo, blockSize: 10, digests: true });
      const parent = w.digests.subarray(3 * w.digestSize, 4 * w.digestSize);
      const t = hashBlocks(tokens.subarray(40), { algo, blockSize: 10, parent, digests: true });
      expect(digestsHex(t)).toEqual(digestsHex(w).slice(4));
    }
  });

  it('resolves the same hashes off the JS thread', async () => {
    const big = Uint32Array.from({ length: 1 << 16 }, (_, i) => i);
    const sync = hashBlocks(big, { algo: 'vllm_sha256_cbor', blockSize: 16, digests: true });
    const off = await hashBlocksAsync(big, { algo: 'vllm_sha256_cbor', blockSize: 16, digests: true });
    expect(off.hashes).toEqual(sync.hashes);
    expect(Buffer.compare(off.digests, sync.digests)).toBe(0);
  });

  it('converts between the signed and unsigned views at the 2^63 edge', () => {
    expect(toInt64(2n ** 63n)).toBe(-(2n ** 63n));
    expect(toInt64(2n ** 64n - 1n)).toBe(-1n);
    expect(toUint64(-1n)).toBe(2n ** 64n - 1n);
    expect(toUint64(toInt64(12289022051202223513n))).toBe(12289022051202223513n);
  });

  it('derives TensorRT-LLM salt ids with SHA-256, or BLAKE3 as older routers did', () => {
    expect(golden.trtllm_salt_ids.length).toBeGreaterThan(2);
    for (const { salt, sha256, blake3 } of golden.trtllm_salt_ids) {
      expect(trtllmCacheSaltId(salt)).toBe(BigInt(sha256));
      expect(trtllmCacheSaltId(salt, { hash: 'blake3' })).toBe(BigInt(blake3));
    }
    expect(() => trtllmCacheSaltId('a', { hash: 'md5' as 'sha256' })).toThrow(KvPlaneError);
  });
});

describe('bad input throws KvPlaneError', () => {
  const t = new Uint32Array(32);
  const cases: Array<[string, () => unknown]> = [
    ['block size 0', () => hashBlocks(t, { blockSize: 0 })],
    ['fractional block size', () => hashBlocks(t, { blockSize: 1.5 })],
    ['block size as a string', () => hashBlocks(t, { blockSize: '16' as unknown as number })],
    ['negative token', () => hashBlocks([1, -1], { blockSize: 1 })],
    ['fractional token', () => hashBlocks([1, 2.5], { blockSize: 1 })],
    ['token above 2^32-1', () => hashBlocks([2 ** 32], { blockSize: 1 })],
    ['non-number token', () => hashBlocks(['1'] as unknown as number[], { blockSize: 1 })],
    ['tokens not an array', () => hashBlocks('abc' as unknown as number[], { blockSize: 1 })],
    ['unknown algo', () => hashBlocks(t, { algo: 'md5' as HashAlgo, blockSize: 16 })],
    ['misspelt option', () => hashBlocks(t, { blockSize: 16, lora_name: 'x' } as never)],
    ['options missing', () => hashBlocks(t, undefined as never)],
    ['option the algo does not take', () => hashBlocks(t, { algo: 'xxh3', blockSize: 16, loraName: 'a' })],
    [
      'wrong option type',
      () => hashBlocks(t, { algo: 'vllm_sha256', blockSize: 16, loraName: 5 as unknown as string }),
    ],
    ['digest parent for a u64 algo', () => hashBlocks(t, { algo: 'xxh3', blockSize: 16, parent: new Uint8Array(32) })],
    ['u64 parent for a digest algo', () => hashBlocks(t, { algo: 'sglang_sha256', blockSize: 16, parent: 1n })],
    ['short parent digest', () => hashBlocks(t, { algo: 'sglang_sha256', blockSize: 16, parent: new Uint8Array(8) })],
    ['negative parent', () => hashBlocks(t, { algo: 'xxh3', blockSize: 16, parent: -1n })],
    ['parent above 2^64', () => hashBlocks(t, { algo: 'xxh3', blockSize: 16, parent: 2n ** 64n })],
    ['xxhash without a seed', () => hashBlocks(t, { algo: 'vllm_xxhash', blockSize: 16 })],
    [
      'salt and salt id',
      () => hashBlocks(t, { algo: 'trtllm_v1_block_key', blockSize: 16, cacheSalt: 'a', cacheSaltId: 1n }),
    ],
    ['digests for a u64 algo', () => hashBlocks(t, { algo: 'xxh3', blockSize: 16, digests: true })],
    [
      'digests not a boolean',
      () => hashBlocks(t, { algo: 'sglang_sha256', blockSize: 16, digests: 1 as unknown as boolean }),
    ],
    ['unsafe integer extra key', () => hashBlocks(t, { algo: 'vllm_sha256', blockSize: 16, extraKeys: [2 ** 60] })],
    // Non-numbers are refused, not coerced ("7" and true would hash as 7 and 1).
    ['a string token', () => hashBlocks([1, '7'] as unknown as number[], { blockSize: 1 })],
    ['a boolean token', () => hashBlocks([true] as unknown as number[], { blockSize: 1 })],
    ['a null token', () => hashBlocks([null] as unknown as number[], { blockSize: 1 })],
    // biome-ignore lint/suspicious/noSparseArray: a hole is what is tested
    ['a missing token', () => hashBlocks([1, , 3] as unknown as number[], { blockSize: 1 })],
    [
      'tokens neither an array nor a Uint32Array',
      () => hashBlocks(new Int32Array(2) as unknown as number[], { blockSize: 1 }),
    ],
    ['toInt64 of a negative', () => toInt64(-1n)],
    ['toUint64 below -2^63', () => toUint64(-(2n ** 63n) - 1n)],
  ];
  for (const [name, fn] of cases) {
    it(`rejects ${name} with ERR_INVALID_ARG`, () => {
      let caught: unknown;
      try {
        fn();
      } catch (err) {
        caught = err;
      }
      expect(caught).toBeInstanceOf(KvPlaneError);
      expect((caught as KvPlaneError).code).toBe('ERR_INVALID_ARG');
    });
  }

  it('rejects bad async input with ERR_INVALID_ARG too', async () => {
    await expect(hashBlocksAsync(t, { blockSize: 0 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' });
    // A non-number token rejects too, as every bad input of the async form does.
    await expect(hashBlocksAsync([1, '7'] as unknown as number[], { blockSize: 1 })).rejects.toMatchObject({
      code: 'ERR_INVALID_ARG',
    });
  });
});
