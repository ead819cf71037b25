// Side by side, in one run, on the same node streams: `kvplane indexer` and Dynamo's standalone
// KV indexer (`python3 -m dynamo.indexer`, PyPI ai-dynamo-runtime 1.6.1), both registered with
// the same WORKERS ZMQ publishers (bench/router_nodes.mjs, vLLM's wire format, seq from 0) and
// fed the same events at once (bench/router_workload.mjs: shared 8k-token sequences held to random
// depths plus private chains, 4 blocks a BlockStored, 16 events a batch):
//   - ingest: each indexer's CPU seconds (utime + stime of its process, all threads) until it
//     has applied every event (read from its own /metrics), events per CPU-second, and the wall
//     time to apply everything while the nodes publish as fast as their sockets take it;
//   - memory: resident bytes added by the load, per (worker, block) membership;
//   - /query: p50 / p99 of 8k-token requests (HTTP, sequential, keep-alive), the same requests to
//     both, and a check that both give the same answers.
//
//   - with --peers (kvplane's indexer then keeps content hashes, --dump-tokens-hash, which
//     its memory figure includes): a start from a peer (Dynamo's P2P recovery), once the load is in: each
//     indexer's /dump (bytes, seconds), then a new indexer of each kind started with each as its
//     peer, timed from its spawn until it answers /health (both load the dump before they
//     serve), and its answers to the first 50 queries checked against its peer's.
//
//   node bench/router.mjs [--workers 64] [--queries 400] [--seed 1] [--dynamo-threads 1] [--private-chains 8]
//                         [--zmq-receive native|js]   (how kvplane reads the ZMQ streams; default native)
//                         [--peers]
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { BS, queries } from './router_workload.mjs';

const args = process.argv.slice(2);
const flag = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
const WORKERS = Number(flag('--workers', '64'));
const QUERIES = Number(flag('--queries', '400'));
const SEED = Number(flag('--seed', '1'));
const DYNAMO_THREADS = flag('--dynamo-threads', '1');
/** Private chains of 512 blocks per worker (the load's size: 8 gives about 460k memberships over 64 workers). */
const PRIVATE = flag('--private-chains', '8');
const ZMQ_RECEIVE = flag('--zmq-receive', 'native');
const PEERS = args.includes('--peers');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const TICKS = 100; // clock ticks per second (getconf CLK_TCK)

async function freePort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

function cpuSeconds(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / TICKS;
}

function rss(pid) {
  return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
}

async function metricSum(url, name) {
  const text = await (await fetch(`${url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(name) && (line[name.length] === '{' || line[name.length] === ' '))
      sum += Number(line.split(' ').pop());
  }
  return sum;
}

async function waitHealth(url) {
  for (let i = 0; i < 400; i++) {
    try {
      if ((await fetch(`${url}/health`)).ok) return;
    } catch {}
    await sleep(50);
  }
  throw new Error(`${url} did not start`);
}

async function post(url, path, body) {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await res.text();
  if (!res.ok) throw new Error(`${url}${path}: ${res.status} ${text}`);
  return text;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

// The nodes.
const nodes = spawn(process.execPath, ['bench/router_nodes.mjs', String(WORKERS), String(SEED), PRIVATE], {
  stdio: ['pipe', 'pipe', 'inherit'],
});
const nodeLines = createInterface({ input: nodes.stdout })[Symbol.asyncIterator]();
const { endpoints, events, blocks } = JSON.parse((await nodeLines.next()).value);

// The indexers.
const dPort = await freePort();
const kPort = await freePort();
const dynamo = spawn('python3', ['-m', 'dynamo.indexer', '--port', String(dPort), '--threads', DYNAMO_THREADS], {
  stdio: ['ignore', 'ignore', 'ignore'],
});
// KVPLANE_BENCH_INDEXER_NODE_ARGS: extra node flags for kvplane's indexer (e.g. --cpu-prof).
const nodeArgs = (process.env.KVPLANE_BENCH_INDEXER_NODE_ARGS ?? '').split(' ').filter(Boolean);
const wrap = process.env.KVPLANE_BENCH_INDEXER_WRAP;
const kvplane = spawn(
  wrap ?? process.execPath,
  [
    ...(wrap ? [process.execPath] : []),
    ...nodeArgs,
    'dist/cli.js',
    'indexer',
    '--host',
    '127.0.0.1',
    '--port',
    String(kPort),
    '--zmq-receive',
    ZMQ_RECEIVE,
    // A Dynamo indexer starts from its dump only with each block's tokens_hash in it.
    ...(PEERS ? ['--dump-tokens-hash'] : []),
  ],
  {
    stdio: ['ignore', 'ignore', 'inherit'],
  },
);
const sides = [
  {
    name: 'dynamo',
    url: `http://127.0.0.1:${dPort}`,
    proc: dynamo,
    applied: 'dynamo_kvrouter_kv_cache_events_applied',
  },
  { name: 'kvplane', url: `http://127.0.0.1:${kPort}`, proc: kvplane, applied: 'kvplane_indexer_worker_events_total' },
];
try {
  for (const s of sides) await waitHealth(s.url);
  for (const s of sides) {
    for (let w = 0; w < WORKERS; w++) {
      await post(
        s.url,
        '/register',
        JSON.stringify({ instance_id: w + 1, endpoint: endpoints[w], model_name: 'm', block_size: BS }),
      );
    }
  }
  await sleep(1500); // every SUB connected
  for (const s of sides) {
    s.rss0 = rss(s.proc.pid);
    s.cpu0 = cpuSeconds(s.proc.pid);
  }
  const t0 = performance.now();
  nodes.stdin.write('go\n');
  const pending = new Set(sides);
  while (pending.size > 0) {
    for (const s of [...pending]) {
      const n = await metricSum(s.url, s.applied);
      if (n >= events) {
        s.wallS = (performance.now() - t0) / 1000;
        s.cpuS = cpuSeconds(s.proc.pid) - s.cpu0;
        s.appliedEvents = n;
        pending.delete(s);
      }
    }
    if (performance.now() - t0 > 300_000) throw new Error('indexers did not apply every event in 300 s');
    await sleep(50);
  }
  const sent = JSON.parse((await nodeLines.next()).value).sent;
  if (process.env.KVPLANE_BENCH_DIFF) {
    const m = await (await fetch(`${sides[0].url}/metrics`)).text();
    console.error(
      m
        .split('\n')
        .filter((l) => l.startsWith('dynamo_kvrouter'))
        .join('\n'),
    );
  }
  // Resident memory once ingest has settled (kvplane hands the allocator's freed memory back
  // within seconds of a pause).
  await sleep(7000);
  for (const s of sides) s.rssBytes = rss(s.proc.pid) - s.rss0;
  if (process.env.KVPLANE_BENCH_DIFF) console.error(await (await fetch(`${sides[1].url}/health`)).text());

  // Queries: the same 8k-token requests to both, sequential, after a warm-up.
  const qs = queries(QUERIES, SEED).map((q) => JSON.stringify({ token_ids: Array.from(q), model_name: 'm' }));
  let differ = 0;
  const answers = new Map();
  for (const s of sides) {
    for (const body of qs.slice(0, 20)) await post(s.url, '/query', body);
    s.lat = [];
    s.answers = [];
    for (const body of qs) {
      const t = performance.now();
      const a = await post(s.url, '/query', body);
      s.lat.push((performance.now() - t) * 1000);
      s.answers.push(a);
    }
    answers.set(s.name, s.answers);
  }
  const norm = (a) => {
    const j = JSON.parse(a);
    const sort = (v) =>
      v && typeof v === 'object' && !Array.isArray(v)
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sort(v[k])]),
          )
        : v;
    return JSON.stringify(sort({ scores: j.scores, instances: j.instances }));
  };
  for (let i = 0; i < qs.length; i++) {
    if (norm(sides[0].answers[i]) === norm(sides[1].answers[i])) continue;
    if (differ++ === 0 && process.env.KVPLANE_BENCH_DIFF)
      console.error(`first difference:\n  dynamo  ${sides[0].answers[i]}\n  kvplane ${sides[1].answers[i]}`);
  }
  const matchedWorkers = sides[1].answers.reduce((a, x) => a + Object.keys(JSON.parse(x).scores).length, 0) / qs.length;

  const [d, k] = sides;
  const perCpu = (s) => s.appliedEvents / s.cpuS;
  const result = {
    date: new Date().toISOString(),
    workers: WORKERS,
    events,
    memberships: blocks,
    nodes_send_s: sent.seconds,
    dynamo_threads: Number(DYNAMO_THREADS),
    kvplane_zmq_receive: ZMQ_RECEIVE,
    private_chains: Number(PRIVATE),
    queries: QUERIES,
    answers_differ: differ,
    matched_workers_per_query: matchedWorkers,
  };
  for (const s of sides) {
    result[s.name] = {
      cpu_s: +s.cpuS.toFixed(2),
      events_per_cpu_s: Math.round(perCpu(s)),
      wall_s: +s.wallS.toFixed(2),
      events_per_s_wall: Math.round(s.appliedEvents / s.wallS),
      bytes_per_membership: +(s.rssBytes / blocks).toFixed(1),
      query_p50_us: Math.round(pct(s.lat, 0.5)),
      query_p99_us: Math.round(pct(s.lat, 0.99)),
      query_p90_us: Math.round(pct(s.lat, 0.9)),
      query_max_us: Math.round(Math.max(...s.lat)),
    };
  }
  result.ratios = {
    events_per_cpu_s: +(perCpu(k) / perCpu(d)).toFixed(2),
    query_p99: +(pct(k.lat, 0.99) / pct(d.lat, 0.99)).toFixed(2),
    bytes_per_membership: +(k.rssBytes / d.rssBytes).toFixed(2),
  };
  if (PEERS) result.peers = await peerStarts(sides, qs.slice(0, 50), norm);
  console.log(JSON.stringify(result, null, 2));
} finally {
  for (const s of sides) s.proc.kill('SIGTERM');
  nodes.stdin.end();
  nodes.kill('SIGTERM');
}

/** A new indexer of each kind started from each side as its peer (`--peers`). */
async function peerStarts(sides, qs, norm) {
  const out = { dumps: {}, starts: [] };
  for (const s of sides) {
    const t = performance.now();
    const body = await (await fetch(`${s.url}/dump`)).arrayBuffer();
    out.dumps[s.name] = { bytes: body.byteLength, seconds: +((performance.now() - t) / 1000).toFixed(3) };
  }
  for (const kind of ['dynamo', 'kvplane']) {
    for (const peer of sides) {
      const port = await freePort();
      const url = `http://127.0.0.1:${port}`;
      const t = performance.now();
      const proc =
        kind === 'dynamo'
          ? spawn(
              'python3',
              ['-m', 'dynamo.indexer', '--port', String(port), '--threads', DYNAMO_THREADS, '--peers', peer.url],
              {
                stdio: ['ignore', 'ignore', 'ignore'],
              },
            )
          : spawn(
              process.execPath,
              ['dist/cli.js', 'indexer', '--host', '127.0.0.1', '--port', String(port), '--peers', peer.url],
              {
                stdio: ['ignore', 'ignore', 'inherit'],
              },
            );
      try {
        for (let i = 0; ; i++) {
          try {
            if ((await fetch(`${url}/health`)).ok) break;
          } catch {}
          if (i > 12_000) throw new Error(`${kind} from ${peer.name} did not start`);
          await sleep(5);
        }
        const seconds = (performance.now() - t) / 1000;
        // Its resident memory once settled, as the load's is read.
        await sleep(7000);
        const rssMib = Math.round(rss(proc.pid) / 1048576);
        let differ = 0;
        for (const body of qs)
          if (norm(await post(url, '/query', body)) !== norm(await post(peer.url, '/query', body))) differ++;
        out.starts.push({
          indexer: kind,
          peer: peer.name,
          seconds: +seconds.toFixed(2),
          rss_mib: rssMib,
          answers_differ: differ,
        });
      } finally {
        proc.kill('SIGTERM');
        await new Promise((r) => proc.once('exit', r));
      }
    }
  }
  return out;
}
