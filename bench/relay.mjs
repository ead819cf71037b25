// Side by side, in one run: an engine's KV events relayed by `kvplane serve --engine vllm` (onto
// its ZMQ output, with a gRPC SubscribeKvEvents subscriber attached too) and by a Python relay
// built the way Dynamo-based tees are (scripts/python_relay.py: pyzmq SUB, msgspec decode with
// vLLM's structs, every event applied to Dynamo's RadixTree, pyzmq PUB re-publish).
//
// The engine is this process: a ZMQ PUB sending vLLM-format batches (`[topic, seq, payload]`, 32
// events each by default (--events): 16 one-block BlockStored in chains of 4, and 16 BlockRemoved
// of the blocks stored 8 batches earlier, with the `group_idx` and extra keys vLLM 0.33 sets), each stamped with its send time as the batch's `ts`. A ZMQ SUB here reads
// the relay's output, so send and receive times come from one clock.
//   1. top rate: at most 512 batches in flight (sent, not yet received downstream) for --seconds;
//   2. added latency at half that rate, open loop: each batch's receive time - its send time, p50 / p99.
//
// kvplane also reports its own time per engine batch (read off the engine's socket to handed to its
// outputs, over its last 8,192 batches: the end of the half-rate step), from its /healthz.
//
// `direct` is the engine read straight by the subscriber (no relay), at kvplane's half rate: the
// latency floor of this setup, subtracted to give kvplane's added latency. `forward` (a bare
// zeromq.js SUB->PUB, bench/zmq_forward.mjs) and `proxy` (libzmq's own zmq_proxy in C++ via pyzmq,
// bench/zmq_proxy.py) are relays that do nothing: the floors of a Node relay and of any relay. `--half-rate N`
// (events/s) sets the latency step's rate for all three instead.
//
// `kvplane_js` is kvplane with `--native-zmq false`: the engine read by zeromq.js and every batch
// relayed and sent from the JS thread, as before the native path; measured at its own half rate.
//
// `--paired`: during the latency step a second subscriber here also reads the engine's own socket,
// so each relayed batch's added latency is measured on the batch itself (its receive through the
// relay minus its receive straight from the engine, in the same moment), not as the difference of
// two p99s taken in different steps (`paired_added_ms_*`).
//
// `--rounds K` (K > 1): every relay is opened at once (idle while another is measured), the top
// rates are measured one after the other, and then the latency steps in turns, K rounds of
// --seconds / K each, so that a slow window of the machine falls on every kind alike; each kind's
// p99 is over all its rounds, and the added p99 is also given as the median, over the rounds, of
// kvplane's p99 minus direct's in the same round.
//
// `--pin`: the relay under test (kvplane with its gRPC subscriber, the Python relay, the forwarder,
// the proxy) runs on CPU 1, and this process (the engine and the measuring subscriber) on CPU 0:
// the relay gets a core the engine does not use, as on a GPU node with cores to spare, and the
// measuring clock is not slowed by what only one kind runs. Needs two CPUs and `taskset`.
//
// `--gap S` (with --rounds): every kind waits S seconds before each of its latency steps, so each
// relay starts each round from idle (more than 5 s idle: kvplane's link thread has handed its free
// memory back). `head_ms_p99` is the p99 over the first HEAD_BATCHES engine batches of each step.
//
//   node bench/relay.mjs [--seconds 10] [--events 32] [--only KIND,KIND...: direct kvplane kvplane_js python forward proxy] [--half-rate N]
//                        [--coalesce-bytes N] [--no-grpc] [--spin] [--paired] [--rounds K] [--pin] [--gap S]
import { execFileSync, spawn as spawnAnywhere } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { Publisher, Subscriber } from 'zeromq';
import { encodeBatch } from '../dist/index.mjs';

const args = process.argv.slice(2);
const flag = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
const seconds = Number(flag('--seconds', '10'));
const only = flag('--only', null)?.split(',') ?? null;
const halfRateFlag = flag('--half-rate', null);
const halfRate = halfRateFlag === null ? null : Number(halfRateFlag);
/** The closed loop waits for the relay by spinning on setImmediate (see the wait below). */
const spin = args.includes('--spin');
const paired = args.includes('--paired');
/** Latency steps in turns across the kinds (see the end of this file); 1: each kind alone. */
const rounds = Number(flag('--rounds', '1'));
/** Seconds each kind idles before each of its latency steps (--rounds). */
const gap = Number(flag('--gap', '0'));
/** The batches at the start of a step that `head_ms_p99` is taken over. */
const HEAD_BATCHES = 200;
/** kvplane's --engine-coalesce-bytes (default: the relay's own). */
const coalesce = flag('--coalesce-bytes', null);
/** Events per engine batch: half single-block stores (chains of 4), half removals. */
const EVENTS = Number(flag('--events', '32'));
const STORES = EVENTS / 2;
const WINDOW = 512;
const CYCLE = 1024;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** --pin: the CPU of the relays under test, and the CPU of everything else. */
const pin = args.includes('--pin') ? { relay: '1', rest: '0' } : null;
// Every thread of this process (V8's, libuv's) onto the rest's CPU, before any ZMQ socket starts its own.
if (pin) execFileSync('taskset', ['-a', '-p', '-c', pin.rest, String(process.pid)], { stdio: 'ignore' });
/** Spawns a process on `role`'s CPU under --pin (`relay` or `rest`), anywhere otherwise. */
const spawn = (role, command, argv) =>
  pin ? spawnAnywhere('taskset', ['-c', pin[role], command, ...argv]) : spawnAnywhere(command, argv);
const now = () => (performance.timeOrigin + performance.now()) / 1000;

/** The workload: CYCLE batches, replayed cyclically (blocks of the last 8 batches stay live). */
function workload() {
  const hash = (batch, i) => BigInt(batch * STORES + i + 1);
  const out = [];
  for (let b = 0; b < CYCLE; b++) {
    const events = [];
    for (let i = 0; i < STORES; i++) {
      events.push({
        type: 'stored',
        blockHashes: [hash(b, i)],
        parentBlockHash: i % 4 === 0 ? null : hash(b, i - 1),
        tokenIds: Uint32Array.from({ length: 16 }, (_, t) => (b * STORES + i) * 16 + t),
        blockSize: 16,
        medium: 'GPU',
        // What vLLM 0.33's block pool sets on every stored event.
        groupIdx: 0,
        extraKeys: [null],
      });
    }
    const old = (b - 8 + CYCLE) % CYCLE;
    for (let i = STORES - 1; i >= 0; i--)
      events.push({ type: 'removed', blockHashes: [hash(old, i)], medium: 'GPU', groupIdx: 0 });
    const payload = encodeBatch({ seq: 0n, ts: 1.5, dpRank: null, events }, 'vllm');
    if (payload[0] !== 0x93 || payload[1] !== 0xcb)
      throw new Error('unexpected batch layout: ts is not at bytes 2..10');
    out.push(payload);
  }
  return out;
}

async function freePort() {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

function lines(proc) {
  const got = [];
  const waiters = [];
  createInterface({ input: proc.stdout }).on('line', (l) => {
    got.push(l);
    for (const w of waiters.splice(0)) w();
  });
  return {
    got,
    async until(pred, what, ms = 20_000) {
      const end = Date.now() + ms;
      while (!got.some(pred)) {
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 100);
        });
      }
      return got.find(pred);
    },
  };
}

/**
 * Stops a relay process: SIGTERM, then SIGKILL if it has not exited 3 s later. One that has
 * exited already resolves at once (its 'exit' event is gone: waiting for it hung a run).
 */
async function stopProcess(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
}

/** Starts a relay; returns its output endpoint, extra processes and a stop function. */
async function startRelay(kind, engineEndpoint) {
  if (kind === 'direct') return { endpoint: engineEndpoint, async stop() {} };
  if (kind === 'forward' || kind === 'proxy') {
    const proc =
      kind === 'forward'
        ? spawn('relay', process.execPath, ['bench/zmq_forward.mjs', engineEndpoint])
        : spawn('relay', 'python3', ['bench/zmq_proxy.py', engineEndpoint]);
    proc.stderr.pipe(process.stderr);
    const { endpoint } = JSON.parse(await lines(proc).until((l) => l.includes('endpoint'), 'the forwarder'));
    return {
      endpoint,
      async stop() {
        await stopProcess(proc);
      },
    };
  }
  if (kind === 'kvplane' || kind === 'kvplane_js') {
    const grpcPort = await freePort();
    const httpPort = await freePort();
    const proc = spawn('relay', process.execPath, [
      // e.g. KVPLANE_BENCH_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof' to profile the relay
      ...(process.env.KVPLANE_BENCH_NODE_ARGS?.split(' ').filter(Boolean) ?? []),
      'dist/cli.js',
      'serve',
      '--engine',
      'vllm',
      '--engine-endpoint',
      engineEndpoint,
      '--endpoint',
      'tcp://127.0.0.1:*',
      '--replay-endpoint',
      'none',
      '--http-port',
      String(httpPort),
      '--grpc-host',
      '127.0.0.1',
      '--grpc-port',
      String(grpcPort),
      '--grpc-max-lag',
      '100000',
      '--status-interval',
      '60',
      ...(coalesce === null ? [] : ['--engine-coalesce-bytes', coalesce]),
      // kvplane_js: the relay as it was before its native path, every batch through the JS thread.
      ...(kind === 'kvplane_js' ? ['--native-zmq', 'false'] : []),
    ]);
    proc.stderr.pipe(process.stderr);
    // e.g. KVPLANE_BENCH_RELAY_LOG=/tmp/relay.log with --trace-gc: the relay's stdout, kept
    if (process.env.KVPLANE_BENCH_RELAY_LOG) proc.stdout.pipe(createWriteStream(process.env.KVPLANE_BENCH_RELAY_LOG));
    const out = lines(proc);
    const serving = JSON.parse(await out.until((l) => l.includes('"serving"'), 'kvplane serve'));
    // One gRPC subscriber, live, in its own process: it reads every batch the relay publishes
    // (--no-grpc leaves it out, to see what it costs on this machine).
    let grpc = null;
    if (!args.includes('--no-grpc')) {
      grpc = spawn('relay', process.execPath, ['bench/grpc_sub.mjs', `127.0.0.1:${grpcPort}`, '1', '1000000000']);
      grpc.stderr.pipe(process.stderr);
      await lines(grpc).until((l) => l === 'ready', 'the gRPC subscriber');
    }
    return {
      endpoint: serving.endpoint,
      /** The relay's own time per engine batch over its last 8,192 (read off the socket to handed to its outputs). */
      async internal() {
        const health = await (await fetch(`http://127.0.0.1:${httpPort}/healthz`)).json();
        return { ...health.sources[0].stats.relayLatencyMs, feed: health.sources[0].stats.ranks[0].feed };
      },
      async stop() {
        grpc?.kill();
        await stopProcess(proc);
      },
    };
  }
  const port = await freePort();
  const proc = spawn('relay', 'python3', [
    'scripts/python_relay.py',
    '--sub',
    engineEndpoint,
    '--pub',
    `tcp://127.0.0.1:${port}`,
  ]);
  proc.stderr.pipe(process.stderr);
  await lines(proc).until((l) => l === 'ready', 'the Python relay');
  return {
    endpoint: `tcp://127.0.0.1:${port}`,
    async stop() {
      await stopProcess(proc);
    },
  };
}

/** Events in a vLLM-format batch `[ts, events, ...]`: the array header after the 8-byte ts. */
function eventsIn(payload) {
  const h = payload[10];
  if ((h & 0xf0) === 0x90) return h & 0x0f;
  if (h === 0xdc) return payload.readUInt16BE(11);
  if (h === 0xdd) return payload.readUInt32BE(11);
  throw new Error(`unexpected events header 0x${h.toString(16)}`);
}

/** Percentile of sorted numbers. */
const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];

/**
 * Opens a relay of `kind` on a fresh engine socket, with this process's subscriber on its output:
 * `top()` runs the top-rate step, `latency(rate, secs)` a latency step (as often as asked, each
 * on batches of its own), `close()` stops it all.
 */
async function open(kind, batches) {
  const pub = new Publisher({ sendHighWaterMark: 0, linger: 0 });
  await pub.bind('tcp://127.0.0.1:*');
  const relay = await startRelay(kind, pub.lastEndpoint);
  const sub = new Subscriber({ receiveHighWaterMark: 0, linger: 0 });
  sub.connect(relay.endpoint);
  sub.subscribe();
  await sleep(1000);

  // Counted in engine batches' worth of events: kvplane relays engine batches that were waiting
  // together as one (--engine-coalesce-bytes), under the oldest one's ts. Every relay here keeps
  // the engine's order, so a message whose ts is that of the k-th batch sent carries batches k to
  // k+n-1, and each is counted with its own latency (receive time - its own send time).
  let received = 0;
  let latencies = null;
  /** Send times (the `ts` each batch carries) of the latency step's batches, in order. */
  let sentAt = [];
  /** --paired: when each of those batches was read straight off the engine's socket, and each relayed batch's time after that. */
  let directAt = [];
  let pairedAdded = [];
  let cursor = 0;
  const record = (ts, n) => {
    const t = now();
    while (cursor < sentAt.length && sentAt[cursor] < ts) cursor++;
    if (sentAt[cursor] !== ts || cursor + n > sentAt.length) {
      // Not a batch of the latency step (one of the top rate's, late): its oldest ts for all.
      for (let i = 0; i < n; i++) latencies.push((t - ts) * 1000);
      return;
    }
    for (let i = 0; i < n; i++) {
      latencies.push((t - sentAt[cursor + i]) * 1000);
      if (directAt[cursor + i] !== undefined) pairedAdded.push((t - directAt[cursor + i]) * 1000);
    }
    cursor += n;
  };
  /** Wakes the sender when batches arrive (it waits there while its window is full). */
  let progress = () => {};
  const reading = (async () => {
    for await (const [, , payload] of sub) {
      if (payload.length < 12 || payload[1] !== 0xcb) continue;
      const ts = payload.readDoubleBE(2);
      if (ts < 1e9) continue; // not a batch of this run (the relay's opening clears)
      const n = eventsIn(payload) / EVENTS;
      received += n;
      progress();
      if (latencies) record(ts, n);
    }
  })().catch(() => {});

  const topic = Buffer.alloc(0);
  let seq = 0n;
  const send = async () => {
    const payload = Buffer.from(batches[Number(seq % BigInt(CYCLE))]);
    const ts = now();
    payload.writeDoubleBE(ts, 2);
    if (latencies) sentAt.push(ts);
    const s = Buffer.alloc(8);
    s.writeBigUInt64BE(seq++);
    await pub.send([topic, s, payload]);
  };

  /** 1. Top rate, closed loop: events/s. */
  async function top() {
    const base = received;
    let sent = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      if (sent - (received - base) >= WINDOW) {
        // Wait for the relay without spinning (this process shares the machine with it), unless
        // --spin: then the idle loop keeps a core busy, as this bench did before 2026-11-25.
        await new Promise((r) => {
          if (spin) return setImmediate(r);
          progress = r;
          setTimeout(r, 50);
        });
        continue;
      }
      await send();
      sent++;
    }
    const elapsed = (performance.now() - t0) / 1000;
    const topRate = ((received - base) * EVENTS) / elapsed;
    for (let i = 0; i < 100 && received - base < sent; i++) await sleep(20);
    return topRate;
  }

  // --paired: the engine's socket read here too (one engine batch a message), from the first
  // latency step on (joined after the top rate, which it would otherwise slow down).
  let directSub = null;
  let directReading = null;
  /** Latency steps begun (a new one starts its own `sentAt`). */
  let steps = 0;
  async function pairUp() {
    directSub = new Subscriber({ receiveHighWaterMark: 0, linger: 0 });
    directSub.connect(pub.lastEndpoint);
    directSub.subscribe();
    await sleep(500);
    let at = 0;
    let atStep = steps;
    directReading = (async () => {
      for await (const [, , payload] of directSub) {
        if (!latencies || payload.length < 12) continue;
        const ts = payload.readDoubleBE(2);
        if (atStep !== steps) [at, atStep] = [0, steps]; // a new step
        while (at < sentAt.length && sentAt[at] < ts) at++;
        if (sentAt[at] === ts) directAt[at++] = now();
      }
    })().catch(() => {});
  }

  /** 2. Latency at `rate` events/s for `secs`, open loop: batches sent on a 1 ms tick. */
  async function latency(rate, secs) {
    if (paired && kind !== 'direct' && !directSub) await pairUp();
    steps++;
    const perMs = rate / EVENTS / 1000;
    sentAt = [];
    directAt = [];
    pairedAdded = [];
    cursor = 0;
    latencies = [];
    const before = received;
    let owed = 0;
    let sentHalf = 0;
    const t1 = performance.now();
    let tick = t1;
    while (performance.now() - t1 < secs * 1000) {
      const t = performance.now();
      owed += (t - tick) * perMs;
      tick = t;
      while (owed >= 1) {
        await send();
        sentHalf++;
        owed--;
      }
      await sleep(1);
    }
    for (let i = 0; i < 100 && received - before < sentHalf; i++) await sleep(20);
    const step = {
      latencies: Float64Array.from(latencies),
      paired: Float64Array.from(pairedAdded),
      sent: sentHalf,
      lost: sentHalf - (received - before),
    };
    latencies = null;
    return step;
  }

  async function close() {
    sub.close();
    await reading;
    directSub?.close();
    await directReading;
    await relay.stop();
    pub.close();
  }
  return { top, latency, internal: () => relay.internal?.(), close };
}

const batches = workload();
const kinds = ['python', 'kvplane', 'direct', 'forward', 'proxy', 'kvplane_js'].filter(
  (k) => !only || only.includes(k),
);
/** The latency step's rate for a kind: its own half top rate, or kvplane's for the floors. */
const rateOf = (kind, top) =>
  halfRate ?? (['direct', 'forward', 'proxy'].includes(kind) && tops.kvplane ? tops.kvplane / 2 : top / 2);
const tops = {};
const steps = {};
const results = {};
if (rounds === 1) {
  // Each kind alone, one after the other: its relay opened, both steps, closed.
  for (const kind of kinds) {
    const session = await open(kind, batches);
    tops[kind] = await session.top();
    steps[kind] = [await session.latency(rateOf(kind, tops[kind]), seconds)];
    results[kind] = summarize(kind, steps[kind], await session.internal());
    await session.close();
    console.log(JSON.stringify(results[kind]));
  }
} else {
  // Every relay open at once (the others idle while one is measured): the top rates one after
  // the other, then the latency steps in turns, `rounds` of seconds / rounds each, so that a
  // slow window of the machine falls on every kind alike.
  const sessions = {};
  for (const kind of kinds) {
    sessions[kind] = await open(kind, batches);
    tops[kind] = await sessions[kind].top();
    steps[kind] = [];
  }
  // What the top rates left queued (a gRPC subscriber behind by up to --grpc-max-lag events, the
  // Python relay's backlog) drains first, or the first round pays for it.
  await sleep(5000);
  for (let r = 0; r < rounds; r++)
    for (const kind of kinds) {
      if (gap > 0) await sleep(gap * 1000);
      steps[kind].push(await sessions[kind].latency(rateOf(kind, tops[kind]), seconds / rounds));
    }
  for (const kind of kinds) {
    results[kind] = summarize(kind, steps[kind], await sessions[kind].internal());
    await sessions[kind].close();
    console.log(JSON.stringify(results[kind]));
  }
}

/** A kind's figures over its latency steps (all of them pooled; `round_p99s`: each step's own). */
function summarize(kind, kindSteps, internal) {
  const sorted = kindSteps.flatMap((s) => Array.from(s.latencies)).sort((a, b) => a - b);
  const pairs = kindSteps.flatMap((s) => Array.from(s.paired)).sort((a, b) => a - b);
  const sent = kindSteps.reduce((n, s) => n + s.sent, 0);
  const heads = kindSteps.flatMap((s) => Array.from(s.latencies.subarray(0, HEAD_BATCHES))).sort((a, b) => a - b);
  return {
    relay: kind,
    top_events_per_sec: Math.round(tops[kind]),
    half_rate_events_per_sec: Math.round((sent * EVENTS) / seconds),
    latency_ms_p50: +pct(sorted, 50).toFixed(3),
    latency_ms_p99: +pct(sorted, 99).toFixed(3),
    lost_at_half_rate: kindSteps.reduce((n, s) => n + s.lost, 0),
    head_ms_p99: +pct(heads, 99).toFixed(3),
    head_ms_max: +heads[heads.length - 1].toFixed(3),
    ...(kindSteps.length > 1 && { round_p99s: kindSteps.map((s) => p99of(s.latencies)) }),
    ...(pairs.length > 0 && {
      paired_added_ms_p50: +pct(pairs, 50).toFixed(3),
      paired_added_ms_p99: +pct(pairs, 99).toFixed(3),
      paired_batches: pairs.length,
    }),
    ...(internal && {
      relay_own_ms_p50: internal.p50,
      relay_own_ms_p99: internal.p99,
      relay_own_ms_max: internal.max,
      feed: internal.feed,
    }),
  };
}

function p99of(latencies) {
  return +pct(
    [...latencies].sort((a, b) => a - b),
    99,
  ).toFixed(3);
}

/** The median of a kind's p99 minus direct's, round by round (each pair measured minutes apart at most). */
function medianAdded(kind) {
  const d = results[kind].round_p99s.map((p, i) => p - results.direct.round_p99s[i]).sort((a, b) => a - b);
  return +d[Math.floor(d.length / 2)].toFixed(3);
}

const { direct, python: py, kvplane: kv } = results;
if (py && kv) {
  const ratio = kv.top_events_per_sec / py.top_events_per_sec;
  console.log(`kvplane / python events/s: ${ratio.toFixed(1)}x (target >= 10x) ${ratio >= 10 ? 'ok' : 'MISSED'}`);
}
if (direct && kv) {
  // Added latency: through the relay minus engine straight to the subscriber, at the same rate.
  const added = +(kv.latency_ms_p99 - direct.latency_ms_p99).toFixed(3);
  console.log(`kvplane added p99: ${added} ms (target <= 1) ${added <= 1 ? 'ok' : 'MISSED'}`);
  if (rounds > 1) console.log(`kvplane added p99, median of ${rounds} rounds: ${medianAdded('kvplane')} ms`);
}
if (py && results.kvplane_js) {
  const js = results.kvplane_js;
  console.log(
    `kvplane_js (--native-zmq false) / python events/s: ${(js.top_events_per_sec / py.top_events_per_sec).toFixed(1)}x; ` +
      `its p99 at its own half rate (${js.half_rate_events_per_sec} events/s): ${js.latency_ms_p99} ms`,
  );
}
for (const floor of ['forward', 'proxy']) {
  if (direct && results[floor])
    console.log(
      `${floor} (a relay doing nothing) added p99: ${(results[floor].latency_ms_p99 - direct.latency_ms_p99).toFixed(3)} ms` +
        (rounds > 1 ? `; median of ${rounds} rounds: ${medianAdded(floor)} ms` : ''),
    );
}
