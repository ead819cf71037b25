/** A seeded PRNG (xorshift64*), so a workload replays exactly from its seed. */
export class Rng {
  #s: bigint;

  constructor(seed: number | bigint) {
    this.#s = (BigInt(seed) ^ 0x9e3779b97f4a7c15n) & 0xffff_ffff_ffff_ffffn || 1n;
  }

  /** A float in [0, 1). */
  next(): number {
    let x = this.#s;
    x ^= x >> 12n;
    x ^= (x << 25n) & 0xffff_ffff_ffff_ffffn;
    x ^= x >> 27n;
    this.#s = x;
    const out = (x * 0x2545f4914f6cdd1dn) & 0xffff_ffff_ffff_ffffn;
    return Number(out >> 11n) / 2 ** 53;
  }

  /** An integer in [lo, hi]. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** `n` token ids in [1, vocab). */
  tokens(n: number, vocab: number): Uint32Array {
    const out = new Uint32Array(n);
    for (let i = 0; i < n; i++) out[i] = 1 + Math.floor(this.next() * (vocab - 1));
    return out;
  }
}

/** Samples ranks 0..n-1 with P(k) ∝ 1 / (k + 1)^s. */
export class Zipf {
  readonly #cdf: Float64Array;

  constructor(n: number, s: number) {
    this.#cdf = new Float64Array(n);
    let sum = 0;
    for (let k = 0; k < n; k++) {
      sum += 1 / (k + 1) ** s;
      this.#cdf[k] = sum;
    }
    for (let k = 0; k < n; k++) this.#cdf[k] = (this.#cdf[k] ?? 0) / sum;
  }

  sample(rng: Rng): number {
    const u = rng.next();
    let lo = 0;
    let hi = this.#cdf.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((this.#cdf[mid] as number) < u) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
