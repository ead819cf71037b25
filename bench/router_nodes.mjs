// The router bench's engine nodes: WORKERS ZMQ PUB sockets (unbounded send HWM, so nothing is
// dropped), each publishing its worker's pre-encoded vLLM batches (seq from 0) once told "go" on
// stdin, as fast as the sockets take them. Prints {"endpoints": [...]} first, then
// {"sent": {...}} when done; stays up until stdin closes.
//
//   node bench/router_nodes.mjs WORKERS SEED
import { createInterface } from 'node:readline';
import { Publisher } from 'zeromq';
import { encodeBatch } from '../dist/index.mjs';
import { EVENTS_PER_BATCH, workerEvents } from './router_workload.mjs';

const [workers, seed, privateChains] = [Number(process.argv[2]), Number(process.argv[3]), Number(process.argv[4] ?? 8)];
const sockets = [];
const batches = [];
let events = 0;
let blocks = 0;
for (let w = 0; w < workers; w++) {
  const sock = new Publisher({ sendHighWaterMark: 0, linger: 0 });
  await sock.bind('tcp://127.0.0.1:*');
  sockets.push(sock);
  const wl = workerEvents(w, seed, { privateChains });
  events += wl.events.length;
  blocks += wl.blocks;
  const mine = [];
  for (let i = 0; i < wl.events.length; i += EVENTS_PER_BATCH) {
    const seq = Buffer.alloc(8);
    seq.writeBigUInt64BE(BigInt(mine.length));
    const payload = encodeBatch({ ts: 0, dpRank: 0, events: wl.events.slice(i, i + EVENTS_PER_BATCH) }, 'vllm');
    mine.push([Buffer.alloc(0), seq, payload]);
  }
  batches.push(mine);
}
console.log(JSON.stringify({ endpoints: sockets.map((s) => s.lastEndpoint), events, blocks }));

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.trim() !== 'go') continue;
  const start = performance.now();
  const longest = Math.max(...batches.map((b) => b.length));
  for (let i = 0; i < longest; i++) {
    const sends = [];
    for (let w = 0; w < workers; w++) {
      const b = batches[w][i];
      if (b) sends.push(sockets[w].send(b));
    }
    await Promise.all(sends);
  }
  console.log(JSON.stringify({ sent: { events, seconds: (performance.now() - start) / 1000 } }));
}
for (const s of sockets) s.close();
