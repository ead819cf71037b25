import { execFile, execFileSync, spawn } from 'node:child_process';
import { createServer as createNetServer, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import {
  type Client,
  type ClientReadableStream,
  credentials,
  Metadata,
  makeGenericClientConstructor,
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceError,
  type sendUnaryData,
  status,
} from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import {
  ENGINE_METHODS,
  encodeSubscribeRequest,
  type KvEvent,
  KvEventPublisher,
  KvGrpcServer,
  type KvGrpcServerOptions,
  rawMethod,
  subscribeDefinition,
} from '../src/index.js';
import native from '../src/native.js';
import { FROM_SEQ_1, freePort, repoPath, runGrpcPeer, sleep, storedBlock as stored, until } from './fixtures.js';

// SMG's side of a worker (docs/protocol.md#snapshots, #grpc-upstream): snapshots for a
// subscriber from 0, OUT_OF_RANGE for an expired cursor, HealthCheck, and the engine's other RPCs
// forwarded to its own gRPC server.

const execFileAsync = promisify(execFile);
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const VLLM = 'vllm.grpc.engine.VllmEngine';

async function node(
  grpcOpts: Partial<KvGrpcServerOptions> = {},
  pubOpts: Record<string, unknown> = {},
): Promise<{ pub: KvEventPublisher; grpc: KvGrpcServer; address: string }> {
  const pub = await KvEventPublisher.create({
    endpoint: 'tcp://127.0.0.1:*',
    dataParallelRank: 0,
    ...FROM_SEQ_1,
    ...pubOpts,
  });
  cleanup.push(() => pub.close());
  const grpc = await KvGrpcServer.create({ stream: pub.stream, host: '127.0.0.1', ...grpcOpts });
  cleanup.push(() => grpc.close());
  return { pub, grpc, address: `127.0.0.1:${grpc.port}` };
}

/** 14 blocks on rank 0 in 14 batches: a chain 1..10 and a branch 100..103 from block 5. */
async function publishState(pub: KvEventPublisher): Promise<void> {
  const one = async (e: KvEvent) => {
    pub.publish([e]);
    await pub.flush(); // a batch of its own
  };
  for (let h = 1; h <= 10; h++) await one(stored(h, h === 1 ? null : h - 1));
  for (let h = 100; h <= 103; h++) await one(stored(h, h === 100 ? 5 : h - 1));
}

interface PeerBatch {
  seq: string;
  dp_rank: number | null;
  events: Array<{
    type: string;
    block_hashes?: string[];
    parent_block_hash?: string;
    token_ids?: number[];
    event_id: string;
  }>;
  snapshot?: { index: number; count: number; blocks: number };
}

describe('SubscribeKvEvents from 0: the index as snapshot chunks, then live', () => {
  it.each([
    [1, 14],
    [3, 5],
    [4096, 1],
  ])(
    'chunks of %i blocks (%i chunks) hold the tree dump, numbered up to the cut, then live with no gap or duplicate',
    async (blocks, count) => {
      const { pub, grpc, address } = await node({ snapshotChunkBlocks: blocks });
      await publishState(pub);
      const dump = await pub.indexer.dumpTree();
      // SMG's client: grpcio with smg-grpc-proto's stubs, from 0, as SMG 1.13 subscribes.
      const peer = runGrpcPeer([address, 'vllm', '0', String(count + 3)]);
      await until(() => grpc.stats().subscribers === 1, 'the subscription');
      await sleep(200);
      for (const e of [stored(200, null), stored(201, 200), { type: 'removed', blockHashes: [201n] } as KvEvent]) {
        pub.publish([e]);
        await pub.flush();
      }
      const lines = await peer;
      const batches = lines.slice(1) as unknown as PeerBatch[];
      const chunks = batches.slice(0, count);
      expect(chunks.map((b) => Number(b.seq))).toEqual(Array.from({ length: count }, (_, i) => 14 - count + 1 + i));
      expect(chunks.map((b) => b.snapshot)).toEqual(chunks.map((_, i) => ({ index: i, count, blocks: 14 })));
      expect(chunks.every((b) => b.dp_rank === 0)).toBe(true);
      const events = chunks.flatMap((b) => b.events);
      expect(events[0]?.type).toBe('cleared');
      expect(events.every((e) => e.event_id === '0')).toBe(true);
      // Parents before children, every block of the dump once, with its tokens.
      const seen = new Set<string>();
      const tokens = new Map<string, number[]>();
      for (const e of events.slice(1)) {
        expect(e.type).toBe('stored');
        if (e.parent_block_hash !== undefined) expect(seen.has(e.parent_block_hash)).toBe(true);
        (e.block_hashes ?? []).forEach((h, i) => {
          seen.add(h);
          tokens.set(h, (e.token_ids ?? []).slice(i * 16, (i + 1) * 16));
        });
      }
      const dumped = dump.workers.flatMap((w) => w.events.flatMap((e) => [...(e.blockHashes ?? [])].map(String)));
      expect([...seen].sort()).toEqual(dumped.sort());
      expect(tokens.get('103')).toEqual(Array(16).fill(103));
      // Then live, from the seq after the cut.
      expect(batches.slice(count).map((b) => [Number(b.seq), b.snapshot, b.events.map((e) => e.type)])).toEqual([
        [15, undefined, ['stored']],
        [16, undefined, ['stored']],
        [17, undefined, ['removed']],
      ]);
      expect(grpc.stats().subscribes.snapshot).toBe(1);
    },
    30_000,
  );

  it('an expired cursor is OUT_OF_RANGE with the expired-cursor message; from 0 the router gets the state again', async () => {
    const { pub, address } = await node({}, { bufferSteps: 3 });
    await publishState(pub);
    const expired = await runGrpcPeer([address, 'trtllm', '2', '1']);
    expect(expired.at(-1)).toMatchObject({ status: 'OUT_OF_RANGE' });
    expect(String(expired.at(-1)?.details)).toContain(
      'expired KV event replay cursor: requested sequence 2, oldest available sequence 12',
    );
    // SMG's resync: resubscribe from 0 and take the snapshot.
    const again = (await runGrpcPeer([address, 'trtllm', '0', '1'])).slice(1) as unknown as PeerBatch[];
    expect(again[0]?.snapshot).toEqual({ index: 0, count: 1, blocks: 14 });
  }, 30_000);

  it('a snapshot of nothing is live only; of an emptied index, one whole-node clear', async () => {
    const { pub, address } = await node();
    const peer = runGrpcPeer([address, 'vllm', '0', '1']);
    await sleep(500);
    pub.publish([stored(1, null)]);
    await pub.flush();
    const first = (await peer).slice(1) as unknown as PeerBatch[];
    expect(first.map((b) => [b.seq, b.snapshot])).toEqual([['1', undefined]]);
    pub.publish([{ type: 'removed', blockHashes: [1n] }]);
    await pub.flush();
    const empty = (await runGrpcPeer([address, 'vllm', '0', '1'])).slice(1) as unknown as PeerBatch[];
    expect(empty).toEqual([
      {
        seq: '2',
        dp_rank: null,
        events: [{ type: 'cleared', event_id: '0' }],
        snapshot: { index: 0, count: 1, blocks: 0 },
      },
    ]);
  }, 30_000);
});

describe('snapshots in progress are bounded', () => {
  it('beyond maxSnapshots a subscriber from 0 waits, its stream open, and is served once one ends', async () => {
    const { pub, grpc, address } = await node({ maxSnapshots: 1, snapshotChunkBlocks: 256 });
    // 200,000 blocks: about 14 MB of snapshot, far more than the stream's buffers and windows.
    for (let b = 0; b < 200; b++) {
      const blockHashes = Array.from({ length: 1000 }, (_, i) => BigInt(b * 1000 + i + 1));
      const tokenIds = Uint32Array.from({ length: 16_000 }, (_, i) => b * 16_000 + i);
      pub.publish([{ type: 'stored', blockHashes, parentBlockHash: null, tokenIds, blockSize: 16 }]);
      await pub.flush();
    }
    // A subscriber that takes its first chunk and then stops reading: its snapshot stays in progress.
    const Client = makeGenericClientConstructor(subscribeDefinition(VLLM), 'kv');
    const client = new Client(address, credentials.createInsecure());
    cleanup.push(() => client.close());
    const stalled = (
      client as unknown as Record<string, (r: Buffer) => ClientReadableStream<Buffer>>
    ).SubscribeKvEvents?.(encodeSubscribeRequest(0n)) as ClientReadableStream<Buffer>;
    stalled.on('error', () => {});
    await new Promise<void>((r) => stalled.once('data', () => r()));
    stalled.pause();
    let waited = false;
    const waiting = runGrpcPeer([address, 'vllm', '0', '1']).then((lines) => {
      waited = true;
      return lines;
    });
    await until(() => grpc.stats().subscribes.snapshotBusy === 1, 'the second subscriber to wait');
    await sleep(500);
    expect(waited).toBe(false);
    expect(grpc.stats().subscribers).toBe(2);
    stalled.cancel();
    const served = (await waiting).slice(1) as unknown as PeerBatch[];
    expect(served[0]?.snapshot).toMatchObject({ index: 0, blocks: 200_000 });
    expect(grpc.stats().subscribes).toMatchObject({ snapshot: 2, snapshotBusy: 1 });
  }, 30_000);
});

describe('HealthCheck', () => {
  it('answers on every engine service, or only on the one named; unhealthy with the reason', async () => {
    const { address } = await node();
    for (const service of ['vllm', 'sglang', 'tokenspeed']) {
      expect(await runGrpcPeer(['health', address, service])).toEqual([{ healthy: true, message: '' }]);
    }
    expect(await runGrpcPeer(['health', address, 'trtllm'])).toEqual([{ status: 'OK' }]);
    let healthy = false;
    const one = await node({ services: [VLLM], health: () => ({ healthy, message: 'source disconnected' }) });
    expect(await runGrpcPeer(['health', one.address, 'vllm'])).toEqual([
      { healthy: false, message: 'source disconnected' },
    ]);
    expect(await runGrpcPeer(['health', one.address, 'sglang'])).toMatchObject([{ code: 'UNIMPLEMENTED' }]);
    healthy = true;
    expect(await runGrpcPeer(['health', one.address, 'vllm'])).toEqual([
      { healthy: true, message: 'source disconnected' },
    ]);
  }, 30_000);
});

/** The engine's own gRPC server: the vLLM servicer's RPCs as bytes, with what each call saw. */
async function upstreamEngine(port = 0): Promise<{
  address: string;
  server: Server;
  seen: Array<{ method: string; header: string | undefined; auth: string | undefined }>;
  cancelled: string[];
}> {
  // Any message size, as vLLM's own server.
  const server = new Server({ 'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1 });
  const seen: Array<{ method: string; header: string | undefined; auth: string | undefined }> = [];
  const cancelled: string[] = [];
  const note = (method: string, md: Metadata) =>
    seen.push({ method, header: md.get('x-request-tag')[0]?.toString(), auth: md.get('authorization')[0]?.toString() });
  const def: Record<string, ReturnType<typeof rawMethod>> = {};
  for (const m of ENGINE_METHODS[VLLM] ?? [])
    def[m.name] = rawMethod(`/${VLLM}/${m.name}`, m.requestStream, m.responseStream);
  const trailer = () => {
    const md = new Metadata();
    md.set('x-engine-trailer', 'yes');
    return md;
  };
  server.addService(def, {
    // Unary: echoes the request bytes reversed, with a header and a trailer.
    GetModelInfo: (call: ServerUnaryCall<Buffer, Buffer>, cb: sendUnaryData<Buffer>) => {
      note('GetModelInfo', call.metadata);
      const md = new Metadata();
      md.set('x-engine-header', 'model');
      call.sendMetadata(md);
      cb(null, Buffer.from(call.request).reverse(), trailer());
    },
    HealthCheck: (call: ServerUnaryCall<Buffer, Buffer>, cb: sendUnaryData<Buffer>) => {
      note('HealthCheck', call.metadata);
      cb(null, Buffer.from([0x08, 0x01, 0x12, 0x06, ...Buffer.from('engine')])); // healthy, "engine"
    },
    Abort: (call: ServerUnaryCall<Buffer, Buffer>, cb: sendUnaryData<Buffer>) => {
      note('Abort', call.metadata);
      cb({ code: status.NOT_FOUND, details: 'no such request', metadata: trailer() } as ServiceError);
    },
    // Never answers: for deadlines and cancellation.
    GetLoads: (call: ServerUnaryCall<Buffer, Buffer>) => {
      note('GetLoads', call.metadata);
      call.on('cancelled', () => cancelled.push('GetLoads'));
    },
    // Server streaming: the request's first byte says how many responses, 10 ms apart.
    Generate: (call: ServerWritableStream<Buffer, Buffer>) => {
      note('Generate', call.metadata);
      const n = call.request[0] ?? 0;
      let i = 0;
      const timer = setInterval(() => {
        if (i === n) {
          clearInterval(timer);
          call.end(trailer());
          return;
        }
        call.write(Buffer.from([i++]));
      }, 10);
      call.on('cancelled', () => {
        clearInterval(timer);
        cancelled.push('Generate');
      });
    },
  });
  const bound = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`127.0.0.1:${port}`, ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  cleanup.push(() => server.forceShutdown());
  return { address: `127.0.0.1:${bound}`, server, seen, cancelled };
}

/** A client of the vLLM service's RPCs with bytes both ways. */
function engineClient(address: string): Client & Record<string, (...args: unknown[]) => unknown> {
  const def: Record<string, ReturnType<typeof rawMethod>> = {};
  for (const m of ENGINE_METHODS[VLLM] ?? [])
    def[m.name] = rawMethod(`/${VLLM}/${m.name}`, m.requestStream, m.responseStream);
  const Ctor = makeGenericClientConstructor(def, 'VllmEngine');
  const c = new Ctor(address, credentials.createInsecure(), {
    'grpc.max_receive_message_length': -1,
  }) as unknown as Client & Record<string, (...args: unknown[]) => unknown>;
  cleanup.push(() => c.close());
  return c;
}

function unary(
  c: ReturnType<typeof engineClient>,
  method: string,
  req: Buffer,
  md = new Metadata(),
  deadlineMs?: number,
): Promise<{ err: ServiceError | null; reply?: Buffer; header?: Metadata; trailer?: Metadata }> {
  return new Promise((resolve) => {
    let header: Metadata | undefined;
    let trailer: Metadata | undefined;
    const opts = deadlineMs === undefined ? {} : { deadline: Date.now() + deadlineMs };
    const call = c[method]?.(req, md, opts, (err: ServiceError | null, reply?: Buffer) =>
      setImmediate(() => resolve({ err, reply, header, trailer })),
    ) as { on(ev: string, f: (x: unknown) => void): void };
    call.on('metadata', (m) => {
      header = m as Metadata;
    });
    call.on('status', (s) => {
      trailer = (s as { metadata: Metadata }).metadata;
    });
  });
}

describe('--grpc-upstream: the engine’s own RPCs through kvplane', () => {
  it('forwards unary and streaming calls as bytes, with metadata, status, cancellation and deadlines', async () => {
    const engine = await upstreamEngine();
    // (No load records: the GetLoads seen here are the caller's only.)
    const { address } = await node({ upstream: engine.address, services: [VLLM], loadPollMs: 0 });
    const c = engineClient(address);
    const md = new Metadata();
    md.set('x-request-tag', 'r1');
    const info = await unary(c, 'GetModelInfo', Buffer.from([1, 2, 3]), md);
    expect(info.err).toBeNull();
    expect([...(info.reply ?? [])]).toEqual([3, 2, 1]);
    expect(info.header?.get('x-engine-header')).toEqual(['model']);
    expect(info.trailer?.get('x-engine-trailer')).toEqual(['yes']);
    expect(engine.seen[0]).toEqual({ method: 'GetModelInfo', header: 'r1', auth: undefined });

    const abort = await unary(c, 'Abort', Buffer.alloc(0));
    expect([abort.err?.code, abort.err?.details]).toEqual([status.NOT_FOUND, 'no such request']);
    expect(abort.err?.metadata.get('x-engine-trailer')).toEqual(['yes']);

    // Server streaming, in order, to its end.
    const got: number[] = [];
    const stream = c.Generate?.(Buffer.from([5]), new Metadata()) as ClientReadableStream<Buffer>;
    await new Promise<void>((resolve, reject) => {
      stream.on('data', (d: Buffer) => got.push(d[0] as number));
      stream.on('end', () => resolve());
      stream.on('error', reject);
    });
    expect(got).toEqual([0, 1, 2, 3, 4]);

    // Cancelled by the caller: the engine's call is cancelled too.
    const long = c.Generate?.(Buffer.from([200]), new Metadata()) as ClientReadableStream<Buffer>;
    long.on('error', () => {});
    await new Promise<void>((resolve) => long.once('data', () => resolve()));
    long.cancel();
    await until(() => engine.cancelled.includes('Generate'), 'the engine call cancelled');

    // The caller's deadline reaches the engine.
    const t0 = Date.now();
    const slow = await unary(c, 'GetLoads', Buffer.alloc(0), new Metadata(), 300);
    expect(slow.err?.code).toBe(status.DEADLINE_EXCEEDED);
    expect(Date.now() - t0).toBeLessThan(2000);
    await until(() => engine.cancelled.includes('GetLoads'), 'the engine call ended by its deadline');
  }, 30_000);

  it('passes on every message of a stream before its status, to a caller reading slower than the engine writes', async () => {
    // SMG's vLLM servicer stand-in streaming 300 tokens at once, a grpcio caller (both Python).
    const engine = await standInEngine('--output-tokens', '300', '--token-delay-ms', '0');
    const { address } = await node({ upstream: engine, services: [VLLM], loadPollMs: 0 });
    const rounds = await runGrpcPeer(['generate', address, 'hello world', '300', '20']);
    // Before, most lost their last chunks and the GenerateComplete (held while the caller's side
    // was full when the engine's status came) and still ended OK.
    expect(rounds).toEqual(Array(20).fill({ chunks: 300, complete: true }));
  }, 60_000);

  it('passes on every message an engine sent before it failed the stream, then its error status', async () => {
    // 300 tokens at once, then INTERNAL: as straight from the engine, the caller gets all 300.
    const engine = await standInEngine('--output-tokens', '400', '--token-delay-ms', '0', '--fail-after', '300');
    const { address } = await node({ upstream: engine, services: [VLLM], loadPollMs: 0 });
    const direct = await runGrpcPeer(['generate', engine, 'hello world', '400', '2']);
    const rounds = await runGrpcPeer(['generate', address, 'hello world', '400', '20']);
    const failed = { chunks: 300, code: 'INTERNAL', details: 'engine failed after 300 chunks' };
    expect(direct).toEqual(Array(2).fill(failed));
    // Before, grpc-js dropped the responses it held for a paused stream when the error came: a
    // third to two-thirds of them were lost.
    expect(rounds).toEqual(Array(20).fill(failed));
  }, 60_000);

  it('fails forwarded calls UNAVAILABLE after 20 s when the engine took the connection but never answers (a frozen engine)', async () => {
    // A port whose kernel accepts and whose process says nothing: grpc-js waits for its HTTP/2
    // settings without a bound.
    const sockets: Socket[] = [];
    const silent = createNetServer((sock) => {
      sockets.push(sock);
      sock.on('error', () => {});
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    cleanup.push(() => {
      for (const sock of sockets) sock.destroy();
      return new Promise((r) => silent.close(r));
    });
    const port = (silent.address() as { port: number }).port;
    const { address } = await node({ upstream: `127.0.0.1:${port}`, services: [VLLM], loadPollMs: 0 });
    const c = engineClient(address);
    const t0 = Date.now();
    const firstCall = unary(c, 'GetModelInfo', Buffer.from([1]));
    // Meanwhile, a node closing while a call of its waits: UNAVAILABLE at once, and nothing thrown
    // later (the call started on the closed channel, and the process died).
    const other = await node({ upstream: `127.0.0.1:${port}`, services: [VLLM], loadPollMs: 0 });
    const waiting = unary(engineClient(other.address), 'GetModelInfo', Buffer.from([1]));
    await sleep(1000);
    const closedAt = Date.now();
    await other.grpc.close();
    const ended = await waiting;
    expect([ended.err?.code, ended.err?.details]).toEqual([status.UNAVAILABLE, 'kvplane is shutting down']);
    expect(Date.now() - closedAt).toBeLessThan(1000);
    const first = await firstCall;
    expect([first.err?.code, first.err?.details]).toEqual([
      status.UNAVAILABLE,
      `the engine at 127.0.0.1:${port} took the connection but has not answered in 20 s`,
    ]);
    expect(Date.now() - t0).toBeGreaterThan(19_000);
    expect(Date.now() - t0).toBeLessThan(24_000);
    // The same attempt: the next call does not wait another 20 s.
    const t1 = Date.now();
    expect((await unary(c, 'GetModelInfo', Buffer.from([1]))).err?.code).toBe(status.UNAVAILABLE);
    expect(Date.now() - t1).toBeLessThan(1000);
  }, 40_000);

  it('ends forwarded calls still in flight 2 s into a shutdown with UNAVAILABLE (retried elsewhere), not CANCELLED', async () => {
    const engine = await upstreamEngine();
    const { grpc, address } = await node({ upstream: engine.address, services: [VLLM], loadPollMs: 0 });
    const c = engineClient(address);
    // A unary call the engine never answers, and a stream of 250 responses 10 ms apart.
    const hung = unary(c, 'GetLoads', Buffer.alloc(0));
    const stream = c.Generate?.(Buffer.from([250]), new Metadata()) as ClientReadableStream<Buffer>;
    const streamEnd = new Promise<number>((resolve) => {
      stream.on('data', () => {});
      stream.on('error', (e: ServiceError) => resolve(e.code));
      stream.on('end', () => resolve(status.OK));
    });
    await new Promise<void>((resolve) => stream.once('data', () => resolve()));
    const t0 = Date.now();
    await grpc.close();
    expect(Date.now() - t0).toBeLessThan(3000);
    expect((await hung).err?.code).toBe(status.UNAVAILABLE);
    expect(await streamEnd).toBe(status.UNAVAILABLE);
    await until(
      () => engine.cancelled.includes('GetLoads') && engine.cancelled.includes('Generate'),
      'engine calls cancelled',
    );
  }, 30_000);

  it('answers gRPC’s standard health check as HealthCheck: SMG’s own check sees an engine that is down', async () => {
    // smg serve's worker check (smg.serve._grpc_health_check: grpc.health.v1, falling back to
    // "the channel connects" on UNIMPLEMENTED).
    // (Run apart: this process serves the node.)
    const smgCheck = async (address: string) =>
      (
        await execFileAsync('python3', [
          '-c',
          'import sys; from smg.serve import _grpc_health_check as c; print(c("127.0.0.1", int(sys.argv[1]), 3.0))',
          address.split(':')[1] as string,
        ])
      ).stdout.trim();
    // Down: before, kvplane's UNIMPLEMENTED made SMG fall back to a channel that connects.
    const port = await freePort();
    const front = await node({ upstream: `127.0.0.1:${port}`, services: [VLLM], loadPollMs: 0 });
    expect(await smgCheck(front.address)).toBe('False');
    // Up: the engine's own answer (this one serves no grpc.health.v1: SMG's fallback).
    await upstreamEngine(port);
    const c = engineClient(front.address);
    for (let i = 0; i < 100 && (await unary(c, 'GetModelInfo', Buffer.from([1]))).err !== null; i++) await sleep(50);
    expect(await smgCheck(front.address)).toBe('True');
    // Without an upstream: SERVING while kvplane is healthy, NOT_SERVING when it is not.
    let healthy = true;
    const own = await node({ loadPollMs: 0, health: () => ({ healthy, message: 'source down' }) });
    expect(await smgCheck(own.address)).toBe('True');
    healthy = false;
    expect(await smgCheck(own.address)).toBe('False');
    // With a bearer token: the standard check needs none (SMG's, like Kubernetes' probes, sends
    // none), HealthCheck still does.
    const guarded = await node({ loadPollMs: 0, authToken: 's3cret' });
    expect(await smgCheck(guarded.address)).toBe('True');
    expect(await runGrpcPeer(['health', guarded.address, 'vllm'])).toMatchObject([{ code: 'UNAUTHENTICATED' }]);
  }, 30_000);

  it('forwards requests larger than 4 MiB, and reaches an engine that comes up late within a second', async () => {
    const port = await freePort();
    const { address } = await node({ upstream: `127.0.0.1:${port}`, services: [VLLM], loadPollMs: 0 });
    const c = engineClient(address);
    // Down for 6 s (an engine loading its model): calls are UNAVAILABLE meanwhile.
    const t0 = Date.now();
    while (Date.now() - t0 < 6000) {
      expect((await unary(c, 'GetModelInfo', Buffer.from([1]))).err?.code).toBe(status.UNAVAILABLE);
      await sleep(200);
    }
    await upstreamEngine(port);
    const up = Date.now();
    let answered = false;
    while (!answered && Date.now() - up < 10_000) {
      answered = (await unary(c, 'GetModelInfo', Buffer.from([1]))).err === null;
      if (!answered) await sleep(50);
    }
    // grpc-js's own backoff (1 s growing 1.6 times) would have waited until about 9.3 s.
    expect(Date.now() - up).toBeLessThan(1500);
    // 5 MiB each way (an inline image); kvplane's own receive limit was 4 MiB.
    const big = Buffer.alloc(5 * 1024 * 1024, 7);
    big[0] = 1;
    const echo = await unary(c, 'GetModelInfo', big);
    expect(echo.err).toBeNull();
    expect([echo.reply?.length, echo.reply?.at(-1)]).toEqual([big.length, 1]);
  }, 30_000);

  it('HealthCheck goes to the engine while kvplane is healthy; an engine that is down is UNAVAILABLE while SubscribeKvEvents keeps serving', async () => {
    const engine = await upstreamEngine();
    let healthy = true;
    const { pub, address } = await node({
      upstream: engine.address,
      loadPollMs: 0, // this engine never answers GetLoads
      health: () => ({ healthy, message: 'KV event source vllm: disconnected' }),
    });
    expect(await runGrpcPeer(['health', address, 'vllm'])).toEqual([{ healthy: true, message: 'engine' }]);
    // The engine serves only its own service: SMG learns the engine type from that.
    expect(await runGrpcPeer(['health', address, 'sglang'])).toMatchObject([{ code: 'UNIMPLEMENTED' }]);
    healthy = false;
    expect(await runGrpcPeer(['health', address, 'vllm'])).toEqual([
      { healthy: false, message: 'KV event source vllm: disconnected' },
    ]);
    healthy = true;

    engine.server.forceShutdown();
    const c = engineClient(address);
    const down = await unary(c, 'GetModelInfo', Buffer.from([1]));
    expect(down.err?.code).toBe(status.UNAVAILABLE);
    await publishState(pub);
    const batches = (await runGrpcPeer([address, 'vllm', '0', '1'])).slice(1) as unknown as PeerBatch[];
    expect(batches[0]?.snapshot).toEqual({ index: 0, count: 1, blocks: 14 });
  }, 30_000);

  it('with a bearer token, proxied calls need it and it is not passed to the engine', async () => {
    const engine = await upstreamEngine();
    const { address } = await node({ upstream: engine.address, services: [VLLM], authToken: 's3cret', loadPollMs: 0 });
    const c = engineClient(address);
    const none = await unary(c, 'GetModelInfo', Buffer.from([1]));
    expect(none.err?.code).toBe(status.UNAUTHENTICATED);
    const md = new Metadata();
    md.set('authorization', 'Bearer s3cret');
    const ok = await unary(c, 'GetModelInfo', Buffer.from([1]), md);
    expect(ok.err).toBeNull();
    expect(engine.seen.at(-1)).toEqual({ method: 'GetModelInfo', header: undefined, auth: undefined });
  }, 30_000);
});

/** SMG's vLLM servicer stand-in (scripts/smg_engine.py, grpcio on smg-grpc-proto): its address. */
async function standInEngine(...args: string[]): Promise<string> {
  const proc = spawn('python3', [
    repoPath('scripts/smg_engine.py'),
    ...['--max-num-seqs', '96', '--num-blocks', '512', ...args],
  ]);
  cleanup.push(() => proc.kill('SIGKILL'));
  const first = await new Promise<string>((resolve, reject) => {
    createInterface({ input: proc.stdout }).once('line', resolve);
    proc.once('exit', (code) => reject(new Error(`smg_engine.py exited ${code}`)));
  });
  return (JSON.parse(first) as { grpc: string }).grpc;
}

interface LoadBatch extends PeerBatch {
  load?: Record<string, unknown>;
}

describe('load records: the engine’s GetLoads as EngineLoad on the stream', () => {
  it('reads each engine’s SchedulerLoad by its own field numbers (vLLM, SGLang, TokenSpeed), as the official runtime writes and reads them', async () => {
    const peer = (...args: string[]) =>
      JSON.parse(execFileSync('python3', [repoPath('scripts/loads_peer.py'), ...args], { encoding: 'utf8' }));
    // What every engine reports (rank 1 adds 1 to its counts), and what only some have.
    const common = {
      running_requests: 4,
      waiting_requests: 5,
      waiting_uncached_tokens: 901,
      token_usage: 0.25,
      gen_throughput: 99.5,
      max_running_requests: 256,
      age_ms: 40,
      sample: '3',
      load_only: true,
      cache_hit_rate: 0.5,
      num_used_tokens: 5001,
      max_total_num_tokens: 6000,
    };
    const memory = { weight_gb: 1.5, token_capacity: 7 };
    const queues = { waiting: 2, paused: 1 };
    const want: Record<string, Record<string, unknown>> = {
      [VLLM]: common,
      'sglang.grpc.scheduler.SglangScheduler': {
        ...common,
        memory,
        queues,
        speculative: { accept_rate: 0.875 },
        lora: { slots_used: 1 },
        disaggregation: { mode: 'prefill' },
      },
      'tokenspeed.grpc.scheduler.TokenSpeedScheduler': { ...common, memory, queues, active_token_usage: 0.125 },
    };
    for (const [service, record] of Object.entries(want)) {
      const engine = service.split('.')[0] as string;
      const answer = Buffer.from(peer('answer', engine).hex, 'hex');
      const loads = new native.NativeEngineLoads(answer, service);
      expect(loads.ranks).toEqual([0, 1]);
      const rank1 = loads.loadOnly(9n, 1.0, 3n, 40, true)[1] as Buffer;
      expect([service, peer('record', rank1.toString('hex'))]).toEqual([service, record]);
    }
    expect(() => new native.NativeEngineLoads(Buffer.alloc(0), 'trtllm.TrtllmService')).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
  });

  it('attaches each batch’s record, keeps an idle stream’s load current with load_only batches, and sends early ones only to a peer that asks', async () => {
    const engine = await standInEngine();
    const { pub, grpc, address } = await node({ upstream: engine, services: [VLLM], loadPollMs: 100 });
    await until(() => (grpc.stats().loads?.polls ?? 0) >= 1, 'a GetLoads answer');
    expect(grpc.stats().loads?.service).toBe(VLLM);
    // The stand-in's numbers (idle): 96 running at most, 512 blocks of 16 tokens.
    const telemetry = { max_total_num_tokens: 512 * 16 };

    // Nothing published yet: a peer asking for early records gets load_only batches numbered 0.
    const early = (await runGrpcPeer([address, 'vllm', '0+loads', '2'])).slice(1) as unknown as LoadBatch[];
    for (const b of early) {
      expect(b).toMatchObject({ seq: '0', dp_rank: 0, events: [] });
      expect(b.load).toMatchObject({ max_running_requests: 96, load_only: true, ...telemetry });
    }
    expect(early.map((b) => b.load?.sample)).toEqual(['1', '2']);

    // A peer that does not ask gets nothing before the first batch, which carries the first
    // record (with the telemetry); then load_only batches repeat that batch's seq.
    const plain = runGrpcPeer([address, 'vllm', '0', '3']);
    await sleep(500);
    pub.publish([stored(1, null)]);
    await pub.flush();
    const got = (await plain).slice(1) as unknown as LoadBatch[];
    expect(got[0]).toMatchObject({ seq: '1', dp_rank: 0, events: [{ type: 'stored', block_hashes: ['1'] }] });
    expect(got[0]?.load).toMatchObject({ max_running_requests: 96, sample: '1', ...telemetry });
    expect(got[0]?.load?.load_only).toBeUndefined();
    for (const b of got.slice(1)) {
      expect(b).toMatchObject({ seq: '1', dp_rank: 0, events: [] });
      expect(b.load).toMatchObject({ load_only: true, ...telemetry });
    }
    expect(got.map((b) => b.load?.sample)).toEqual(['1', '2', '3']);
    expect(grpc.stats().loadOnlySent).toBeGreaterThanOrEqual(4);
  }, 30_000);

  it('sends no records without an upstream', async () => {
    const { pub, grpc, address } = await node({ services: [VLLM], loadPollMs: 100 });
    const peer = runGrpcPeer([address, 'vllm', '0+loads', '1']);
    await sleep(400);
    pub.publish([stored(1, null)]);
    await pub.flush();
    const [b] = (await peer).slice(1) as unknown as LoadBatch[];
    expect(b).toMatchObject({ seq: '1', events: [{ type: 'stored' }] });
    expect(b?.load).toBeUndefined();
    expect(grpc.stats()).toMatchObject({ loads: null, loadOnlySent: 0 });
  }, 30_000);
});
