// Reliability under slow and hostile consumers: `kvplane serve` with the simulated engine at its
// top rate and the default config (gRPC on), while these run against it for the whole window:
//   - 8 replay peers that ask for the whole log and never read (they ask again when abandoned);
//   - 1 live SUB that never reads;
//   - 4 clients walking the whole log through /kv_recover, again and again;
//   - 32 gRPC SubscribeKvEvents streams that never read;
//   - 1 healthy live SUB, in its own process: its largest gap between batches and any lost seq.
// The serving process's RSS is sampled every second; its growth is reported net of the replay
// log's own growth (read from /metrics).
//
//   npm run build && node bench/hostile.mjs             # 60 s
//   node bench/hostile.mjs --seconds 20                 # shorter
//   node bench/hostile.mjs --soak                       # 30 min: RSS after minute 5 vs the end
//   node bench/hostile.mjs --only grpc,recover          # some attackers: replay, sub, recover, grpc
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { credentials, makeGenericClientConstructor } from '@grpc/grpc-js';
import { Dealer, Subscriber } from 'zeromq';
import { encodeSubscribeRequest, subscribeDefinition } from '../dist/index.mjs';

const args = process.argv.slice(2);
const soak = args.includes('--soak');
const secondsAt = args.indexOf('--seconds');
const seconds = secondsAt >= 0 ? Number(args[secondsAt + 1]) : soak ? 1800 : 60;
const onlyAt = args.indexOf('--only');
const attackers = new Set(onlyAt >= 0 ? args[onlyAt + 1].split(',') : ['replay', 'sub', 'recover', 'grpc']);
const CLI = fileURLToPath(new URL('../dist/cli.js', import.meta.url));
const MiB = 1024 * 1024;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function rss(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]) * 1024;
}

// The node under attack.
const node = spawn(process.execPath, [
  CLI,
  'serve',
  '--endpoint',
  'tcp://127.0.0.1:*',
  '--replay-endpoint',
  'tcp://127.0.0.1:*',
  '--http-port',
  '0',
  '--grpc-port',
  '0',
  '--grpc-host',
  '127.0.0.1',
  '--sim-rate',
  '2000',
  '--sim-blocks',
  '65536',
  '--status-interval',
  '1',
]);
const lines = [];
createInterface({ input: node.stdout }).on('line', (l) => lines.push(JSON.parse(l)));
node.stderr.pipe(process.stderr);
while (!lines.some((l) => l.msg === 'serving')) await sleep(50);
const serving = lines.find((l) => l.msg === 'serving');
const http = serving.http;
const status = () => lines.findLast((l) => l.msg === 'status') ?? {};
const metric = async (name) => {
  const text = await (await fetch(`${http}/metrics`)).text();
  return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? 0);
};

// Warm up: the engine's pool fills and the stream reaches its rate.
await sleep(5000);

// The healthy subscriber, in its own process.
const WATCHER = `
import { Subscriber } from 'zeromq';
const sub = new Subscriber({ linger: 0 });
sub.connect(process.argv[1]);
sub.subscribe();
let last, lastSeq, gap = 0, batches = 0, lost = 0;
process.stdin.on('end', () => { console.log(JSON.stringify({ gap, batches, lost })); process.exit(0); });
process.stdin.resume();
for await (const [, seqFrame] of sub) {
  const now = performance.now();
  const seq = seqFrame.readBigUInt64BE();
  if (last !== undefined) { gap = Math.max(gap, now - last); lost += Number(seq - lastSeq - 1n); }
  last = now; lastSeq = seq; batches++;
}
`;
const watcher = spawn(process.execPath, ['--input-type=module', '-e', WATCHER, serving.endpoint]);
const watched = new Promise((resolve) =>
  createInterface({ input: watcher.stdout }).once('line', (l) => resolve(JSON.parse(l))),
);
await sleep(500);

const rss0 = rss(node.pid);
const log0 = await metric('kvplane_replay_log_bytes');
const sockets = [];
let running = true;

// 8 replay peers that never read.
const seqFrame = (n) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
};
for (let i = 0; i < (attackers.has('replay') ? 8 : 0); i++) {
  const d = new Dealer({ receiveHighWaterMark: 1, linger: 0 });
  d.connect(serving.replay_endpoint);
  sockets.push(d);
  void (async () => {
    while (running) {
      const oldest = BigInt((await (await fetch(`${http}/healthz`)).json()).oldest_seq ?? 1);
      await d.send([Buffer.alloc(0), seqFrame(oldest)]);
      await sleep(35_000); // past the replay send timeout: the node abandons it, the peer asks again
    }
  })().catch(() => {});
}

// 1 live SUB that never reads.
if (attackers.has('sub')) {
  const stalled = new Subscriber({ receiveHighWaterMark: 1, linger: 0 });
  stalled.connect(serving.endpoint);
  stalled.subscribe();
  sockets.push(stalled);
}

// 4 clients walking the whole log through /kv_recover.
const recover = { parts: 0, refused: 0, walks: 0 };
for (let i = 0; i < (attackers.has('recover') ? 4 : 0); i++) {
  void (async () => {
    while (running) {
      let start = BigInt((await (await fetch(`${http}/healthz`)).json()).oldest_seq ?? 1);
      for (;;) {
        if (!running) return;
        const r = await fetch(`${http}/kv_recover?start=${start}&format=msgpack`);
        const body = Buffer.from(await r.arrayBuffer());
        if (r.status === 429) {
          recover.refused++;
          await sleep(1000);
          continue;
        }
        recover.parts++;
        // next_start, when present, is the first key of the msgpack Events map.
        const at = body.indexOf('next_start');
        if (at < 0 || at > 32) break;
        const tag = body[at + 10];
        start =
          tag === 0xcf
            ? body.readBigUInt64BE(at + 11)
            : BigInt(tag === 0xce ? body.readUInt32BE(at + 11) : tag === 0xcd ? body.readUInt16BE(at + 11) : tag);
      }
      recover.walks++;
    }
  })().catch((err) => console.error('recover client', err));
}

// 32 gRPC streams that never read.
const Client = makeGenericClientConstructor(subscribeDefinition('vllm.grpc.engine.VllmEngine'), 'kv');
const grpcCalls = [];
for (let i = 0; i < (attackers.has('grpc') ? 32 : 0); i++) {
  const client = new Client(`127.0.0.1:${serving.grpc_port}`, credentials.createInsecure());
  const call = client.SubscribeKvEvents(encodeSubscribeRequest(0n));
  call.on('error', () => {});
  call.on('data', () => call.pause());
  grpcCalls.push({ client, call });
}

// Sample RSS.
let peak = 0;
let atMinute5 = 0;
const samples = [];
const t0 = Date.now();
while (Date.now() - t0 < seconds * 1000) {
  await sleep(1000);
  const r = rss(node.pid);
  peak = Math.max(peak, r);
  samples.push(r);
  if (soak && atMinute5 === 0 && Date.now() - t0 >= 300_000) atMinute5 = r;
}
running = false;
const log1 = await metric('kvplane_replay_log_bytes');
const abandoned = await metric('kvplane_replay_abandoned_total');
const cutOff = await metric('kvplane_grpc_cut_off_total');
watcher.stdin.end();
const healthy = await watched;
const end = status();
for (const s of sockets) s.close();
for (const { client, call } of grpcCalls) {
  call.cancel();
  client.close();
}
node.kill('SIGTERM');

const growth = peak - rss0 - Math.max(0, log1 - log0);
const result = {
  attackers: [...attackers].join(','),
  seconds,
  events_per_sec: Math.round(end.events / ((Date.now() - t0) / 1000 + 5.5)),
  rss_start_mib: +(rss0 / MiB).toFixed(1),
  rss_peak_mib: +(peak / MiB).toFixed(1),
  log_growth_mib: +((log1 - log0) / MiB).toFixed(1),
  rss_growth_net_mib: +(growth / MiB).toFixed(1),
  healthy_largest_gap_ms: +healthy.gap.toFixed(1),
  healthy_batches: healthy.batches,
  healthy_lost_seqs: healthy.lost,
  replay_abandoned: abandoned,
  grpc_cut_off: cutOff,
  recover_parts: recover.parts,
  recover_walks: recover.walks,
  recover_refused: recover.refused,
  drops: end.drops,
};
if (soak) {
  result.rss_minute5_mib = +(atMinute5 / MiB).toFixed(1);
  result.rss_end_mib = +(samples.at(-1) / MiB).toFixed(1);
  result.soak_growth_after_minute5 = +((samples.at(-1) - atMinute5) / atMinute5).toFixed(3);
}
console.log(JSON.stringify(result, null, 1));
const ok = growth <= 256 * MiB && healthy.gap <= 100 && healthy.lost === 0;
console.log(
  `targets: RSS growth net of the log ${result.rss_growth_net_mib} MiB (<= 256) ${growth <= 256 * MiB ? 'ok' : 'MISSED'}; ` +
    `healthy subscriber's largest gap ${result.healthy_largest_gap_ms} ms (<= 100) ${healthy.gap <= 100 ? 'ok' : 'MISSED'}; ` +
    `lost seqs ${healthy.lost} (0) ${healthy.lost === 0 ? 'ok' : 'MISSED'}`,
);
process.exit(ok ? 0 : 1);
