import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import {
  type ClientReadableStream,
  credentials,
  type GrpcObject,
  loadPackageDefinition,
  Metadata,
  type ServiceClientConstructor,
  status,
} from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { afterEach, describe, expect, it } from 'vitest';
import { Subscriber as ZmqSubscriber } from 'zeromq';
import {
  decodeBatch,
  decodeSubscribeRequest,
  encodeSubscribeRequest,
  type KvEvent,
  KvEventPublisher,
  type KvEventPublisherOptions,
  KvGrpcServer,
  type KvGrpcServerOptions,
  KvHttpServer,
  subscribeDefinition,
} from '../src/index.js';
import { FROM_SEQ_1, repoPath, runGrpcPeer } from './fixtures.js';

const LOOPBACK = 'tcp://127.0.0.1:*';
const cleanup: Array<() => unknown> = [];

afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

// A client generated from kvplane's .proto files by @grpc/proto-loader (protobufjs decodes).
const SERVICES = {
  vllm: ['vllm', 'grpc', 'engine', 'VllmEngine'],
  sglang: ['sglang', 'grpc', 'scheduler', 'SglangScheduler'],
  trtllm: ['trtllm', 'TrtllmService'],
  tokenspeed: ['tokenspeed', 'grpc', 'scheduler', 'TokenSpeedScheduler'],
} as const;
type Engine = keyof typeof SERVICES;

const pkg = loadPackageDefinition(
  loadSync(['vllm_engine.proto', 'sglang_scheduler.proto', 'trtllm_service.proto', 'tokenspeed_scheduler.proto'], {
    includeDirs: [repoPath('proto')],
    keepCase: true,
    longs: String,
    oneofs: true,
  }),
);

function clientCtor(engine: Engine): ServiceClientConstructor {
  let o: unknown = pkg;
  for (const part of SERVICES[engine]) o = (o as GrpcObject)[part];
  return o as ServiceClientConstructor;
}

interface ProtoBlock {
  block_hash: string;
  token_ids: number[];
  block_size: number;
}
interface ProtoEvent {
  event_id: string;
  data: 'stored' | 'removed' | 'cleared';
  stored?: { blocks: ProtoBlock[]; parent_block_hash?: string };
  removed?: { block_hashes: string[] };
}
interface ProtoBatch {
  sequence_number: string;
  timestamp: number;
  events: ProtoEvent[];
  dp_rank?: number;
}

/** The compact normalized form all three decoders (kvplane, protobufjs, Python protobuf) map to. */
interface Compact {
  type: string;
  block_hashes?: string[];
  parent_block_hash?: string;
  token_ids?: number[];
  block_size?: number;
}

const u64 = (s: string) => BigInt.asUintN(64, BigInt(s)).toString();

function compactProto(e: ProtoEvent): Compact {
  if (e.data === 'stored' && e.stored) {
    const out: Compact = {
      type: 'stored',
      block_hashes: e.stored.blocks.map((b) => u64(b.block_hash)),
      token_ids: e.stored.blocks.flatMap((b) => b.token_ids),
      block_size: e.stored.blocks[0]?.block_size ?? 0,
    };
    if (e.stored.parent_block_hash !== undefined) out.parent_block_hash = u64(e.stored.parent_block_hash);
    return out;
  }
  if (e.data === 'removed' && e.removed) return { type: 'removed', block_hashes: e.removed.block_hashes.map(u64) };
  return { type: e.data };
}

function compactZmq(payload: Buffer): Compact[] {
  return decodeBatch(payload, 'vllm').events.map((e) => {
    const out: Compact = { type: e.type };
    if (e.type === 'stored' || e.type === 'removed') out.block_hashes = Array.from(e.blockHashes ?? [], String);
    if (e.type === 'stored') {
      if (e.parentBlockHash !== undefined) out.parent_block_hash = String(e.parentBlockHash);
      out.token_ids = Array.from(e.tokenIds ?? []);
      out.block_size = e.blockSize;
    }
    return out;
  });
}

function withoutIds(events: Array<Compact & { event_id?: string }>): Compact[] {
  return events.map(({ event_id: _, ...rest }) => rest);
}

interface Received {
  epoch: string | undefined;
  batches: ProtoBatch[];
  status?: { code: number; details: string };
}

/** Subscribes from `start`; resolves once `count` batches arrived (then cancels) or the call ended. */
function subscribe(
  address: string,
  start: bigint,
  count: number,
  opts: { engine?: Engine; token?: string; creds?: ReturnType<typeof credentials.createSsl> } = {},
): { done: Promise<Received>; call: ClientReadableStream<ProtoBatch>; got: Received } {
  const Ctor = clientCtor(opts.engine ?? 'vllm');
  const client = new Ctor(address, opts.creds ?? credentials.createInsecure(), {
    'grpc.max_receive_message_length': -1,
  });
  cleanup.push(() => client.close());
  const md = new Metadata();
  if (opts.token !== undefined) md.set('authorization', `Bearer ${opts.token}`);
  const call = (
    client as unknown as Record<string, (r: object, m: Metadata) => ClientReadableStream<ProtoBatch>>
  ).SubscribeKvEvents?.({ start_sequence_number: start.toString() }, md) as ClientReadableStream<ProtoBatch>;
  const got: Received = { epoch: undefined, batches: [] };
  let cancelled = false;
  const done = new Promise<Received>((resolve) => {
    call.on('metadata', (m: Metadata) => {
      got.epoch = m.get('x-kvplane-epoch')[0]?.toString();
    });
    call.on('data', (b: ProtoBatch) => {
      got.batches.push(b);
      if (got.batches.length === count) {
        cancelled = true;
        call.cancel();
        resolve(got);
      }
    });
    call.on('error', (err: { code: number; details: string }) => {
      // The CANCELLED that our own cancel() raises arrives later: it is not the call's status.
      if (cancelled) return;
      got.status = { code: err.code, details: err.details };
      resolve(got);
    });
    call.on('end', () => resolve(got));
  });
  return { done, call, got };
}

async function node(
  pubOpts: KvEventPublisherOptions = {},
  grpcOpts: Partial<KvGrpcServerOptions> = {},
): Promise<{ pub: KvEventPublisher; grpc: KvGrpcServer; address: string }> {
  const pub = await KvEventPublisher.create({ endpoint: LOOPBACK, replayEndpoint: null, ...FROM_SEQ_1, ...pubOpts });
  cleanup.push(() => pub.close());
  const grpc = await KvGrpcServer.create({ stream: pub.stream, host: '127.0.0.1', ...grpcOpts });
  cleanup.push(() => grpc.close());
  return { pub, grpc, address: `127.0.0.1:${grpc.port}` };
}

/** Batch `i` of the test stream: chained stores (some multi-block), a removal, now and then a clear. */
function batchEvents(i: number): KvEvent[] {
  const base = BigInt(i * 100 + 1);
  const events: KvEvent[] = [
    {
      type: 'stored',
      blockHashes: [base, base + 1n],
      parentBlockHash: null,
      tokenIds: Uint32Array.from({ length: 32 }, (_, t) => i * 32 + t),
      blockSize: 16,
    },
    {
      type: 'stored',
      blockHashes: [base + 2n + (1n << 63n)],
      parentBlockHash: base + 1n,
      tokenIds: new Uint32Array(16).fill(70_000 + i),
      blockSize: 16,
    },
    { type: 'removed', blockHashes: [base + 2n + (1n << 63n)] },
  ];
  if (i % 7 === 6) events.push({ type: 'cleared' });
  return events;
}

async function publishBatches(pub: KvEventPublisher, from: number, n: number): Promise<void> {
  for (let i = from; i < from + n; i++) {
    pub.publish(batchEvents(i));
    await pub.flush();
  }
}

/** Every block a subscriber sees is a full block (`block_size` > 0 tokens): never a partial one first. */
function expectFullBlocks(batches: ProtoBatch[]): void {
  for (const b of batches) {
    for (const e of b.events) {
      for (const blk of e.stored?.blocks ?? []) {
        expect(blk.block_size).toBeGreaterThan(0);
        expect(blk.token_ids.length).toBe(blk.block_size);
      }
    }
  }
}

function seqsOf(batches: ProtoBatch[]): number[] {
  return batches.map((b) => Number(b.sequence_number));
}

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

describe('request codec', () => {
  it('round-trips SubscribeKvEventsRequest and rejects bad bytes with a typed error', () => {
    for (const s of [0n, 1n, 12345n, 2n ** 64n - 1n])
      expect(decodeSubscribeRequest(encodeSubscribeRequest(s))).toEqual({ start: s, loadRecordsEarly: false });
    expect(() => decodeSubscribeRequest(Buffer.from([0x08]))).toThrow(expect.objectContaining({ code: 'ERR_DECODE' }));
    expect(() => encodeSubscribeRequest(-1n)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
  });
});

describe('KvGrpcServer', () => {
  it('streams contiguous seqs under all four engine services, equal to the ZMQ stream', async () => {
    const { pub, address } = await node();
    const zmq = new ZmqSubscriber({ receiveHighWaterMark: 0 });
    zmq.connect(pub.endpoint);
    zmq.subscribe();
    cleanup.push(() => zmq.close());
    const engines = Object.keys(SERVICES) as Engine[];
    const subs = engines.map((engine) => subscribe(address, 0n, 20, { engine }));
    await until(() => subs.every((s) => s.got.epoch !== undefined), 'initial metadata');
    await sleep(200); // the ZMQ subscription reaches the PUB socket
    await publishBatches(pub, 0, 20);
    const zmqFrames: Array<{ seq: number; events: Compact[] }> = [];
    while (zmqFrames.length < 20) {
      const [, seq, payload] = (await zmq.receive()) as [Buffer, Buffer, Buffer];
      zmqFrames.push({ seq: Number(seq.readBigUInt64BE()), events: compactZmq(payload) });
    }
    for (const s of subs) {
      const got = await s.done;
      expect(got.status).toBeUndefined();
      expect(got.epoch).toBe(pub.epoch.toString());
      expect(seqsOf(got.batches)).toEqual(range(1, 20));
      expect(got.batches.map((b) => b.events.map(compactProto))).toEqual(zmqFrames.map((f) => f.events));
      expect(got.batches[3]?.events.map((e) => BigInt(e.event_id))).toEqual([0n, 1n, 2n].map((i) => (4n << 32n) | i));
      expectFullBlocks(got.batches);
    }
  });

  it('closes connections that open no call (a peer saying nothing held a descriptor for good), never one with a stream open', async () => {
    const { pub, grpc, address } = await node({}, { idleConnectionMs: 300 });
    const closedAfter = (data: string) =>
      new Promise<number>((resolve) => {
        const t0 = performance.now();
        const s = connect(grpc.port, '127.0.0.1', () => s.write(data));
        s.on('data', () => {});
        s.on('error', () => {});
        s.on('close', () => resolve(performance.now() - t0));
      });
    // Nothing sent, and half of HTTP/2's preface.
    const [silent, half] = await Promise.all([closedAfter(''), closedAfter('PRI * HTTP/2.0\r\n')]);
    expect(silent).toBeLessThan(3000);
    expect(half).toBeLessThan(3000);
    // A subscriber's stream keeps its connection however long nothing is published.
    const sub = subscribe(address, 0n, 3);
    await until(() => sub.got.epoch !== undefined, 'initial metadata');
    await sleep(1000);
    await publishBatches(pub, 0, 3);
    const got = await sub.done;
    expect([got.status, seqsOf(got.batches)]).toEqual([undefined, range(1, 3)]);
  });

  it('closes a connection Node stops reading (one header field over 64 KB) once its ping goes unanswered: its calls end UNAVAILABLE, not at their deadlines', async () => {
    const { pub, address } = await node({}, { keepaliveMs: 1000 });
    await publishBatches(pub, 0, 3);
    // A header field Node's HTTP/2 takes: both calls go on (the stream until the peer cancels it).
    const small = await runGrpcPeer(['bigheader', address, 'vllm', String(16 * 1024)]);
    expect(small.map((l) => l.health ?? l.stream)).toEqual(['OK', 'CANCELLED']);
    expect(small[1]?.batches).toBeGreaterThan(0);
    // One it does not: Node 20 and 22 stop reading the connection, and every call on it stalled
    // until its deadline (15 s here); the unanswered ping closes it. (Node 24 closes it at once.)
    const big = await runGrpcPeer(['bigheader', address, 'vllm', String(70 * 1024)]);
    expect(big.map((l) => l.health ?? l.stream)).toEqual(['UNAVAILABLE', 'UNAVAILABLE']);
    expect(big[1]?.secs).toBeLessThan(6);
    // The server still serves new connections.
    expect((await runGrpcPeer(['health', address, 'vllm']))[0]).toMatchObject({ healthy: true });
  });

  it('refuses a subscriber past maxSubscribers with RESOURCE_EXHAUSTED (counted), and takes one again once a stream ends', async () => {
    const { pub, grpc, address } = await node({}, { maxSubscribers: 2 });
    await publishBatches(pub, 0, 2);
    const a = subscribe(address, 1n, 100);
    const b = subscribe(address, 1n, 100);
    await until(() => grpc.stats().subscribers === 2, 'two subscribers');
    const refused = await subscribe(address, 1n, 100).done;
    expect(refused.status).toEqual({ code: status.RESOURCE_EXHAUSTED, details: '2 subscribers already; retry later' });
    // And as SMG's client sees it (smg-grpc-proto's Python stubs).
    const py = await runGrpcPeer([address, 'vllm', '1', '100']);
    expect(py.at(-1)).toMatchObject({ status: 'RESOURCE_EXHAUSTED', details: '2 subscribers already; retry later' });
    expect(grpc.stats().subscribes.full).toBe(2);
    a.call.cancel();
    await until(() => grpc.stats().subscribers === 1, 'one stream ended');
    const again = await subscribe(address, 1n, 2).done;
    expect([again.status, seqsOf(again.batches)]).toEqual([undefined, range(1, 2)]);
    b.call.cancel();
  });

  it('serves a Python grpcio client built from smg-grpc-proto: replay from the start, then live', async () => {
    const { pub, address } = await node({ dataParallelRank: 0, endpoint: LOOPBACK });
    await publishBatches(pub, 0, 5);
    const peer = runGrpcPeer([address, 'sglang', '1', '12']);
    // Live batches published while the peer replays and after.
    await sleep(300);
    await publishBatches(pub, 5, 7);
    const lines = await peer;
    expect(lines[0]).toEqual({ epoch: pub.epoch.toString() });
    const batches = lines.slice(1) as Array<{ seq: string; dp_rank: number | null; events: Compact[] }>;
    expect(batches.map((b) => Number(b.seq))).toEqual(range(1, 12));
    expect(batches.every((b) => b.dp_rank === 0)).toBe(true);
    const replayed = pub.indexer.replay(1n, 100);
    expect(batches.map((b) => withoutIds(b.events))).toEqual(replayed.payloads.map((p) => compactZmq(p)));
  });

  it('the Python client sees the status codes SMG acts on', async () => {
    const { pub, address } = await node({ bufferSteps: 3 });
    await publishBatches(pub, 0, 6);
    const expired = await runGrpcPeer([address, 'trtllm', '2', '1']);
    expect(expired.at(-1)).toMatchObject({ status: 'OUT_OF_RANGE' });
    expect(String(expired.at(-1)?.details)).toContain(
      'expired KV event replay cursor: requested sequence 2, oldest available sequence 4',
    );
    const off = await KvGrpcServer.create({ stream: null, host: '127.0.0.1' });
    cleanup.push(() => off.close());
    const none = await runGrpcPeer([`127.0.0.1:${off.port}`, 'vllm', '0', '1']);
    expect(none.at(-1)).toMatchObject({ status: 'UNIMPLEMENTED' });
  });

  it('a resubscribe with the last applied seq (as SMG does) yields no gap and no duplicate', async () => {
    const { pub, address } = await node();
    const first = subscribe(address, 0n, 8);
    await until(() => first.got.epoch !== undefined, 'metadata');
    await publishBatches(pub, 0, 8);
    const a = await first.done;
    // SMG's consumer: apply seq > last; resubscribe with the last applied seq.
    const applied: number[] = [];
    const apply = (batches: ProtoBatch[]) => {
      for (const b of batches) {
        const seq = Number(b.sequence_number);
        const last = applied.at(-1) ?? 0;
        if (seq <= last) continue;
        expect(seq).toBe(last + 1);
        applied.push(seq);
      }
    };
    apply(a.batches);
    await publishBatches(pub, 8, 5); // published while disconnected
    const second = subscribe(address, BigInt(applied.at(-1) as number), 9);
    await until(() => second.got.batches.length >= 6, 'replay');
    await publishBatches(pub, 13, 3);
    const b = await second.done;
    expect(Number(b.batches[0]?.sequence_number)).toBe(8);
    expect(b.epoch).toBe(a.epoch);
    apply(b.batches);
    expect(applied).toEqual(range(1, 16));
  });

  it('subscribers that join while batches are being published get every one, each time gRPC is taken up anew', async () => {
    // The server takes the stream in gRPC's format only while it has subscribers, so a drain
    // that was encoding when the first one joined has no gRPC payload: those batches must reach
    // it from the log. Events keep coming in several small publishes per turn (drains in flight).
    const { pub, address } = await node();
    let i = 0;
    let publishing = true;
    const publisher = (async () => {
      while (publishing) {
        for (let k = 0; k < 4; k++) pub.publish(batchEvents(i++));
        await new Promise((r) => setImmediate(r));
      }
    })();
    for (let round = 0; round < 6; round++) {
      await sleep(15);
      const start = pub.indexer.lastSeq + 1n;
      const sub = subscribe(address, start, 200);
      const got = await sub.done;
      expect(got.status).toBeUndefined();
      expect(seqsOf(got.batches)).toEqual(range(Number(start), 200));
      // The last subscriber is gone: the next round takes the format up again.
      await sleep(10);
    }
    publishing = false;
    await publisher;
  });

  it('16 concurrent subscribers each receive the full stream, the same bytes', async () => {
    const { pub, grpc, address } = await node();
    const subs = Array.from({ length: 16 }, () => subscribe(address, 0n, 30));
    // Every stream past its (empty) snapshot: at most 4 run at once, and one still waiting for
    // its turn when the first batch is published would take that batch as a snapshot instead.
    await until(
      () =>
        grpc.stats().subscribers === 16 &&
        grpc.stats().snapshotsPending === 0 &&
        subs.every((s) => s.got.epoch !== undefined),
      'subscribers',
    );
    await publishBatches(pub, 0, 30);
    const all = await Promise.all(subs.map((s) => s.done));
    const reference = JSON.stringify(all[0]?.batches);
    for (const got of all) {
      expect(seqsOf(got.batches)).toEqual(range(1, 30));
      expect(JSON.stringify(got.batches)).toBe(reference);
    }
    await until(() => grpc.stats().subscribers === 0, 'cancelled streams to end');
    expect(grpc.stats().batchesSent).toBe(16 * 30);
    expect(grpc.stats().subscribes.snapshot).toBe(16); // from 0, before anything was published
  });

  it('an expired or foreign cursor is OUT_OF_RANGE; next seq and in-log cursors replay', async () => {
    const { pub, grpc, address } = await node({ bufferSteps: 5 });
    await publishBatches(pub, 0, 12); // log holds 8..12
    const old = await subscribe(address, 3n, 1).done;
    expect(old.status?.code).toBe(status.OUT_OF_RANGE);
    expect(old.status?.details).toBe(
      'expired KV event replay cursor: requested sequence 3, oldest available sequence 8',
    );
    const foreign = await subscribe(address, 40n, 1).done;
    expect(foreign.status?.code).toBe(status.OUT_OF_RANGE);
    expect(foreign.status?.details).toContain('expired KV event replay cursor: requested sequence 40');
    const inLog = await subscribe(address, 8n, 5).done;
    expect(seqsOf(inLog.batches)).toEqual(range(8, 5));
    expectFullBlocks(inLog.batches);
    const next = subscribe(address, 13n, 2);
    await until(() => next.got.epoch !== undefined, 'metadata');
    await publishBatches(pub, 12, 2);
    expect(seqsOf((await next.done).batches)).toEqual([13, 14]);
    expect(grpc.stats().subscribes).toMatchObject({ expired: 2, replay: 2 });
  });

  it('a server without events answers UNIMPLEMENTED; a bad request INVALID_ARGUMENT', async () => {
    const off = await KvGrpcServer.create({ stream: null, host: '127.0.0.1' });
    cleanup.push(() => off.close());
    const got = await subscribe(`127.0.0.1:${off.port}`, 0n, 1, { engine: 'tokenspeed' }).done;
    expect(got.status?.code).toBe(status.UNIMPLEMENTED);

    const { address } = await node();
    const Raw = (await import('@grpc/grpc-js')).makeGenericClientConstructor(
      subscribeDefinition('vllm.grpc.engine.VllmEngine'),
      'raw',
    );
    const raw = new Raw(address, credentials.createInsecure());
    cleanup.push(() => raw.close());
    const code = await new Promise<number>((resolve) => {
      const call = (raw as unknown as Record<string, (r: Buffer) => ClientReadableStream<Buffer>>).SubscribeKvEvents?.(
        Buffer.from([0x08]),
      ) as ClientReadableStream<Buffer>;
      call.on('error', (e: { code: number }) => resolve(e.code));
      call.on('data', () => {});
    });
    expect(code).toBe(status.INVALID_ARGUMENT);
  });

  it('cuts a stalled subscriber off with RESOURCE_EXHAUSTED while the others keep up', async () => {
    const { pub, grpc, address } = await node({}, { maxLagBatches: 32 });
    const stalled = subscribe(address, 0n, 100_000);
    const live = Array.from({ length: 3 }, () => subscribe(address, 0n, 150));
    await until(() => grpc.stats().subscribers === 4 && stalled.got.epoch !== undefined, 'subscribers');
    const drops: Array<{ reason: string; details: string }> = [];
    grpc.on('drop', (d) => drops.push(d));
    stalled.call.pause(); // stops reading: HTTP/2 flow control backs up to the server
    // Big batches (1024 events of 4 blocks) fill the flow-control window fast.
    const big: KvEvent[] = Array.from({ length: 1024 }, (_, i) => ({
      type: 'stored',
      blockHashes: [BigInt(i * 4 + 1), BigInt(i * 4 + 2), BigInt(i * 4 + 3), BigInt(i * 4 + 4)],
      parentBlockHash: null,
      tokenIds: new Uint32Array(64).fill(i),
      blockSize: 16,
    }));
    let slowest = 0;
    let queued = 0;
    for (let i = 1; i <= 150; i++) {
      const s = performance.now();
      pub.publish(big);
      slowest = Math.max(slowest, performance.now() - s);
      await pub.flush();
      queued = Math.max(queued, grpc.stats().queuedBytes);
      // The live subscribers (decoding in this process) stay within a few batches of the head.
      await until(() => live.every((l) => l.got.batches.length >= i - 4), `live subscribers at ${i}`);
    }
    const got = await Promise.all(live.map((s) => s.done));
    for (const g of got) expect(seqsOf(g.batches)).toEqual(range(1, 150));
    await until(() => grpc.stats().cutOff === 1, 'the stalled subscriber to be cut off');
    expect(drops).toHaveLength(1);
    expect(drops[0]).toMatchObject({ reason: 'lag' });
    // What waited for the stalled peer was counted, and its queue went with it.
    expect(queued).toBeGreaterThan(32 * 64 * 1024);
    await until(() => grpc.stats().queuedBytes < queued / 4, 'the cut-off queue to be released');
    expect(slowest).toBeLessThan(100); // publish() enqueues; it never waits on a subscriber
    stalled.call.resume();
    const s = await stalled.done;
    expect(s.status?.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(s.batches.length).toBeLessThan(150);
    expect(seqsOf(s.batches)).toEqual(range(1, s.batches.length));
  });

  it('a resubscriber far behind that reads faster than live catches up without a cut-off', async () => {
    const { pub, grpc, address } = await node({}, { maxLagBatches: 32 });
    // ~40 KB batches: the HTTP/2 window holds only a few, so the reader's pace is what the server sees.
    const batch = (i: number): KvEvent[] =>
      Array.from({ length: 128 }, (_, j) => ({
        type: 'stored',
        blockHashes: [BigInt(i * 1000 + j * 4 + 1), BigInt(i * 1000 + j * 4 + 2)],
        parentBlockHash: null,
        tokenIds: new Uint32Array(32).fill(j),
        blockSize: 16,
      }));
    const behind = 400;
    for (let i = 0; i < behind; i++) {
      pub.publish(batch(i));
      await pub.flush(); // one batch each
    }
    const total = behind + 100;
    const slow = subscribe(address, 1n, total);
    // Reads at most one batch per 2 ms (~500/s); live publishes one per 10 ms (~100/s).
    slow.call.on('data', () => {
      slow.call.pause();
      setTimeout(() => slow.call.resume(), 2);
    });
    for (let i = behind; i < total; i++) {
      pub.publish(batch(i));
      await pub.flush();
      await sleep(10);
    }
    const got = await slow.done;
    expect(got.status).toBeUndefined();
    expect(seqsOf(got.batches)).toEqual(range(1, total));
    expect(grpc.stats().cutOff).toBe(0);
  }, 30_000);

  it('a catch-up the replay log turns over under is cut off, never streamed with a hole', async () => {
    const { pub, grpc, address } = await node({ bufferSteps: 64 }, { maxLagBatches: 32 });
    const big = (i: number): KvEvent[] =>
      Array.from({ length: 256 }, (_, j) => ({
        type: 'stored',
        blockHashes: [BigInt(i * 1000 + j + 1)],
        parentBlockHash: null,
        tokenIds: new Uint32Array(16).fill(j),
        blockSize: 16,
      }));
    for (let i = 0; i < 60; i++) {
      pub.publish(big(i));
      await pub.flush();
    }
    const slow = subscribe(address, 1n, 1_000);
    slow.call.pause(); // reads nothing: its catch-up waits on flow control
    await until(() => grpc.stats().subscribers === 1, 'the subscription');
    for (let i = 60; i < 300; i++) {
      pub.publish(big(i));
      await pub.flush();
    }
    slow.call.resume();
    const got = await slow.done;
    expect(got.status?.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(got.status?.details).toMatch(/fell behind the replay log/);
    expect(seqsOf(got.batches)).toEqual(range(1, got.batches.length));
    expect(grpc.stats().cutOff).toBe(1);
  }, 30_000);

  it('a rank that failed closed streams its clear, then FAILED_PRECONDITION with the layout reason', async () => {
    const { pub, address } = await node();
    const sub = subscribe(address, 0n, 100);
    await until(() => sub.got.epoch !== undefined, 'metadata');
    await publishBatches(pub, 0, 2);
    pub.publish([{ type: 'stored', blockHashes: [9n, 10n], tokenIds: new Uint32Array(20), blockSize: 16 }]);
    await pub.flush();
    const got = await sub.done;
    expect(seqsOf(got.batches)).toEqual([1, 2, 3]);
    expect(got.batches[2]?.events.map((e) => e.data)).toEqual(['cleared']);
    expect(got.status?.code).toBe(status.FAILED_PRECONDITION);
    expect(got.status?.details).toMatch(/^Unsupported BlockStored layout: /);
    const later = await subscribe(address, 0n, 1).done;
    expect(later.status?.code).toBe(status.FAILED_PRECONDITION);
    expect(later.status?.details).toMatch(/^Unsupported BlockStored layout: /);
  });

  it('checks a bearer token on gRPC and on the HTTP endpoints', async () => {
    const { pub, grpc, address } = await node({}, { authToken: 's3cret' });
    const http = await KvHttpServer.create({ publisher: pub, authToken: 's3cret', grpc });
    cleanup.push(() => http.close());
    const none = await subscribe(address, 0n, 1).done;
    expect(none.status?.code).toBe(status.UNAUTHENTICATED);
    const wrong = await subscribe(address, 0n, 1, { token: 'nope' }).done;
    expect(wrong.status?.code).toBe(status.UNAUTHENTICATED);
    const ok = subscribe(address, 0n, 2, { token: 's3cret' });
    await until(() => ok.got.epoch !== undefined, 'metadata');
    await publishBatches(pub, 0, 2);
    expect(seqsOf((await ok.done).batches)).toEqual([1, 2]);

    const denied = await fetch(`${http.url}/healthz`);
    expect(denied.status).toBe(401);
    expect(denied.headers.get('www-authenticate')).toBe('Bearer');
    const allowed = await fetch(`${http.url}/metrics`, { headers: { authorization: 'Bearer s3cret' } });
    expect(allowed.status).toBe(200);
    const text = await allowed.text();
    expect(text).toMatch(/kvplane_grpc_subscribes_total\{outcome="unauthenticated"\} 2/);
    expect(text).toMatch(/kvplane_grpc_batches_sent_total 2/);
    const py = await runGrpcPeer([address, 'vllm', '0', '1', 'nope']);
    expect(py.at(-1)).toMatchObject({ status: 'UNAUTHENTICATED' });
  });

  it('serves TLS', async () => {
    const cert = readFileSync(repoPath('fixtures/tls/cert.pem'));
    const key = readFileSync(repoPath('fixtures/tls/key.pem'));
    const { pub, grpc } = await node({}, { tls: { cert, key } });
    const sub = subscribe(`localhost:${grpc.port}`, 0n, 2, { creds: credentials.createSsl(cert) });
    await until(() => sub.got.epoch !== undefined, 'metadata');
    await publishBatches(pub, 0, 2);
    expect(seqsOf((await sub.done).batches)).toEqual([1, 2]);
    const plain = await subscribe(`127.0.0.1:${grpc.port}`, 0n, 1).done;
    expect(plain.status?.code).toBe(status.UNAVAILABLE);
  });
});
