// gRPC fan-out: 16 subscribers on loopback, each receiving the full SubscribeKvEvents stream;
// events/s received per subscriber and server CPU per event. kvplane (publishColumns -> index,
// protobuf encoded once per batch in Rust, the same bytes written to every stream) against a
// straightforward grpc-js server that holds each batch as JS objects and encodes it with
// protobufjs for every subscriber. Same workload as the publish bench (1024-event batches of
// single-block stores and removals, medium GPU); the subscribers run in another process
// (bench/grpc_sub.mjs), one connection each, and must see every seq.
//
//   npm run build && npm run bench:grpc [-- events [subscribers]]   (BENCH_ONLY=kvplane skips the baseline)
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Metadata, Server, ServerCredentials } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { KvEventPublisher, KvGrpcServer } from '../dist/index.mjs';
import { publishColumnsOf, workload } from './publish_workload.mjs';

const EVENTS = Number(process.argv[2] ?? 1_000_000);
const SUBSCRIBERS = Number(process.argv[3] ?? 16);
const BATCH = 1024;
/** Producers back off while a subscriber has more than this many batches waiting. */
const MAX_WAITING = 64;

const now = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startSubscribers(address, batches) {
  const proc = spawn(process.execPath, [
    fileURLToPath(new URL('./grpc_sub.mjs', import.meta.url)),
    address,
    String(SUBSCRIBERS),
    String(batches),
  ]);
  proc.stderr.pipe(process.stderr);
  const lines = createInterface({ input: proc.stdout });
  let ready;
  const readyP = new Promise((r) => (ready = r));
  const result = new Promise((resolve, reject) => {
    lines.on('line', (l) => (l === 'ready' ? ready() : resolve(JSON.parse(l))));
    proc.on('exit', (code) => reject(new Error(`subscriber process exited (${code}) before reporting`)));
  });
  return { ready: readyP, result };
}

/** Runs a producer against the subscriber process; `publish(at, end)` publishes one batch. */
async function measure(address, publish, waiting, flush) {
  const batches = Math.ceil(EVENTS / BATCH);
  const subs = startSubscribers(address, batches);
  await subs.ready;
  await sleep(300);
  const cpu0 = process.cpuUsage();
  const t0 = now();
  for (let b = 0, at = 0; at < EVENTS; b++, at += BATCH) {
    publish(b, at, Math.min(at + BATCH, EVENTS));
    if (b % 16 === 15) await new Promise(setImmediate);
    while (waiting() > MAX_WAITING) await sleep(1);
  }
  await flush();
  const got = await subs.result;
  const cpu = process.cpuUsage(cpu0);
  const ends = got.subscribers.map((s) => s.end);
  const rates = got.subscribers.map((s) => s.events / ((s.end - t0) / 1000)).sort((a, b) => a - b);
  const complete = got.subscribers.every((s) => s.batches === batches && s.gaps === 0 && s.status === null);
  return {
    complete,
    minRate: rates[0],
    medianRate: rates[Math.floor(rates.length / 2)],
    seconds: (Math.max(...ends) - t0) / 1000,
    serverCpuNsPerEvent: ((cpu.user + cpu.system) * 1000) / EVENTS,
    clientCpuNsPerEvent: (got.cpuSeconds * 1e9) / (EVENTS * SUBSCRIBERS),
    statuses: [...new Set(got.subscribers.map((s) => s.status).filter(Boolean))],
    gaps: got.subscribers.reduce((n, s) => n + s.gaps, 0),
    short: got.subscribers.filter((s) => s.batches !== batches).length,
  };
}

async function runKvplane(w) {
  const p = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
  const g = await KvGrpcServer.create({ stream: p.stream, host: '127.0.0.1' });
  const r = await measure(
    `127.0.0.1:${g.port}`,
    (_b, at, end) => p.publishColumns(publishColumnsOf(w, at, end)),
    () => Math.max(g.stats().maxLag, p.queued / BATCH),
    () => p.flush(),
  );
  r.cutOff = g.stats().cutOff;
  r.drops = p.stats().drops.queue_full;
  await g.close();
  await p.close();
  return r;
}

/** The baseline's batch objects, built from the same columns (hashes as signed int64 strings). */
function batchObject(w, seq, at, end) {
  const i64 = (h) => BigInt.asIntN(64, h).toString();
  const events = [];
  for (let e = at; e < end; e++) {
    const eventId = ((BigInt(seq) << 32n) | BigInt(e - at)).toString();
    if (w.kinds[e] === 0) {
      const stored = {
        blocks: [
          {
            block_hash: i64(w.hashes[e]),
            token_ids: Array.from(w.tokens.subarray(w.tokenStart[e], w.tokenStart[e + 1])),
            block_size: 16,
            cache_level: 0,
          },
        ],
        tier: 1,
        medium: 'GPU',
      };
      if (w.hasParent[e]) stored.parent_block_hash = i64(w.parents[e]);
      events.push({ event_id: eventId, stored });
    } else {
      events.push({
        event_id: eventId,
        removed: { block_hashes: [i64(w.hashes[e])], cache_level: 0, tier: 1, medium: 'GPU' },
      });
    }
  }
  return { sequence_number: seq, timestamp: Date.now() / 1000, events };
}

async function runBaseline(w) {
  const root = new protobuf.Root();
  root.loadSync(fileURLToPath(new URL('../proto/common.proto', import.meta.url)), { keepCase: true });
  const KvEventBatch = root.lookupType('smg.grpc.common.KvEventBatch');
  const server = new Server();
  const calls = new Set();
  server.addService(
    {
      SubscribeKvEvents: {
        path: '/vllm.grpc.engine.VllmEngine/SubscribeKvEvents',
        requestStream: false,
        responseStream: true,
        requestSerialize: (b) => b,
        requestDeserialize: (b) => b,
        // Encoded for every subscriber it is written to.
        responseSerialize: (obj) => Buffer.from(KvEventBatch.encode(obj).finish()),
        responseDeserialize: (b) => b,
      },
    },
    {
      SubscribeKvEvents(call) {
        call.sendMetadata(new Metadata());
        calls.add(call);
        call.on('cancelled', () => calls.delete(call));
      },
    },
  );
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const r = await measure(
    `127.0.0.1:${port}`,
    (b, at, end) => {
      const batch = batchObject(w, b + 1, at, end);
      for (const c of calls) c.write(batch);
    },
    () => Math.max(0, ...[...calls].map((c) => c.writableLength)),
    async () => {},
  );
  server.forceShutdown();
  return r;
}

function row(name, r, base) {
  const k = (x) => `${(x / 1e3).toFixed(0)} k`;
  return `| ${name} | ${k(r.minRate)} | ${k(r.medianRate)} | ${(r.serverCpuNsPerEvent / 1e3).toFixed(2)} µs | ${(r.clientCpuNsPerEvent / 1e3).toFixed(2)} µs | ${base ? `${(r.minRate / base.minRate).toFixed(1)}x` : '1.0x'} | ${r.complete ? 'yes' : `NO: ${r.gaps} gaps, ${r.short} short ${r.statuses.join('; ')}`} |`;
}

const w = workload(EVENTS);
console.log(
  `${EVENTS} events in ${Math.ceil(EVENTS / BATCH)} batches, ${SUBSCRIBERS} subscribers, ${new Date().toISOString()}`,
);
const base = process.env.BENCH_ONLY === 'kvplane' ? null : await runBaseline(w);
const kv = await runKvplane(w);
console.log(
  '| server | events/s per subscriber, slowest | median | server CPU per event | subscriber CPU per event per stream | slowest vs baseline | every subscriber got every seq |',
);
console.log('|---|---|---|---|---|---|---|');
if (base) console.log(row('protobufjs encode per subscriber (grpc-js)', base));
console.log(row('kvplane KvGrpcServer (encode once in Rust)', kv, base));
if (kv.cutOff || kv.drops) console.log(`kvplane cut off ${kv.cutOff} subscriber(s), dropped ${kv.drops} events`);
process.exit(0);
