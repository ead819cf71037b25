import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { decode as msgpackDecode } from '@msgpack/msgpack';
import { afterEach, describe, expect, it } from 'vitest';
import { Dealer, Request, Subscriber } from 'zeromq';
import {
  connectWarning,
  decodeBatch,
  endpointForRank,
  type KvEvent,
  KvEventPublisher,
  type KvEventPublisherOptions,
  KvHttpServer,
  KvPlaneError,
  kvEventsConfigFromJson,
  LocalIndexer,
  SimEngine,
  shouldBind,
  zmqAddress,
} from '../src/index.js';
import { FROM_SEQ_1, freePort, repoPath } from './fixtures.js';
import { normBatch, sorted } from './normalize.js';

const LOOPBACK = 'tcp://127.0.0.1:*';
const END = Buffer.alloc(8, 0xff);
const cleanup: Array<() => unknown> = [];

afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function publisher(opts: KvEventPublisherOptions = {}): Promise<KvEventPublisher> {
  const p = await KvEventPublisher.create({ endpoint: LOOPBACK, replayEndpoint: LOOPBACK, ...FROM_SEQ_1, ...opts });
  cleanup.push(() => p.close());
  return p;
}

function subscriber(endpoint: string, receiveHighWaterMark = 0, receiveBufferSize = -1): Subscriber {
  const s = new Subscriber({ receiveHighWaterMark, receiveBufferSize });
  s.connect(endpoint);
  s.subscribe();
  cleanup.push(() => s.close());
  return s;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** A chain of `n` stored single-block events (root first), tokens derived from the hash. */
function chain(n: number, first = 1): KvEvent[] {
  return Array.from({ length: n }, (_, i) => ({
    type: 'stored' as const,
    blockHashes: [BigInt(first + i)],
    parentBlockHash: i === 0 ? null : BigInt(first + i - 1),
    tokenIds: new Uint32Array(16).fill(first + i),
    blockSize: 16,
  }));
}

interface Frame {
  seq: bigint;
  payload: Buffer;
}

async function receive(sub: Subscriber, count: number): Promise<Frame[]> {
  const out: Frame[] = [];
  while (out.length < count) {
    const [, seq, payload] = (await sub.receive()) as [Buffer, Buffer, Buffer];
    out.push({ seq: seq.readBigUInt64BE(), payload });
  }
  return out;
}

function seqBuf(seq: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(seq);
  return b;
}

/** DEALER replay: every reply up to the end marker, as [topic?, seq, payload] after the delimiter. */
async function dealerReplay(endpoint: string, start: bigint, receiveTimeout = 10_000): Promise<Buffer[][]> {
  const d = new Dealer({ receiveTimeout });
  cleanup.push(() => d.close());
  d.connect(endpoint);
  await d.send([Buffer.alloc(0), seqBuf(start)]);
  const replies: Buffer[][] = [];
  for (;;) {
    const frames = (await d.receive()).slice(1) as Buffer[];
    replies.push(frames);
    if ((frames[frames.length - 2] as Buffer).equals(END)) return replies;
  }
}

class PyPeer {
  readonly lines: unknown[] = [];
  readonly proc: ChildProcessWithoutNullStreams;
  readonly exited: Promise<number | null>;

  constructor(args: string[]) {
    this.proc = spawn('python3', [repoPath('scripts/zmq_peer.py'), ...args]);
    let err = '';
    this.proc.stderr.on('data', (d) => {
      err += d;
    });
    createInterface({ input: this.proc.stdout }).on('line', (l) => this.lines.push(JSON.parse(l)));
    this.exited = new Promise((resolve) =>
      this.proc.on('exit', (code) => {
        if (code !== 0) console.error(err);
        resolve(code);
      }),
    );
    cleanup.push(() => this.proc.kill());
  }
}

/** The content of a dump, independent of segment order. */
async function dumpSet(ix: LocalIndexer): Promise<string[]> {
  const d = await ix.dumpTree();
  return d.workers
    .flatMap((w) =>
      w.events.map((e) =>
        JSON.stringify([
          w.dpRank,
          Array.from(e.blockHashes ?? [], String),
          String(e.parentBlockHash),
          Array.from(e.tokenIds ?? []),
        ]),
      ),
    )
    .sort();
}

describe('live stream', () => {
  it('a zeromq.js and a pyzmq + msgspec subscriber see contiguous seqs from 1 and identical content', async () => {
    const p = await publisher({ topic: 'kv@node0' });
    const sim = new SimEngine(p, { seed: 7, numBlocks: 512, requestsPerSecond: 400 });
    const batches = 40;
    const js = subscriber(p.endpoint);
    const py = new PyPeer(['sub', p.endpoint, String(batches)]);
    await until(() => py.lines.length > 0 && p.stats().subscribers === 2, 'both subscribers');
    await sleep(200);
    while (p.stats().batches < batches) {
      sim.step();
      await p.flush();
    }
    const ours = await receive(js, batches);
    expect(ours.map((f) => f.seq)).toEqual(Array.from({ length: batches }, (_, i) => BigInt(i + 1)));
    await py.exited;
    const theirs = py.lines.slice(1) as { seq: string; topic: string; batch: unknown }[];
    expect(theirs.map((l) => l.seq)).toEqual(ours.map((f) => String(f.seq)));
    expect(theirs.every((l) => l.topic === 'kv@node0')).toBe(true);
    for (const [i, f] of ours.entries()) {
      expect(sorted(theirs[i]?.batch)).toEqual(sorted(normBatch(decodeBatch(f.payload, 'vllm'), false)));
    }
    // Evictions happened, so the stream carries removals too, and the index took every event.
    expect(sim.stats.evictions).toBeGreaterThan(0);
    expect(p.indexer.stats().drops.unknown_parent).toBe(0);
    expect(p.indexer.stats().blocks).toBe(sim.stats.cachedBlocks);
  }, 30_000);

  it('publish() takes events in order and packs at most 1024 events per batch', async () => {
    const p = await publisher();
    const sub = subscriber(p.endpoint);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    expect(p.publish(chain(2500))).toBe(2500);
    const frames = await receive(sub, 3);
    expect(frames.map((f) => decodeBatch(f.payload, 'vllm').events.length)).toEqual([1024, 1024, 452]);
    const first = decodeBatch(frames[0]?.payload as Buffer, 'vllm');
    expect(first.events[0]?.blockHashes).toEqual(new BigUint64Array([1n]));
    expect(first.dpRank).toBeUndefined();
  });

  it('publishColumns() puts the same batches on the wire as publish() of the same events', async () => {
    // stored chains (LoRA-tagged, on CPU), a removal and a clear, as events and as columns
    const attrs = { medium: 'CPU', loraName: 'adapter-a' };
    const events: KvEvent[] = [
      ...chain(3).map((e) => ({ ...e, ...attrs, loraId: 7n })),
      { type: 'removed', blockHashes: [3n], medium: 'CPU' },
      { type: 'cleared' },
    ];
    const columns = {
      kinds: Uint8Array.from([0, 0, 0, 1, 2]),
      hashCounts: Uint32Array.from([1, 1, 1, 1, 0]),
      hashes: BigUint64Array.from([1n, 2n, 3n, 3n]),
      parents: BigUint64Array.from([0n, 1n, 2n, 0n, 0n]),
      hasParent: Uint8Array.from([0, 1, 1, 0, 0]),
      tokens: Uint32Array.from([...new Array(16).fill(1), ...new Array(16).fill(2), ...new Array(16).fill(3)]),
      blockSize: 16,
      ...attrs,
      loraId: 7n,
    };
    const frames: Frame[][] = [];
    for (const send of [
      (p: KvEventPublisher) => p.publish(events),
      (p: KvEventPublisher) => p.publishColumns(columns),
    ]) {
      const p = await publisher();
      const sub = subscriber(p.endpoint);
      await until(() => p.stats().subscribers === 1, 'the subscriber');
      await sleep(100);
      expect(send(p)).toBe(5);
      frames.push(await receive(sub, 1));
    }
    const [byEvents, byColumns] = frames.map((f) =>
      f.map((x) => ({ seq: x.seq, batch: decodeBatch(x.payload, 'vllm') })),
    );
    expect(byColumns?.[0]?.seq).toBe(1n);
    expect(byColumns?.map((b) => normBatch({ ...b.batch, ts: 0 }, false))).toEqual(
      byEvents?.map((b) => normBatch({ ...b.batch, ts: 0 }, false)),
    );
    const first = byColumns?.[0]?.batch.events[0];
    expect([first?.type, first?.loraName, first?.medium]).toEqual(['stored', 'adapter-a', 'CPU']);
    expect(byColumns?.[0]?.batch.events.map((e) => e.type)).toEqual([
      'stored',
      'stored',
      'stored',
      'removed',
      'cleared',
    ]);
  });

  it('publishColumns() refuses inconsistent or mistyped columns with ERR_INVALID_ARG and enqueues nothing', async () => {
    const p = await publisher();
    const good = {
      kinds: Uint8Array.from([0]),
      hashCounts: Uint32Array.from([1]),
      hashes: BigUint64Array.from([1n]),
      parents: new BigUint64Array(1),
      hasParent: new Uint8Array(1),
      tokens: new Uint32Array(16),
      blockSize: 16,
    };
    for (const bad of [
      { ...good, tokens: new Uint32Array(15) },
      { ...good, hashes: [1n] as unknown as BigUint64Array },
      { ...good, blockSize: 0 },
    ]) {
      expect(() => p.publishColumns(bad)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    }
    expect(p.publishColumns(good)).toBe(1);
    await until(() => p.indexer.lastSeq === 1n, 'the batch');
    expect(p.indexer.stats().memberships).toBe(1);
  });

  it('a full queue drops, counts, and shows the loss as a seq gap', async () => {
    const p = await publisher({ maxQueueSize: 10 });
    const sub = subscriber(p.endpoint);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    expect(p.publish(chain(25))).toBe(10);
    await p.flush();
    p.publish(chain(1, 100));
    const frames = await receive(sub, 2);
    expect(frames.map((f) => f.seq)).toEqual([1n, 3n]);
    expect(p.stats().drops.queue_full).toBe(15);
    expect(p.stats().gaps).toBe(1);
    // The log cannot bridge the gap: recovery from before it is a tree dump.
    expect(p.indexer.getEvents(1n).kind).toBe('TreeDump');
  });

  it('stalled subscribers and replay clients never block publish()', async () => {
    const p = await publisher();
    const stalled = subscriber(p.endpoint, 1);
    const live = subscriber(p.endpoint);
    await until(() => p.stats().subscribers === 2, 'the subscribers');
    await sleep(100);
    p.publish(chain(2048));
    await p.flush();
    // A replay client that never reads, asking for everything.
    const d = new Dealer({ receiveHighWaterMark: 1 });
    cleanup.push(() => d.close());
    d.connect(p.replayEndpoint as string);
    await d.send([Buffer.alloc(0), seqBuf(1n)]);
    const total = 200;
    const received = receive(live, total);
    for (let i = 2; i < total; i++) {
      // Synchronous: the events are queued and the call returns, whatever the peers do.
      expect(p.publish(chain(1024, 10_000 + i * 1024))).toBe(1024);
      await new Promise(setImmediate);
    }
    await p.flush();
    const got = await received;
    expect(got.map((f) => f.seq)).toEqual(Array.from({ length: total }, (_, i) => BigInt(i + 1)));
    expect(p.stats().drops).toEqual({ queue_full: 0, send_failed: 0 });
    expect(stalled.closed).toBe(false);
  }, 30_000);

  it('DP rank offsets the ports and tags every batch', async () => {
    const probe = await publisher({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
    const base = Number(/:(\d+)$/.exec(probe.endpoint)?.[1]);
    await probe.close();
    const p = await publisher({ endpoint: `tcp://*:${base}`, replayEndpoint: null, dataParallelRank: 2 });
    expect(p.endpoint).toMatch(new RegExp(`:${base + 2}$`));
    const sub = subscriber(`tcp://127.0.0.1:${base + 2}`);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    p.publish(chain(1));
    const [f] = await receive(sub, 1);
    expect(decodeBatch((f as Frame).payload, 'vllm').dpRank).toBe(2);
    expect(p.indexer.stats().perWorker[0]?.dpRank).toBe(2);
  }, 15_000);
});

describe('replay', () => {
  async function filled(bufferSteps = 1000): Promise<KvEventPublisher> {
    const p = await publisher({ bufferSteps, topic: 't' });
    for (let i = 0; i < 12; i++) {
      p.publish(chain(3, 1 + 3 * i));
      await p.flush();
    }
    return p;
  }

  it('DEALER: from the start and from the middle, each batch as published, then the end marker', async () => {
    const p = await filled();
    const all = await dealerReplay(p.replayEndpoint as string, 1n);
    expect(all).toHaveLength(13);
    expect(all.slice(0, 12).map((f) => f[1]?.readBigUInt64BE())).toEqual(
      Array.from({ length: 12 }, (_, i) => BigInt(i + 1)),
    );
    expect(all.every((f) => f[0]?.toString() === 't')).toBe(true);
    const end = all[12] as Buffer[];
    expect([end[1]?.equals(END), end[2]?.length]).toEqual([true, 0]);
    const mid = await dealerReplay(p.replayEndpoint as string, 7n);
    expect(mid.map((f) => f[1]?.toString('hex'))).toEqual([...all.slice(6).map((f) => f[1]?.toString('hex'))]);
    const live = p.indexer.replay(7n, 100);
    expect(mid[0]?.[2]).toEqual(live.payloads[0]);
    // A start past the newest batch: just the end marker.
    expect(await dealerReplay(p.replayEndpoint as string, 99n)).toHaveLength(1);
  });

  it('an expired start replays from the oldest retained batch (the client compares)', async () => {
    const p = await filled(5);
    const r = await dealerReplay(p.replayEndpoint as string, 1n);
    expect(r.slice(0, -1).map((f) => f[1]?.readBigUInt64BE())).toEqual([8n, 9n, 10n, 11n, 12n]);
  });

  it('REQ sees the first reply; replies can omit the topic frame (older vLLM, SGLang)', async () => {
    const p = await publisher({ replayTopicFrame: false, topic: 't' });
    p.publish(chain(3));
    await p.flush();
    const req = new Request({ receiveTimeout: 5000 });
    cleanup.push(() => req.close());
    req.connect(p.replayEndpoint as string);
    await req.send(seqBuf(1n));
    const [seq, payload] = (await req.receive()) as Buffer[];
    expect(seq?.readBigUInt64BE()).toBe(1n);
    expect(decodeBatch(payload as Buffer, 'vllm').events).toHaveLength(3);
  });

  it('pyzmq DEALER and REQ clients (vLLM-style) read the replay', async () => {
    const p = await filled();
    const dealer = new PyPeer(['replay', p.replayEndpoint as string, '10', 'dealer', 'topic']);
    expect(await dealer.exited).toBe(0);
    expect(dealer.lines.map((l) => (l as { seq?: string }).seq ?? 'end')).toEqual(['10', '11', '12', 'end']);
    const req = new PyPeer(['replay', p.replayEndpoint as string, '4', 'req', 'topic']);
    expect(await req.exited).toBe(0);
    expect(req.lines.map((l) => (l as { seq: string }).seq)).toEqual(['4']);
    const decoded = p.indexer.getEvents(4n, 4n);
    expect(decoded.kind).toBe('Events');
    if (decoded.kind === 'Events') {
      expect(sorted((req.lines[0] as { batch: unknown }).batch)).toEqual(sorted(normBatch(decoded.batches[0]!, false)));
    }
  }, 20_000);

  it('answers malformed requests with the end marker alone, counts them and keeps serving', async () => {
    const p = await filled();
    const d = new Dealer({ receiveTimeout: 5000 });
    cleanup.push(() => d.close());
    d.connect(p.replayEndpoint as string);
    await d.send([Buffer.alloc(0), Buffer.from('nope')]);
    const [delim, topic, seq, payload] = (await d.receive()) as Buffer[];
    expect(delim?.length).toBe(0);
    expect(topic?.toString()).toBe('t'); // filled() publishes on topic 't'
    expect(seq).toEqual(Buffer.alloc(8, 0xff));
    expect(payload?.length).toBe(0);
    // A REQ client (vLLM's own replay client shape) is answered too, never left blocked.
    const req = new Request({ receiveTimeout: 5000 });
    cleanup.push(() => req.close());
    req.connect(p.replayEndpoint as string);
    await req.send(Buffer.from([1, 2, 3]));
    const reply = (await req.receive()) as Buffer[];
    expect(reply.at(-2)).toEqual(Buffer.alloc(8, 0xff));
    expect(await dealerReplay(p.replayEndpoint as string, 12n)).toHaveLength(2);
    expect(p.stats().replay.malformed).toBe(2);
  });

  it('answers every request of a peer that reads, a malformed one in its turn, each with its end marker', async () => {
    const p = await filled();
    const d = new Dealer({ receiveTimeout: 5000, receiveHighWaterMark: 4 });
    cleanup.push(() => d.close());
    d.connect(p.replayEndpoint as string);
    // A whole replay, then fifty malformed requests behind it: once lost when the peer's queue
    // was full for a moment, even as it read.
    await d.send([Buffer.alloc(0), seqBuf(1n)]);
    for (let i = 0; i < 50; i++) await d.send([Buffer.alloc(0), Buffer.from('nope')]);
    let ends = 0;
    let batches = 0;
    while (ends < 51) {
      const f = (await d.receive()) as Buffer[];
      if (f[2]?.equals(END)) ends++;
      else batches++;
    }
    expect([batches, ends, p.stats().replay.abandoned]).toEqual([12, 51, 0]);
    // A frame no request needs is refused by the socket, not buffered: the peer is cut off.
    const big = new Dealer({ receiveTimeout: 1000 });
    cleanup.push(() => big.close());
    big.connect(p.replayEndpoint as string);
    await big.send([Buffer.alloc(0), Buffer.alloc(64 * 1024)]);
    await expect(big.receive()).rejects.toThrow();
    expect(await dealerReplay(p.replayEndpoint as string, 12n)).toHaveLength(2);
  });

  it('a peer that asks and never reads holds one replay session, not every one', async () => {
    const p = await publisher({ replaySendTimeoutMs: 20_000, topic: 't' });
    for (let i = 0; i < 64; i++) {
      p.publish(chain(64, 1 + 64 * i));
      await p.flush();
    }
    const stalled = new Dealer({ receiveHighWaterMark: 1 });
    cleanup.push(() => stalled.close());
    stalled.connect(p.replayEndpoint as string);
    for (let i = 0; i < 200; i++) await stalled.send([Buffer.alloc(0), seqBuf(1n)]);
    await until(() => p.stats().replay.requests >= 200, "the stalled peer's requests");
    // Another peer is served at once, not after the stalled one's sessions time out.
    const t0 = performance.now();
    expect(await dealerReplay(p.replayEndpoint as string, p.indexer.lastSeq - 4n)).toHaveLength(6);
    expect(performance.now() - t0).toBeLessThan(5000);
    expect(p.stats().replay.sessions).toBeLessThanOrEqual(1);
    // It had at most 64 requests waiting: most of the rest were refused (each of its sessions
    // that completed into its socket's buffers let one more wait).
    expect(p.stats().replay.refused).toBeGreaterThan(100);
  }, 30_000);
  it('peers that stop reading give their sessions up after 5 s while other peers wait, not after the send timeout', async () => {
    const p = await publisher({ replaySendTimeoutMs: 60_000, replaySendBudgetBytes: 1, topic: 't' });
    for (let i = 0; i < 128; i++) {
      p.publish(chain(1024, 1 + 1024 * i));
      await p.flush();
    }
    // Seventeen peers (one more than there are sessions) each ask for the whole log and read
    // nothing: each replay is far more than the socket's and the kernel's buffers hold.
    for (let i = 0; i < 17; i++) {
      const stalled = new Dealer({ receiveHighWaterMark: 1, receiveBufferSize: 4096 });
      cleanup.push(() => stalled.close());
      stalled.connect(p.replayEndpoint as string);
      await stalled.send([Buffer.alloc(0), seqBuf(1n)]);
    }
    await until(() => p.stats().replay.requests >= 17 && p.stats().replay.sessions === 16, 'every session taken');
    const t0 = performance.now();
    expect(await dealerReplay(p.replayEndpoint as string, p.indexer.lastSeq - 2n, 30_000)).toHaveLength(4);
    const waited = performance.now() - t0;
    expect(waited).toBeGreaterThan(1000);
    expect(waited).toBeLessThan(15_000);
    expect(p.stats().replay.abandoned).toBeGreaterThanOrEqual(1);
  }, 60_000);
});

describe('recovering after a gap', () => {
  it('a subscriber pushed over HWM detects the gap and recovers an identical index by replay and by /kv_recover', async () => {
    const p = await publisher({ hwm: 4, bufferSteps: 1000 });
    const http = await KvHttpServer.create({ publisher: p });
    cleanup.push(() => http.close());
    // Small HWM and kernel buffer: a subscriber that does not read loses batches.
    const sub = subscriber(p.endpoint, 2, 4096);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    const sim = new SimEngine(p, { seed: 3, numBlocks: 256, requestsPerSecond: 300 });
    for (let i = 0; i < 100; i++) sim.step();
    // ~10 MB of batches while the subscriber does not read.
    for (let i = 0; i < 100; i++) {
      p.publish(chain(1024, 1 + i * 1024));
      await p.flush();
    }
    for (let i = 0; i < 100; i++) sim.step();
    await p.flush();
    // The live stream goes on: the next batch is how a subscriber notices a loss at the tail.
    setTimeout(() => p.publish(chain(1, 999_999)), 300);
    const last = p.indexer.lastSeq + 1n;
    // The subscriber reads only now: most batches were dropped at the HWMs.
    const mirror = new LocalIndexer({ blockSize: 16, epoch: 1n });
    cleanup.push(() => mirror.close());
    let applied = 0n;
    let gaps = 0;
    while (applied < last) {
      const [, seqFrame, payload] = (await sub.receive()) as Buffer[];
      const seq = (seqFrame as Buffer).readBigUInt64BE();
      if (seq <= applied) continue;
      if (seq !== applied + 1n) {
        gaps++;
        // Gap: replay from the first missing seq, up to the end marker.
        for (const f of await dealerReplay(p.replayEndpoint as string, applied + 1n)) {
          const s = (f[1] as Buffer).readBigUInt64BE();
          if (f[1]?.equals(END) || s <= applied) continue;
          expect(s).toBe(applied + 1n);
          mirror.applyEncoded(f[2] as Buffer, 'vllm');
          applied = s;
        }
      }
      if (seq === applied + 1n) {
        mirror.applyEncoded(payload as Buffer, 'vllm');
        applied = seq;
      }
    }
    expect(gaps).toBeGreaterThan(0);
    expect(await dumpSet(mirror)).toEqual(await dumpSet(p.indexer));

    // The same state from /kv_recover (a TreeDump, msgpack for exact u64s).
    const res = await fetch(`${http.url}/kv_recover?format=msgpack`);
    expect(res.status).toBe(200);
    const dump = msgpackDecode(new Uint8Array(await res.arrayBuffer()), { useBigInt64: true }) as {
      TreeDump: { workers: { dp_rank: number; events: Record<string, unknown>[] }[]; last_seq: bigint | number };
    };
    expect(BigInt(dump.TreeDump.last_seq)).toBe(last);
    const fromDump = new LocalIndexer({ blockSize: 16, epoch: 1n });
    cleanup.push(() => fromDump.close());
    for (const w of dump.TreeDump.workers) {
      for (let i = 0; i < w.events.length; i += 1024) {
        const events = w.events.slice(i, i + 1024).map((e) => ({
          type: 'stored' as const,
          blockHashes: (e.block_hashes as (number | bigint)[]).map((h) => BigInt(h)),
          parentBlockHash: e.parent_block_hash == null ? null : BigInt(e.parent_block_hash as number | bigint),
          tokenIds: (e.token_ids as number[]).map(Number),
          blockSize: Number(e.block_size),
        }));
        fromDump.applyBatch({ dpRank: w.dp_rank, events });
      }
    }
    expect(await dumpSet(fromDump)).toEqual(await dumpSet(p.indexer));
  }, 60_000);
});

describe('HTTP', () => {
  async function served(bufferSteps = 4) {
    const p = await publisher({ bufferSteps });
    for (let i = 0; i < 6; i++) {
      p.publish(chain(2, 1 + 2 * i));
      await p.flush();
    }
    const http = await KvHttpServer.create({ publisher: p, sources: [{ name: 'api', kind: 'api' }] });
    cleanup.push(() => http.close());
    return { p, http };
  }

  it('answers all four /kv_recover kinds, in JSON and msgpack', async () => {
    const { p, http } = await served();
    const get = async (q: string, init?: RequestInit) => {
      const r = await fetch(`${http.url}/kv_recover${q}`, init);
      return { status: r.status, type: r.headers.get('content-type'), body: Buffer.from(await r.arrayBuffer()) };
    };
    const events = await get('?start=4&end=5');
    expect(events.status).toBe(200);
    const ev = JSON.parse(events.body.toString()) as { Events: { batches: { seq: number }[]; last_seq: number } };
    expect(ev.Events.batches.map((b) => b.seq)).toEqual([4, 5]);
    expect(ev.Events.last_seq).toBe(6);
    expect(events.body.toString()).toContain(`"epoch":${p.epoch}`);
    const dump = await get('?start=1');
    expect(Object.keys(JSON.parse(dump.body.toString()))).toEqual(['TreeDump']);
    const tooNew = await get('?start=7');
    expect([tooNew.status, Object.keys(JSON.parse(tooNew.body.toString()))[0]]).toEqual([200, 'TooNew']);
    for (const q of ['?start=5&end=4', '?start=x', '?end=-1']) {
      const bad = await get(q);
      expect(bad.status, q).toBe(400);
      expect(Object.keys(JSON.parse(bad.body.toString()))).toEqual(['InvalidRange']);
    }
    const mp = await get('?start=6', { headers: { accept: 'application/msgpack' } });
    expect(mp.type).toBe('application/msgpack');
    const decoded = msgpackDecode(mp.body, { useBigInt64: true }) as { Events: { epoch: bigint | number } };
    expect(BigInt(decoded.Events.epoch)).toBe(p.epoch);
    expect((await get('?format=msgpack')).type).toBe('application/msgpack');
    expect((await get('?format=json', { headers: { accept: 'application/msgpack' } })).type).toBe('application/json');
    const xml = await get('?format=xml');
    expect([xml.status, JSON.parse(xml.body.toString())]).toEqual([400, { error: 'format is json or msgpack' }]);
  });

  it('/healthz reports epoch, seqs, sources and fail-closed state; /metrics is Prometheus text', async () => {
    const { p, http } = await served();
    const health = await (await fetch(`${http.url}/healthz`)).text();
    const h = JSON.parse(health) as Record<string, unknown>;
    expect(h.status).toBe('ok');
    expect(health).toContain(`"epoch":${p.epoch}`);
    expect([h.last_seq, h.oldest_seq]).toEqual([6, 3]);
    expect(h.sources).toEqual([{ name: 'api', kind: 'api', state: 'ok' }]);
    // A stored event whose tokens do not fill its blocks fails closed.
    p.publish([{ type: 'stored', blockHashes: [99n], tokenIds: [1, 2, 3], blockSize: 16 }]);
    await p.flush();
    const after = JSON.parse(await (await fetch(`${http.url}/healthz`)).text()) as Record<string, unknown>;
    expect(after.status).toBe('fail_closed');
    expect(JSON.stringify(after.fail_closed)).toContain('Unsupported BlockStored layout');
    const last = p.indexer.replay(p.indexer.lastSeq, 1);
    expect(decodeBatch(last.payloads[0] as Buffer, 'vllm').events.map((e) => e.type)).toEqual(['cleared']);
    const metrics = await fetch(`${http.url}/metrics`);
    expect(metrics.headers.get('content-type')).toMatch(/^text\/plain/);
    const text = await metrics.text();
    expect(text).toMatch(/^kvplane_events_published_total 13$/m);
    expect(text).toMatch(/^kvplane_batches_published_total 7$/m);
    expect(text).toMatch(/^kvplane_events_dropped_total\{reason="unsupported_layout"\} 1$/m);
    expect(text).toMatch(/^kvplane_index_blocks 0$/m); // the rank's state was dropped
    expect(text).toMatch(/^kvplane_fail_closed_ranks 1$/m);
    expect((await fetch(`${http.url}/nope`)).status).toBe(404);
  });
});

describe('configuration', () => {
  it("accepts vLLM's KVEventsConfig names and rejects unknown keys", () => {
    expect(
      kvEventsConfigFromJson({
        enable_kv_cache_events: true,
        publisher: 'zmq',
        endpoint: 'tcp://*:6000',
        replay_endpoint: 'tcp://*:6001',
        buffer_steps: 5,
        hwm: 10,
        max_queue_size: 20,
        topic: 'x',
      }),
    ).toEqual({
      publisher: 'zmq',
      endpoint: 'tcp://*:6000',
      replayEndpoint: 'tcp://*:6001',
      bufferSteps: 5,
      hwm: 10,
      maxQueueSize: 20,
      topic: 'x',
    });
    expect(() => kvEventsConfigFromJson({ buffer_step: 5 })).toThrow(KvPlaneError);
    expect(() => kvEventsConfigFromJson({ publisher: 'kafka' })).toThrow(/publisher/);
  });

  it("binds or connects by vLLM's rule and offsets endpoints by DP rank", () => {
    expect(
      ['tcp://*:5557', 'tcp://[::]:5557', 'ipc:///tmp/x', 'inproc://x', 'tcp://10.0.0.1:5557'].map(shouldBind),
    ).toEqual([true, true, true, true, false]);
    expect(endpointForRank('tcp://*:5557', 3)).toBe('tcp://*:5560');
    expect(endpointForRank('inproc://ev', 1)).toBe('inproc://ev_dp1');
    expect(endpointForRank('tcp://*:5557', 0)).toBe('tcp://*:5557');
    expect(() => endpointForRank('tcp://*:5557', -1)).toThrow(KvPlaneError);
  });

  it('bind: serves on a given address (loopback only), connect: connects; a connecting endpoint is warned about', async () => {
    expect(['bind:tcp://127.0.0.1:5557', 'connect:tcp://*:5557', 'bind:ipc:///tmp/x'].map(shouldBind)).toEqual([
      true,
      false,
      true,
    ]);
    expect(zmqAddress('bind:tcp://127.0.0.1:5557')).toBe('tcp://127.0.0.1:5557');
    expect(endpointForRank('bind:tcp://127.0.0.1:5557', 2)).toBe('bind:tcp://127.0.0.1:5559');
    expect(endpointForRank('bind:inproc://ev', 1)).toBe('bind:inproc://ev_dp1');
    expect(connectWarning('tcp://127.0.0.1:5557')).toMatch(/will connect .* write bind:tcp:\/\/127\.0\.0\.1:5557/);
    expect(['tcp://*:5557', 'bind:tcp://127.0.0.1:5557', 'connect:tcp://10.0.0.1:5557'].map(connectWarning)).toEqual([
      null,
      null,
      null,
    ]);
    // A real bind on loopback: a subscriber that connects there receives the stream.
    const [livePort, replayPort] = [await freePort(), await freePort()];
    const p = await publisher({
      endpoint: `bind:tcp://127.0.0.1:${livePort}`,
      replayEndpoint: `bind:tcp://127.0.0.1:${replayPort}`,
    });
    expect(p.endpoint).toBe(`tcp://127.0.0.1:${livePort}`);
    expect(p.replayEndpoint).toBe(`tcp://127.0.0.1:${replayPort}`);
    const sub = subscriber(`tcp://127.0.0.1:${livePort}`);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    p.publish(chain(2));
    const [, seq] = (await sub.receive()) as Buffer[];
    expect(seq?.readBigUInt64BE()).toBe(1n);
  });

  it('close sends what was published before it, with no flush first', async () => {
    const p = await KvEventPublisher.create({ endpoint: LOOPBACK, replayEndpoint: null, ...FROM_SEQ_1 });
    const sub = subscriber(p.endpoint);
    await until(() => p.stats().subscribers === 1, 'the subscriber');
    await sleep(100);
    for (let i = 0; i < 20; i++) p.publish(chain(200, 1 + i * 200));
    await p.close();
    let events = 0;
    sub.receiveTimeout = 2000;
    while (events < 4000) {
      const got = await sub.receive().catch(() => null);
      if (got === null) break;
      const [, , payload] = got as Buffer[];
      events += decodeBatch(payload as Buffer, 'vllm').events.length;
    }
    expect(events).toBe(4000);
  });

  it('bad options are typed errors; a closed publisher refuses events', async () => {
    await expect(KvEventPublisher.create({ endpoint: LOOPBACK, maxQueueSize: 0 })).rejects.toMatchObject({
      code: 'ERR_INVALID_ARG',
    });
    await expect(KvEventPublisher.create({ endpoint: 'bogus://x' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' });
    const p = await publisher();
    expect(() => p.publish([{ type: 'stored', blockHashes: [1n], tokenIds: [], blockSize: -1 }])).toThrow(KvPlaneError);
    await p.close();
    expect(() => p.cleared()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
  });
});

describe('simulated engine', () => {
  class Collect {
    events: KvEvent[] = [];
    publish(events: readonly KvEvent[]): number {
      this.events.push(...events);
      return events.length;
    }
  }

  it('replays the same events from the same seed, evicts LRU blocks and reuses shared prefixes', () => {
    const run = (seed: number) => {
      const c = new Collect();
      const sim = new SimEngine(c, { seed, numBlocks: 300, requestsPerSecond: 200 });
      for (let i = 0; i < 200; i++) sim.step();
      return { c, sim };
    };
    const a = run(5);
    const b = run(5);
    expect(b.c.events).toEqual(a.c.events);
    expect(run(6).c.events).not.toEqual(a.c.events);
    const kinds = new Set(a.c.events.map((e) => e.type));
    expect(kinds).toEqual(new Set(['stored', 'removed']));
    expect(a.sim.stats.evictions).toBeGreaterThan(0);
    expect(a.sim.stats.hitBlocks).toBeGreaterThan(0); // system prompts and documents are shared
    expect(a.sim.stats.cachedBlocks).toBeLessThanOrEqual(300);
    // Every stored event continues from a block that was cached at the time.
    const cached = new Set<bigint>();
    for (const e of a.c.events) {
      if (e.type === 'stored') {
        if (e.parentBlockHash != null) expect(cached.has(e.parentBlockHash)).toBe(true);
        for (const h of e.blockHashes) cached.add(h);
      } else if (e.type === 'removed') for (const h of e.blockHashes) expect(cached.delete(h)).toBe(true);
    }
    expect(cached.size).toBe(a.sim.stats.cachedBlocks);
  });

  it('a reset publishes one cleared event', () => {
    const c = new Collect();
    const sim = new SimEngine(c, { seed: 1 });
    sim.step();
    sim.reset();
    expect(c.events.at(-1)).toEqual({ type: 'cleared' });
    expect(sim.stats.cachedBlocks).toBe(0);
  });
});
