// Deterministic workload randomness shared by the benches: 32-bit xorshift for tokens and
// choices, a 64-bit LCG for engine block hashes (bigint).
let x = 0x9e3779b97f4a7c15n;
let seed = 2463534242;

export const rand = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed;
};

export const nextHash = () => {
  x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
  return x;
};
