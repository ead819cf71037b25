// Prints block hashes for a fixed set of inputs through the binding at argv[2] (a napi loader):
// run on two architectures, the outputs must be identical (scripts/arm64_qemu.sh).
const k = require(require('node:path').resolve(process.argv[2]));

let s = 0x9e3779b9;
const rand = () => {
  s ^= s << 13;
  s ^= s >>> 17;
  s ^= s << 5;
  return (s >>> 0) % 150000;
};
const out = { arch: process.arch, hashes: [] };
const cases = [
  { algo: 'xxh3', blockSize: 16 },
  { algo: 'xxh3', blockSize: 1 },
  { algo: 'vllm_sha256', blockSize: 16, noneHashSeed: '0' },
  { algo: 'sglang_sha256', blockSize: 16 },
  { algo: 'trtllm_v2_sha256', blockSize: 32 },
];
for (const opts of cases) {
  for (const n of [0, 15, 16, 333, 8192]) {
    const tokens = Uint32Array.from({ length: n }, rand); // the binding takes typed arrays
    out.hashes.push([opts.algo, opts.blockSize, n, Array.from(k.hashBlocks(tokens, opts), String)]);
  }
}
console.log(JSON.stringify(out));
