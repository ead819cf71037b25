// Hashing throughput through the JS API (1M-token Uint32Array, block 16) next to a native XXH3
// reference (xxhash-rust, outside kvplane) and the Python references (vLLM's and SGLang's
// hashing as the engines run it), measured in the same run. This machine is a noisy VM, so the
// references run as child processes driven one request at a time between kvplane's own timings:
// all sides are measured in alternation, BENCH_ROUNDS times, and each keeps its best.
//
//   npm run build && npm run bench:hash
//   BENCH_ROUNDS=20 npm run bench:hash
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

// The two vCPUs of these VMs run at different speeds: pin this process and its reference children
// to one CPU (taskset, inherited by the children) so every side runs on the same core.
if (!process.env.KVPLANE_BENCH_PINNED) {
  try {
    execFileSync('taskset', ['-c', process.env.BENCH_CPU ?? '0', process.execPath, ...process.argv.slice(1)], {
      stdio: 'inherit',
      env: { ...process.env, KVPLANE_BENCH_PINNED: '1' },
    });
    process.exit(0);
  } catch (err) {
    if (err.code !== 'ENOENT') process.exit(err.status ?? 1);
    console.error('taskset not found: running unpinned');
  }
}

const require = createRequire(import.meta.url);
const { hashBlocks } = require('../dist/index.js');

const TOKENS = 1 << 20;
const BLOCK = 16;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 10);
const root = new URL('..', import.meta.url).pathname;

// Deterministic token ids over the full u32 range (xorshift32).
const tokens = new Uint32Array(TOKENS);
let x = 2463534242;
for (let i = 0; i < TOKENS; i++) {
  x ^= x << 13;
  x >>>= 0;
  x ^= x >>> 17;
  x ^= x << 5;
  x >>>= 0;
  tokens[i] = x;
}
const dir = mkdtempSync(join(tmpdir(), 'kvplane-bench-'));
const tokenFile = join(dir, 'tokens.u32le');
writeFileSync(tokenFile, Buffer.from(tokens.buffer));

/** A child process answering one JSON line per request line. */
function server(cmd, args) {
  const child = spawn(cmd, args, { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return {
    async ask(line) {
      child.stdin.write(`${line}\n`);
      const { value, done } = await lines.next();
      if (done) throw new Error(`${cmd} exited`);
      return JSON.parse(value);
    },
    close() {
      child.stdin.end();
    },
  };
}

function timeJs(algo, options, runs) {
  const opts = { algo, blockSize: BLOCK, ...options };
  let best = Infinity;
  let out;
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    out = hashBlocks(tokens, opts);
    best = Math.min(best, performance.now() - t);
  }
  return { seconds: best / 1000, out };
}

execFileSync('cargo', ['build', '--release', '-q', '-p', 'kvplane-core', '--example', 'xxh3_native_ref'], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, CARGO_BUILD_JOBS: process.env.CARGO_BUILD_JOBS ?? '2' },
});
const native = server(join(root, 'target/release/examples/xxh3_native_ref'), [tokenFile, String(BLOCK)]);
const python = server('python3', [join(root, 'bench/hash_ref.py'), tokenFile, String(BLOCK)]);

// [algo, options, JS runs per round, reference]
const algos = [
  ['xxh3', {}, 5, 'native'],
  ['xxh3_content', {}, 5, null],
  ['vllm_sha256', {}, 2, 'python'],
  ['vllm_sha256_cbor', {}, 2, 'python'],
  ['vllm_xxhash', { noneHashSeed: 'vllm-none-hash' }, 2, 'python'],
  ['vllm_xxhash_cbor', { noneHashSeed: 'vllm-none-hash' }, 2, 'python'],
  ['sglang_sha256', {}, 2, 'python'],
  ['trtllm_v1_block_key', {}, 5, null],
  ['trtllm_v2_sha256', {}, 2, null],
];

const best = new Map(); // algo -> { js, ref }
for (let round = 0; round < ROUNDS; round++) {
  for (const [algo, opts, runs, ref] of algos) {
    const b = best.get(algo) ?? { js: Infinity, ref: Infinity };
    const js = timeJs(algo, opts, runs);
    b.js = Math.min(b.js, js.seconds);
    if (ref === 'native') {
      const r = await native.ask(5);
      const checksum = js.out.reduce((a, h) => a ^ h, 0n);
      if (String(checksum) !== r.checksum) throw new Error('native reference disagrees with kvplane xxh3');
      b.ref = Math.min(b.ref, r.seconds);
    } else if (ref === 'python') {
      const r = await python.ask(`${algo} 1`);
      if (String(js.out[0]) !== r.first || String(js.out[js.out.length - 1]) !== r.last) {
        throw new Error(`Python reference disagrees with kvplane ${algo}`);
      }
      b.ref = Math.min(b.ref, r.seconds);
    }
    best.set(algo, b);
  }
}
native.close();
python.close();
rmSync(dir, { recursive: true, force: true });

const rate = (s) => TOKENS / s;
const fmt = (s) => {
  const v = rate(s);
  return v >= 1e9 ? `${(v / 1e9).toFixed(2)} G` : `${(v / 1e6).toFixed(1)} M`;
};
console.log(
  `hashBlocks: ${TOKENS} tokens (random u32), block ${BLOCK}; best of ${ROUNDS} alternating rounds; ${cpus()[0]?.model ?? '?'}, node ${process.version}`,
);
console.log('| algo | kvplane, JS API (tokens/s) | baseline, same run (tokens/s) | ratio |');
console.log('|---|---|---|---|');
for (const [algo, , , ref] of algos) {
  const b = best.get(algo);
  let base = '';
  let ratio = '';
  if (ref === 'native') {
    base = `native XXH3 chain (xxhash-rust) ${fmt(b.ref)}`;
    ratio = `${((b.ref / b.js) * 100).toFixed(0)}% of native`;
  } else if (ref === 'python') {
    base = `Python reference ${fmt(b.ref)}`;
    ratio = `${(b.ref / b.js).toFixed(1)}x Python`;
  }
  console.log(`| ${algo} | ${fmt(b.js)} | ${base} | ${ratio} |`);
}
