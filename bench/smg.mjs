// SMG drop-in figures, in one run:
//   1. snapshot: an index of 1M resident blocks (16-token blocks, chains of 64); 16 live gRPC
//      subscribers (bench/grpc_sub.mjs, another process) read a steady stream; a new subscriber
//      from 0 (a third process) gets the snapshot, then live. Measured: the new subscriber's time
//      from subscribing to its first live batch (target <= 1 s), and whether the 16 keep their rate:
//      every batch received, the server's largest per-subscriber queue before and during the
//      snapshot, their events/s against the producer's.
//   2. proxy: vLLM `Generate` (one request, one response of the same bytes) from an engine
//      process (bench/grpc_echo.mjs), called 5,000 times in a row, direct and through kvplane's
//      --grpc-upstream proxy (in a process of its own): p50 / p99 of each and the added p99
//      (target <= 100 us).
//
//   npm run build && node bench/smg.mjs [--blocks 1000000] [--chunk-blocks 4096] [--only snapshot]
//                                       [--snapshot-client node|python]
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { credentials, makeGenericClientConstructor } from '@grpc/grpc-js';
import { KvEventPublisher, KvGrpcServer, rawMethod } from '../dist/index.mjs';

const args = process.argv.slice(2);
const flag = (name, dflt) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : dflt);
const BLOCKS = flag('--blocks', 1_000_000);
const CHUNK_BLOCKS = flag('--chunk-blocks', 4096);
const CHAIN = 64;
const BLOCK = 16;
const SUBSCRIBERS = 16;
/** The steady stream: one batch of 32 single-block stores every 2 ms (16 k events/s), 4 s. */
const LIVE_BATCHES = 2000;
const LIVE_EVENTS = 32;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The new subscriber's client: grpc-js (`node`, default) or grpcio (`python`, gRPC's C core). */
const SNAPSHOT_CLIENT = args.includes('--snapshot-client') ? args[args.indexOf('--snapshot-client') + 1] : 'node';

function child(script, argv) {
  const path = new URL(script, import.meta.url).pathname;
  const proc = script.endsWith('.py') ? spawn('python3', [path, ...argv]) : spawn(process.execPath, [path, ...argv]);
  proc.stderr.pipe(process.stderr);
  const lines = createInterface({ input: proc.stdout });
  const queue = [];
  const waiters = [];
  lines.on('line', (l) => (waiters.length ? waiters.shift()(l) : queue.push(l)));
  return {
    proc,
    line: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiters.push(r))),
  };
}

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];

async function snapshotFigures() {
  const pub = await KvEventPublisher.create({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: null,
    dataParallelRank: 0,
    bufferSteps: 100_000,
  });
  const grpc = await KvGrpcServer.create({
    stream: pub.stream,
    host: '127.0.0.1',
    maxLagBatches: 100_000,
    snapshotChunkBlocks: CHUNK_BLOCKS,
  });
  const address = `127.0.0.1:${grpc.port}`;
  // The resident state: chains of 64 blocks, 16 chains per batch.
  const t0 = performance.now();
  let hash = 1n;
  for (let made = 0; made < BLOCKS; ) {
    const events = [];
    for (let e = 0; e < 16 && made < BLOCKS; e++, made += CHAIN) {
      const blockHashes = Array.from({ length: CHAIN }, () => hash++);
      // Tokens unique across the index (it keys blocks by their content).
      const tokenIds = new Uint32Array(CHAIN * BLOCK);
      for (let i = 0; i < tokenIds.length; i++) tokenIds[i] = made * BLOCK + i;
      events.push({ type: 'stored', blockHashes, parentBlockHash: null, tokenIds, blockSize: BLOCK });
    }
    pub.publish(events);
    if (made % (CHAIN * 16 * 64) === 0) await pub.flush();
  }
  await pub.flush();
  const resident = pub.indexer.stats().blocks;
  console.error(`resident blocks: ${resident} (built in ${((performance.now() - t0) / 1000).toFixed(1)} s)`);

  // Publishes coalesce into batches, so the subscribers wait for the events rather than a batch
  // count. They subscribe live, from the next seq (from 0, each would get a snapshot first, which
  // folds in whatever was published before its turn came).
  const subs = child('./grpc_sub.mjs', [
    address,
    String(SUBSCRIBERS),
    String(LIVE_BATCHES * LIVE_EVENTS),
    'events',
    String(pub.indexer.lastSeq + 1n),
  ]);
  if ((await subs.line()) !== 'ready') throw new Error('subscribers not ready');
  console.error('16 subscribers ready');
  const subsDone = subs.line();
  await sleep(300);

  let maxLagBefore = 0;
  let maxLagDuring = 0;
  let snapshotting = false;
  const sampler = setInterval(() => {
    const lag = grpc.stats().maxLag;
    if (snapshotting) maxLagDuring = Math.max(maxLagDuring, lag);
    else maxLagBefore = Math.max(maxLagBefore, lag);
  }, 5);
  let sent = 0;
  let snapshotResult;
  const tLive = performance.now();
  while (sent < LIVE_BATCHES) {
    const due = Math.min(LIVE_BATCHES, Math.floor((performance.now() - tLive) / 2));
    for (; sent < due; sent++) {
      const events = [];
      for (let i = 0; i < LIVE_EVENTS; i++) {
        events.push({
          type: 'stored',
          blockHashes: [hash++],
          parentBlockHash: null,
          tokenIds: new Uint32Array(BLOCK).fill(0x4000_0000 + sent * LIVE_EVENTS + i),
          blockSize: BLOCK,
        });
      }
      pub.publish(events);
    }
    if (sent >= LIVE_BATCHES / 4 && snapshotResult === undefined) {
      // A new subscriber from 0, a quarter into the stream.
      snapshotting = true;
      const one =
        SNAPSHOT_CLIENT === 'python'
          ? child('./grpc_snap_sub.py', [address])
          : child('./grpc_sub.mjs', [address, '1', '1']);
      snapshotResult = one
        .line()
        .then(() => one.line())
        .then((l) => {
          snapshotting = false;
          return JSON.parse(l);
        });
    }
    await sleep(1);
  }
  await pub.flush();
  console.error(`live stream sent (${sent} batches)`);
  const live = JSON.parse(await subsDone);
  console.error('16 subscribers done');
  const snap = (await snapshotResult).subscribers[0];
  clearInterval(sampler);
  const seconds = (LIVE_BATCHES * 2) / 1000;
  const rates = live.subscribers.map((s) => s.events / ((s.end - (s.firstLive || s.end)) / 1000 || seconds));
  await grpc.close();
  await pub.close();
  return {
    resident_blocks: resident,
    snapshot_chunks: snap.snapshotChunks,
    first_live_batch_ms: +(snap.firstLive - snap.subscribed).toFixed(1),
    live_subscribers: SUBSCRIBERS,
    producer_events_per_sec: Math.round((LIVE_BATCHES * LIVE_EVENTS) / seconds),
    live_min_events_per_sec: Math.round(Math.min(...rates)),
    live_all_events: live.subscribers.every(
      (s) => s.events === LIVE_BATCHES * LIVE_EVENTS && s.gaps === 0 && s.status === null,
    ),
    max_queue_before: maxLagBefore,
    max_queue_during_snapshot: maxLagDuring,
  };
}

async function timeCalls(address, n) {
  const Client = makeGenericClientConstructor(
    { Generate: rawMethod('/vllm.grpc.engine.VllmEngine/Generate', false, true) },
    'VllmEngine',
  );
  const c = new Client(address, credentials.createInsecure());
  const req = Buffer.alloc(256, 7);
  const call = () =>
    new Promise((resolve, reject) => {
      const s = c.Generate(req);
      s.on('data', () => {});
      s.on('end', resolve);
      s.on('error', reject);
    });
  for (let i = 0; i < 500; i++) await call();
  const t = [];
  for (let i = 0; i < n; i++) {
    const a = process.hrtime.bigint();
    await call();
    t.push(Number(process.hrtime.bigint() - a) / 1000);
  }
  c.close();
  t.sort((a, b) => a - b);
  return { p50_us: +pct(t, 50).toFixed(1), p99_us: +pct(t, 99).toFixed(1) };
}

async function proxyFigures() {
  const engine = child('./grpc_echo.mjs', []);
  const enginePort = Number(await engine.line());
  const proxy = child('./grpc_proxy.mjs', [`127.0.0.1:${enginePort}`]);
  const proxyPort = Number(await proxy.line());
  // The floor of any Node proxy here: HTTP/2 streams passed through with Node's http2, no gRPC library.
  const forward = child('./http2_forward.mjs', [`127.0.0.1:${enginePort}`]);
  const forwardPort = Number(await forward.line());
  const direct = await timeCalls(`127.0.0.1:${enginePort}`, 5000);
  const proxied = await timeCalls(`127.0.0.1:${proxyPort}`, 5000);
  const forwarded = await timeCalls(`127.0.0.1:${forwardPort}`, 5000);
  const direct2 = await timeCalls(`127.0.0.1:${enginePort}`, 5000);
  engine.proc.kill();
  proxy.proc.kill();
  forward.proc.kill();
  const directP99 = Math.min(direct.p99_us, direct2.p99_us);
  return {
    direct,
    direct_again: direct2,
    proxied,
    http2_forward: forwarded,
    forward_added_p50_us: +(forwarded.p50_us - Math.min(direct.p50_us, direct2.p50_us)).toFixed(1),
    forward_added_p99_us: +(forwarded.p99_us - directP99).toFixed(1),
    added_p50_us: +(proxied.p50_us - Math.min(direct.p50_us, direct2.p50_us)).toFixed(1),
    added_p99_us: +(proxied.p99_us - directP99).toFixed(1),
  };
}

const snapshot = await snapshotFigures();
console.log(JSON.stringify({ snapshot }));
const proxy = args.includes('--only') ? { added_p99_us: NaN } : await proxyFigures();
console.log(JSON.stringify({ proxy }));
console.log(
  `snapshot of ${snapshot.resident_blocks} blocks: first live batch after ${snapshot.first_live_batch_ms} ms (target <= 1000) ${snapshot.first_live_batch_ms <= 1000 ? 'ok' : 'MISSED'}; ` +
    `live subscribers got every event: ${snapshot.live_all_events}; proxied Generate added p99 ${proxy.added_p99_us} us (target <= 100) ${proxy.added_p99_us <= 100 ? 'ok' : 'MISSED'}`,
);
process.exit(0);
