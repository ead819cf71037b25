// The gRPC bench's subscribers: N routers (one connection each) in one process, each subscribed
// live to SubscribeKvEvents. Every batch's events are counted by walking the KvEventBatch's top
// level (field 3 entries) and its seq checked for contiguity (snapshot chunks, field 7, are
// skipped); prints "ready" once all streams are
// open, then one JSON line when every subscriber has `batches` batches (or its stream ended).
//
//   node bench/grpc_sub.mjs ADDRESS SUBSCRIBERS BATCHES [events|batches] [FROM]
//   (events: BATCHES counts events; FROM: subscribe from that seq, live, instead of from 0, which
//   is a snapshot of the index first)
import { credentials, makeGenericClientConstructor } from '@grpc/grpc-js';
import { encodeSubscribeRequest, subscribeDefinition } from '../dist/index.mjs';

const [address, subscribers, batches] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
/** With `events` after BATCHES, a subscriber is done after that many events instead of batches. */
const byEvents = process.argv[5] === 'events';
const from = BigInt(process.argv[6] ?? 0);
const Client = makeGenericClientConstructor(subscribeDefinition('vllm.grpc.engine.VllmEngine'), 'kv');

function varint(buf, at) {
  let v = 0n;
  let shift = 0n;
  for (;;) {
    const b = buf[at.i++];
    v |= BigInt(b & 0x7f) << shift;
    if (b < 0x80) return v;
    shift += 7n;
  }
}

function smallVarint(buf, at) {
  let v = 0;
  let mul = 1;
  for (;;) {
    const b = buf[at.i++];
    v += (b & 0x7f) * mul;
    if (b < 0x80) return v;
    mul *= 128;
  }
}

/** `[seq, events, snapshot]` of a KvEventBatch (`snapshot`: a snapshot chunk, field 7). */
function scan(buf) {
  const at = { i: 0 };
  let seq = 0n;
  let events = 0;
  let snapshot = false;
  while (at.i < buf.length) {
    const key = smallVarint(buf, at);
    const wire = key & 7;
    if (key >>> 3 === 1) seq = varint(buf, at);
    else if (wire === 0) smallVarint(buf, at);
    else if (wire === 1) at.i += 8;
    else if (wire === 2) {
      const len = smallVarint(buf, at);
      at.i += len;
      if (key >>> 3 === 3) events++;
      else if (key >>> 3 === 7) snapshot = true;
    } else if (wire === 5) at.i += 4;
  }
  return [seq, events, snapshot];
}

const subs = [];
let open = 0;
const cpu0 = process.cpuUsage();
for (let k = 0; k < subscribers; k++) {
  const client = new Client(address, credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
    'grpc.max_receive_message_length': -1,
    // A streaming consumer's window: with HTTP/2's 64 KiB default every ~60 KB batch waits for a
    // WINDOW_UPDATE round trip.
    'grpc-node.flow_control_window': 8 << 20,
  });
  const s = {
    batches: 0,
    events: 0,
    chunks: 0,
    subscribed: performance.now(),
    first: 0,
    last: 0,
    next: 0n,
    gaps: 0,
    status: null,
  };
  subs.push(s);
  const call = client.SubscribeKvEvents(encodeSubscribeRequest(from));
  call.on('metadata', () => {
    if (++open === subscribers) process.stdout.write('ready\n');
  });
  call.on('data', (buf) => {
    const [seq, events, snapshot] = scan(buf);
    // Subscribed from 0: the state before the run comes first as snapshot chunks; not counted.
    if (snapshot) {
      s.chunks++;
      s.next = seq + 1n;
      return;
    }
    const now = performance.now();
    if (s.batches === 0) s.first = now;
    else if (seq !== s.next) s.gaps++;
    s.next = seq + 1n;
    s.batches++;
    s.events += events;
    s.last = now;
    if ((byEvents ? s.events : s.batches) === batches) {
      call.cancel();
      client.close();
      finish();
    }
  });
  call.on('error', (e) => {
    if (e.code !== 1) {
      s.status = `${e.code} ${e.details}`;
      finish();
    }
  });
}

let finished = 0;
function finish() {
  if (++finished < subscribers) return;
  const cpu = process.cpuUsage(cpu0);
  process.stdout.write(
    `${JSON.stringify({
      subscribers: subs.map((s) => ({
        batches: s.batches,
        events: s.events,
        snapshotChunks: s.chunks,
        subscribed: performance.timeOrigin + s.subscribed,
        firstLive: performance.timeOrigin + s.first,
        end: performance.timeOrigin + s.last,
        gaps: s.gaps,
        status: s.status,
      })),
      cpuSeconds: (cpu.user + cpu.system) / 1e6,
    })}\n`,
  );
  process.exit(0);
}
