// The live ZMQ socket kvplane binds itself (crates/kvplane-zmq publisher.rs), against real peers:
// pyzmq (libzmq) and zeromq.js subscribers, and zeromq.js's own PUB as the reference.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { Publisher, Subscriber } from 'zeromq';
import { decodeBatch, type KvEvent, KvEventPublisher, type KvEventPublisherOptions } from '../src/index.js';
import { FROM_SEQ_1, repoPath, sleep, until } from './fixtures.js';

const cleanup: Array<() => unknown> = [];

afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function publisher(opts: KvEventPublisherOptions = {}): Promise<KvEventPublisher> {
  const p = await KvEventPublisher.create({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: null,
    ...FROM_SEQ_1,
    ...opts,
  });
  cleanup.push(() => p.close());
  return p;
}

function subscriber(endpoint: string, prefix = '', receiveHighWaterMark = 0): Subscriber {
  const s = new Subscriber({ receiveHighWaterMark });
  s.connect(endpoint);
  s.subscribe(prefix);
  cleanup.push(() => s.close());
  return s;
}

const stored = (n: number): KvEvent => ({
  type: 'stored',
  blockHashes: [BigInt(n)],
  parentBlockHash: n === 1 ? null : BigInt(n - 1),
  tokenIds: Uint32Array.from({ length: 16 }, (_, i) => n * 16 + i),
  blockSize: 16,
});

/** A pyzmq SUB (scripts/zmq_peer.py) reading `batches` batches subscribed to `prefix`. */
function pySub(endpoint: string, batches: number, prefix: string) {
  const proc = spawn('python3', [repoPath('scripts/zmq_peer.py'), 'sub', endpoint, String(batches), prefix]);
  cleanup.push(() => proc.kill());
  const lines: Array<{ seq: string; topic: string; batch: { events: unknown[] } } | string> = [];
  createInterface({ input: proc.stdout }).on('line', (l) => lines.push(JSON.parse(l)));
  return lines;
}

describe('the native live ZMQ socket', () => {
  it('serves pyzmq and zeromq.js subscribers by topic prefix, the same frames as zeromq.js’s PUB', async () => {
    const native = await publisher({ topic: 'kv@r0' });
    const js = await publisher({ topic: 'kv@r0', nativeZmq: false });
    // The native socket reports itself: its subscribers come from its own handshakes.
    const py = pySub(native.endpoint, 20, 'kv');
    const none = subscriber(native.endpoint, 'other');
    const fromNative = subscriber(native.endpoint, 'kv@');
    const fromJs = subscriber(js.endpoint, 'kv@');
    await until(
      () => py[0] === 'ready' && native.stats().subscribers === 3 && js.stats().subscribers === 1,
      'subscribers',
    );
    await sleep(100);
    for (let i = 1; i <= 20; i++) {
      for (const p of [native, js]) p.publish([stored(i)]);
      await Promise.all([native.flush(), js.flush()]);
    }
    const read = async (s: Subscriber) => {
      const out: Buffer[][] = [];
      for (let i = 0; i < 20; i++) out.push((await s.receive()) as Buffer[]);
      return out;
    };
    const [a, b] = await Promise.all([read(fromNative), read(fromJs)]);
    // Topic and seq frames byte for byte; payloads equal but for the timestamp each stream took.
    expect(a.map((m) => [m.length, m[0]?.toString(), m[1]?.readBigUInt64BE()])).toEqual(
      b.map((m) => [m.length, m[0]?.toString(), m[1]?.readBigUInt64BE()]),
    );
    expect(a.map((m) => m[1]?.readBigUInt64BE())).toEqual(Array.from({ length: 20 }, (_, i) => BigInt(i + 1)));
    const events = (ms: Buffer[][]) => ms.map((m) => decodeBatch(m[2] as Buffer, 'vllm').events);
    expect(events(a)).toEqual(events(b));
    // pyzmq (libzmq 4.3, msgspec decode) read every batch in order, under the topic.
    await until(() => py.length === 21, 'pyzmq');
    const got = py.slice(1) as Array<{ seq: string; topic: string; batch: { events: unknown[] } }>;
    expect(got.map((l) => [l.seq, l.topic, l.batch.events.length])).toEqual(
      Array.from({ length: 20 }, (_, i) => [String(i + 1), 'kv@r0', 1]),
    );
    // A prefix that does not match gets nothing.
    const nothing = await Promise.race([none.receive().then(() => 'got'), sleep(200).then(() => 'nothing')]);
    expect(nothing).toBe('nothing');
  }, 30_000);

  it("keeps a libzmq SUB's repeated subscriptions as libzmq's PUB does: one cancel per SUB's last", async () => {
    /** Subscribes twice, then cancels twice: whether a batch arrived after each step. */
    async function steps(endpoint: string, send: (n: number) => Promise<void>): Promise<boolean[]> {
      const s = new Subscriber({ receiveTimeout: 400 });
      cleanup.push(() => s.close());
      s.connect(endpoint);
      s.subscribe('kv');
      s.subscribe('kv');
      const got: boolean[] = [];
      for (let n = 1; n <= 3; n++) {
        await sleep(200); // the (un)subscription reaches the publisher
        await send(n);
        got.push(
          await s.receive().then(
            () => true,
            () => false,
          ),
        );
        s.unsubscribe('kv');
      }
      return got;
    }
    const p = await publisher({ topic: 'kv' });
    const native = await steps(p.endpoint, async (n) => {
      p.publish([stored(n)]);
      await p.flush();
    });
    // The reference: libzmq's own PUB (zeromq.js), the same steps.
    const js = new Publisher();
    cleanup.push(() => js.close());
    await js.bind('tcp://127.0.0.1:*');
    const reference = await steps(js.lastEndpoint as string, (n) => js.send(['kv', Buffer.alloc(8, n), 'x']));
    expect(native).toEqual(reference);
    expect(native).toEqual([true, true, false]);
  });

  it('drops for a subscriber whose queue is full, counts it, and the subscriber sees the seq gap', async () => {
    const p = await publisher({ hwm: 4, bufferSteps: 100_000 });
    // Never read until the burst is over: its kernel buffers fill, then its queue of 4.
    const slow = subscriber(p.endpoint, '', 1);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    const big = Array.from({ length: 1024 }, (_, i) => stored(i + 1));
    for (let i = 0; i < 200; i++) {
      p.publish(big);
      if (i % 20 === 19) await p.flush();
    }
    await until(() => p.stats().zmqLiveDropped > 0, 'a drop');
    const seqs: bigint[] = [];
    slow.receiveTimeout = 1000;
    for (;;) {
      const m = await slow.receive().catch(() => null);
      if (m === null) break;
      seqs.push((m[1] as Buffer).readBigUInt64BE());
    }
    const s = p.stats();
    expect(s.batches).toBe(200);
    // Every batch either arrived (in order) or was counted as dropped for it.
    expect(seqs.length + s.zmqLiveDropped).toBe(200);
    expect(seqs).toEqual([...seqs].sort((x, y) => (x < y ? -1 : 1)));
    // The next batch shows the subscriber where it lost batches: its seq does not follow.
    p.publish([stored(1)]);
    await p.flush();
    const next = (await slow.receive())[1] as Buffer;
    expect(next.readBigUInt64BE()).toBe(201n);
    const all = [...seqs, 201n];
    const gaps = all.slice(1).filter((q, i) => q !== (all[i] as bigint) + 1n).length;
    expect(gaps).toBeGreaterThan(0);
  }, 30_000);
});
