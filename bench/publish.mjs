// Publish throughput: events/s from the TS publish API to the wire (ZMQ PUB on loopback, a
// subscriber in another process receiving every batch), against a Python publisher built the
// way vLLM's is (bench/publish_ref.py: msgspec structs, queue + thread, pyzmq). Same workload
// on both sides: 1024-event batches of single-block stored events (16 tokens, chains of 64)
// alternating with removals of the block stored 4096 earlier. Not pinned: each side uses the
// publisher thread, ZMQ's I/O thread and a subscriber process on this 2-core machine.
//
//   npm run build && npm run bench:publish [-- events [rounds]]
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { KvEventPublisher } from '../dist/index.mjs';
import { publishColumnsOf, workload } from './publish_workload.mjs';

const EVENTS = Number(process.argv[2] ?? 2_000_000);
const BATCH = 1024;
const ROUNDS = Number(process.argv[3] ?? 3);

function startSubscriber(endpoint, batches) {
  const proc = spawn(process.execPath, [
    new URL('./publish_sub.mjs', import.meta.url).pathname,
    endpoint,
    String(batches),
  ]);
  const lines = createInterface({ input: proc.stdout });
  let ready;
  const readyP = new Promise((r) => (ready = r));
  const result = new Promise((resolve) => lines.on('line', (l) => (l === 'ready' ? ready() : resolve(JSON.parse(l)))));
  return { ready: readyP, result };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function runColumns(w) {
  const p = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
  const batches = Math.ceil(w.n / BATCH);
  const sub = startSubscriber(p.endpoint, batches);
  await sub.ready;
  await sleep(1000);
  const t0 = performance.now();
  for (let b = 0, at = 0; at < w.n; b++, at += BATCH) {
    const end = Math.min(at + BATCH, w.n);
    p.publishColumns(publishColumnsOf(w, at, end));
    // A producer that yields to the event loop now and then, and backs off while the queue is
    // more than half full (it would otherwise overflow and drop, which the run counts as a gap).
    if (b % 16 === 15) await new Promise(setImmediate);
    while (p.queued > 50_000) await new Promise(setImmediate);
  }
  await p.flush();
  const seconds = (performance.now() - t0) / 1000;
  const received = await sub.result;
  const stats = p.stats();
  await p.close();
  return { seconds, received, stats };
}

async function runObjects(w, n) {
  const p = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
  const events = [];
  for (let e = 0; e < n; e++) {
    if (w.kinds[e] === 0) {
      events.push({
        type: 'stored',
        blockHashes: [w.hashes[e]],
        parentBlockHash: w.hasParent[e] ? w.parents[e] : null,
        tokenIds: w.tokens.subarray(w.tokenStart[e], w.tokenStart[e + 1]),
        blockSize: 16,
        medium: 'GPU',
      });
    } else events.push({ type: 'removed', blockHashes: [w.hashes[e]], medium: 'GPU' });
  }
  const sub = startSubscriber(p.endpoint, Math.ceil(n / BATCH));
  await sub.ready;
  await sleep(1000);
  const t0 = performance.now();
  for (let at = 0; at < n; at += BATCH) {
    p.publish(events.slice(at, at + BATCH));
    await new Promise(setImmediate);
  }
  await p.flush();
  const seconds = (performance.now() - t0) / 1000;
  const received = await sub.result;
  await p.close();
  return { seconds, received };
}

async function runPython(n) {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const endpoint = `tcp://127.0.0.1:${port}`;
  const sub = startSubscriber(endpoint, Math.ceil(n / BATCH));
  const proc = spawn('python3', [new URL('./publish_ref.py', import.meta.url).pathname, endpoint, String(n)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  proc.stdout.on('data', (d) => (out += d));
  await new Promise((r) => proc.on('exit', r));
  const r = JSON.parse(out);
  return { ...r, received: await sub.result };
}

const w = workload(EVENTS);
// kvplane and the baseline alternate for ROUNDS rounds; each side keeps its best (this VM's
// speed swings between windows). Every run must deliver every batch.
let cols;
let py;
const colsRates = [];
const pyRates = [];
const complete = (who, rec) => {
  if (rec.batches !== Math.ceil(w.n / BATCH) || rec.gaps !== 0)
    throw new Error(`${who}: the subscriber got ${rec.batches} batches with ${rec.gaps} gaps`);
};
for (let r = 0; r < ROUNDS; r++) {
  const c = await runColumns(w);
  complete('kvplane', c.received);
  colsRates.push(w.n / c.seconds);
  if (!cols || c.seconds < cols.seconds) cols = c;
  const p = await runPython(EVENTS);
  complete('python', p.received);
  pyRates.push(p.events_per_sec);
  if (!py || p.events_per_sec > py.events_per_sec) py = p;
}
const objN = Math.min(w.n, 200_000);
const objs = await runObjects(w, objN);
const colsRate = w.n / cols.seconds;
const objRate = objN / objs.seconds;
const rows = [
  ['publishColumns → ZMQ (encode + index + send)', colsRate, cols.received],
  ['publish(objects) → ZMQ', objRate, objs.received],
  ['Python msgspec + pyzmq publisher (vLLM-style)', py.events_per_sec, py.received],
];
const list = (rates) => rates.map((r) => (r / 1e6).toFixed(2)).join(', ');
console.log(`best of ${ROUNDS} alternating rounds; kvplane ${list(colsRates)} M, Python ${list(pyRates)} M events/s`);
console.log(`${w.n} events in ${Math.ceil(w.n / BATCH)} batches of ${BATCH}`);
for (const [name, r, rec] of rows) {
  console.log(
    `${name.padEnd(48)} ${(r / 1e6).toFixed(2).padStart(6)} M events/s  ${(r / py.events_per_sec).toFixed(2)}x  (subscriber: ${rec.batches} batches, ${rec.gaps} gaps)`,
  );
}
console.log(`index after the columns run: ${JSON.stringify({ batches: cols.stats.batches, drops: cols.stats.drops })}`);
