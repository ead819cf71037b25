import { execFileSync } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { type ClientReadableStream, credentials, makeGenericClientConstructor } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { Publisher, Subscriber } from 'zeromq';
import {
  decodeBatch,
  encodeBatch,
  encodeSubscribeRequest,
  KvEventPublisher,
  subscribeDefinition,
} from '../src/index.js';
import {
  engineRanks,
  freePort,
  relayed,
  runGrpcPeer,
  serveNode,
  sleep,
  storedBlock as stored,
  until,
} from './fixtures.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/**
 * An engine-side publisher in vLLM's wire format with replay. It numbers from 1 (vLLM from 0), so
 * a relay joining it finds no seq 0 in its replay: it clears the rank once, as it would for an
 * engine whose replay buffer no longer holds its first batches.
 */
async function enginePublisher(rank: number | null = null): Promise<KvEventPublisher> {
  const pub = await KvEventPublisher.create({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: 'tcp://127.0.0.1:*',
    firstSeq: 1n,
    openWithClear: false,
    dataParallelRank: rank,
  });
  cleanup.push(() => pub.close());
  return pub;
}

/** A node relaying the drains of `server` (a stand-in for trtllm-serve), 2 attention-DP ranks. */
async function trtllmHttpNode(server: Server) {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanup.push(() => new Promise((r) => server.close(r)));
  const { port } = server.address() as { port: number };
  const url = `http://127.0.0.1:${port}`;
  return relayNode(['--engine', 'trtllm', '--engine-url', url, '--engine-poll-ms', '20', '--engine-dp-size', '2']);
}

/**
 * `kvplane serve --engine ENGINE` relaying `engineArgs`, with its HTTP server; its HTTP base URL
 * once its subscriptions have had time to connect.
 */
async function relayNode(engineArgs: string[]): Promise<{ http: string; node: Awaited<ReturnType<typeof serveNode>> }> {
  const node = await serveNode([...engineArgs, '--http-port', '0'], cleanup);
  await sleep(300);
  return { http: node.serving.http as string, node };
}

/** `--engine vllm` relaying `engine` and its replay socket. */
function vllmArgs(engine: KvEventPublisher, ...extra: string[]): string[] {
  const replay = engine.replayEndpoint as string;
  return ['--engine', 'vllm', '--engine-endpoint', engine.endpoint, '--engine-replay-endpoint', replay, ...extra];
}

interface Dump {
  TreeDump: { workers: Array<{ dp_rank: number; events: Array<{ block_hashes: number[] }> }> };
}

/** Rank 0 of the relay's engine source, as its /healthz reports it. */
async function rankOf(http: string): Promise<Record<string, unknown> | undefined> {
  return (await engineRanks(http))[0];
}

/** A bare engine-side ZMQ PUB (messages built by the test), bound on a free port. */
async function rawEngine(): Promise<Publisher> {
  const engine = new Publisher({ linger: 0, sendHighWaterMark: 0 });
  cleanup.push(() => engine.close());
  await engine.bind('tcp://127.0.0.1:*');
  return engine;
}

/**
 * TensorRT-LLM's ZMQ payloads, `[ts, events, attention_dp_rank]` with map events under vLLM's
 * names, encoded by msgspec as TensorRT-LLM does: one BlockStored of `tokens` tokens (block size
 * 4) per batch.
 */
function trtllmPayloads(batches: Array<{ hash: number; tokens: number; rank: number }>): Buffer[] {
  const script = `import json, sys, msgspec
enc = msgspec.msgpack.Encoder()
ev = lambda h, n: {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": None,
                   "token_ids": [h % 1000] * n, "block_size": 4, "lora_id": None}
print(json.dumps([enc.encode([1.0, [ev(b["hash"], b["tokens"])], b["rank"]]).hex() for b in json.loads(sys.argv[1])]))`;
  const hex = JSON.parse(execFileSync('python3', ['-c', script, JSON.stringify(batches)]).toString()) as string[];
  return hex.map((h) => Buffer.from(h, 'hex'));
}

/** `--engine trtllm` relaying a raw engine socket that gathers 2 attention-DP ranks. */
async function trtllmRelay(): Promise<{ engine: Publisher; http: string }> {
  const engine = await rawEngine();
  const { http } = await relayNode([
    '--engine',
    'trtllm',
    '--engine-endpoint',
    engine.lastEndpoint as string,
    '--engine-dp-size',
    '2',
  ]);
  return { engine, http };
}

/** An engine message's seq frame: 8 bytes, big-endian. */
function seq(n: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

async function dumpedBlocks(http: string): Promise<number[]> {
  const d = (await (await fetch(`${http}/kv_recover`)).json()) as Dump;
  return d.TreeDump.workers.flatMap((w) => w.events.flatMap((e) => e.block_hashes)).sort((a, b) => a - b);
}

describe('kvplane serve --engine vllm relays an engine publisher', () => {
  it('joins late from the engine replay, relays live batches, and clears the rank on a restart', async () => {
    const engine = await enginePublisher();
    // Published before the relay starts: it must come from the engine's replay.
    engine.publish([stored(1, null), stored(2, 1)]);
    await engine.flush();
    const { http } = await relayNode(vllmArgs(engine));
    // The first live batch tells the relay the engine is ahead: it fetches 0.. from the replay.
    for (let i = 3; i <= 10; i++) {
      engine.publish([stored(i, i - 1)]);
      await engine.flush();
      await sleep(10);
    }
    let blocks: number[] = [];
    const deadline = Date.now() + 10_000;
    while (blocks.length < 10 && Date.now() < deadline) {
      await sleep(100);
      blocks = await dumpedBlocks(http);
    }
    expect(blocks).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    const health = (await (await fetch(`${http}/healthz`)).json()) as {
      sources: Array<{ state: string; stats: { ranks: Array<Record<string, unknown>> } }>;
    };
    expect(health.sources[0]?.state).toBe('ok');
    expect(health.sources[0]?.stats.ranks[0]).toMatchObject({
      unrecoverable: 1,
      cleared: 1,
      lastEngineSeq: 9,
      feed: 'native',
    });

    // The engine restarts: a new incarnation numbering from 0 again, without the old blocks.
    const url = new URL(engine.endpoint.replace('tcp://', 'http://'));
    const replayUrl = new URL((engine.replayEndpoint as string).replace('tcp://', 'http://'));
    await engine.close();
    cleanup.pop();
    // The same ports again, once the old sockets have let go of them.
    let restarted: KvEventPublisher | undefined;
    for (let i = 0; restarted === undefined; i++) {
      restarted = await KvEventPublisher.create({
        endpoint: `bind:tcp://127.0.0.1:${url.port}`,
        replayEndpoint: `bind:tcp://127.0.0.1:${replayUrl.port}`,
        firstSeq: 1n,
        openWithClear: false,
      }).catch(async (err) => {
        if (i > 50) throw err;
        await sleep(100);
        return undefined;
      });
    }
    cleanup.push(() => restarted.close());
    await sleep(500);
    for (let i = 100; i < 103; i++) {
      restarted.publish([stored(i, i === 100 ? null : i - 1)]);
      await restarted.flush();
      await sleep(10);
    }
    const end = Date.now() + 10_000;
    do {
      await sleep(100);
      blocks = await dumpedBlocks(http);
    } while (blocks[0] !== 100 && Date.now() < end);
    expect(blocks).toEqual([100, 101, 102]);
    const after = (await (await fetch(`${http}/healthz`)).json()) as typeof health;
    expect(after.sources[0]?.stats.ranks[0]).toMatchObject({ restarts: 1 });
  }, 60_000);

  it('relays the same through zeromq.js and the JS thread with --native-zmq false', async () => {
    const engine = await enginePublisher();
    engine.publish([stored(1, null), stored(2, 1)]);
    await engine.flush();
    const { http, node } = await relayNode(vllmArgs(engine, '--native-zmq', 'false'));
    for (let i = 3; i <= 6; i++) {
      engine.publish([stored(i, i - 1)]);
      await engine.flush();
      await sleep(10);
    }
    let blocks: number[] = [];
    for (let i = 0; i < 100 && blocks.length < 6; i++) {
      await sleep(100);
      blocks = await dumpedBlocks(http);
    }
    expect(blocks).toEqual([1, 2, 3, 4, 5, 6]);
    const health = (await (await fetch(`${http}/healthz`)).json()) as {
      sources: Array<{ stats: { ranks: Array<Record<string, unknown>> } }>;
    };
    expect(health.sources[0]?.stats.ranks[0]).toMatchObject({ feed: 'zeromq.js', lastEngineSeq: 5 });
    // Its own ZMQ output is zeromq.js's too: the relay's batches reach a subscriber there.
    const sub = new Subscriber();
    cleanup.push(() => sub.close());
    sub.connect(node.serving.endpoint as string);
    sub.subscribe();
    await sleep(300);
    engine.publish([stored(7, 6)]);
    await engine.flush();
    const [, , payload] = (await sub.receive()) as Buffer[];
    const ev = decodeBatch(payload as Buffer, 'vllm').events[0];
    expect(ev?.type === 'stored' && Array.from(ev.blockHashes ?? [])).toEqual([7n]);
  }, 30_000);

  it('counts and skips bad input from an engine and keeps relaying', async () => {
    const engine = await rawEngine();
    const { http, node } = await relayNode(['--engine', 'vllm', '--engine-endpoint', engine.lastEndpoint as string]);
    const batch = (n: number) => encodeBatch({ seq: 0n, ts: 1, dpRank: null, events: [stored(n, null)] }, 'vllm');
    const empty = Buffer.alloc(0);
    await engine.send([empty, seq(0n), batch(1)]);
    await engine.send([Buffer.from('garbage')]); // one frame
    await engine.send([empty, seq(1n)]); // two frames
    await engine.send([empty, Buffer.alloc(7), batch(2)]); // a 7-byte seq
    await engine.send([empty, seq(1n), Buffer.from([0xc1, 0xff, 0x00])]); // not msgpack
    await engine.send([empty, seq(2n), batch(2)]);
    await engine.send([empty, seq(3n), batch(3)]);
    let rank: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && Number(rank?.lastEngineSeq ?? -1) < 3; i++) {
      await sleep(100);
      rank = await rankOf(http);
    }
    // 3 malformed messages skipped; the undecodable batch 1 cleared the rank, which rebuilt from 2.
    expect(rank).toMatchObject({ malformed: 3, undecodable: 1, cleared: 1, lastEngineSeq: 3, applied: 4 });
    expect(await dumpedBlocks(http)).toEqual([2, 3]);
    const warnings = node.lines.filter((l) => l.level === 'warn').map((l) => l.msg);
    expect(warnings).toContain('malformed engine message skipped');
    expect(warnings).toContain('undecodable engine batch skipped; rank cleared');
    const metrics = await (await fetch(`${http}/metrics`)).text();
    expect(metrics).toMatch(/^kvplane_engine_rank_total\{source="vllm",rank="0",what="malformed"\} 3$/m);
    expect(metrics).toMatch(/^kvplane_engine_rank_connected\{source="vllm",rank="0"\} 1$/m);
  }, 30_000);

  it('relays engine batches that arrive together as one batch (--engine-coalesce-bytes), each event once, in order', async () => {
    // Engine batch i (from 0) stores block i + 1 under ts i + 1.
    const batch = (i: number) =>
      encodeBatch({ seq: 0n, ts: i + 1, dpRank: null, events: [stored(i + 1, null)] }, 'vllm');
    // Each engine batch is one store of about 100 bytes: 2,000 bytes take 20 of them, 0 one.
    for (const coalesce of [2000, 0]) {
      const engine = await rawEngine();
      const { http } = await relayNode([
        '--engine',
        'vllm',
        '--engine-endpoint',
        engine.lastEndpoint as string,
        '--engine-coalesce-bytes',
        String(coalesce),
      ]);
      // The first batch alone, relayed before the rest is sent: until the rank has joined, its
      // batches go to the follower one by one (sent at once with the rest, they all did now and
      // then, and none was coalesced).
      await engine.send([Buffer.alloc(0), seq(0), batch(0)]);
      for (let i = 0; i < 100 && Number((await rankOf(http))?.lastEngineSeq ?? -1) < 0; i++) await sleep(50);
      // The rest sent at once, in one tick (the engine's send buffer has no limit, so no send
      // waits): they reach the relay's socket together.
      await Promise.all(
        Array.from({ length: 299 }, (_, i) => engine.send([Buffer.alloc(0), seq(i + 1), batch(i + 1)])),
      );
      let out = await relayed(http);
      for (let i = 0; i < 100 && out.flatMap((b) => b.events).length < 302; i++) {
        await sleep(50);
        out = await relayed(http);
      }
      // The opening clears (the stream's, then the rank's), then blocks 1..300 in order.
      const stores = out.slice(2);
      expect(out.slice(0, 2).map((b) => b.events[0]?.type)).toEqual(['AllBlocksCleared', 'AllBlocksCleared']);
      expect(stores.flatMap((b) => b.events.flatMap((e) => e.block_hashes))).toEqual(
        Array.from({ length: 300 }, (_, i) => i + 1),
      );
      // Seqs follow one another; each batch carries the rank and its first engine batch's ts.
      expect(stores.map((b) => b.seq - (out[1]?.seq as number))).toEqual(stores.map((_, i) => i + 1));
      for (const b of stores) {
        expect(b.dp_rank).toBe(0);
        expect(b.ts).toBe(b.events[0]?.block_hashes?.[0]);
        expect(b.events.length).toBeLessThanOrEqual(coalesce === 0 ? 1 : 20);
      }
      if (coalesce === 0) expect(stores).toHaveLength(300);
      else expect(stores.length).toBeLessThan(300);
      // The relay's own time per engine batch, read off the socket to handed to the outputs.
      const health = (await (await fetch(`${http}/healthz`)).json()) as {
        sources: Array<{ stats: { relayLatencyMs: { count: number; p50: number; p99: number; max: number } } }>;
      };
      const l = health.sources[0]?.stats.relayLatencyMs;
      expect(l?.count).toBe(300);
      expect(0 <= (l?.p50 ?? -1) && (l?.p50 ?? 0) <= (l?.p99 ?? 0) && (l?.p99 ?? 0) <= (l?.max ?? 0)).toBe(true);
      const metrics = await (await fetch(`${http}/metrics`)).text();
      expect(metrics).toMatch(/^kvplane_engine_relay_latency_seconds\{source="vllm",quantile="0\.99"\} \S+$/m);
    }
  }, 30_000);

  it("gRPC subscribers that join (and, with SMG's own stubs, rejoin) while the link thread relays get every batch from their start, in order", async () => {
    // The relay encodes batches for gRPC only while it has a subscriber: batches relayed before
    // one joins, and those waiting for the JS thread when it does, reach it all the same.
    const engine = await rawEngine();
    const grpcPort = await freePort();
    const { http } = await relayNode([
      '--engine',
      'vllm',
      '--engine-endpoint',
      engine.lastEndpoint as string,
      '--grpc-host',
      '127.0.0.1',
      '--grpc-port',
      String(grpcPort),
    ]);
    // Engine batch i (from 0) stores block i + 1.
    const batch = (i: number) =>
      encodeBatch({ seq: 0n, ts: i + 1, dpRank: null, events: [stored(i + 1, null)] }, 'vllm');
    let sent = 0;
    const send = async (n: number) => {
      for (const end = sent + n; sent < end; sent++) {
        await engine.send([Buffer.alloc(0), seq(sent), batch(sent)]);
        if (sent % 25 === 0) await sleep(2);
      }
    };
    const Client = makeGenericClientConstructor(subscribeDefinition('vllm.grpc.engine.VllmEngine'), 'kv');
    const subscribe = (start: bigint) => {
      const client = new Client(`127.0.0.1:${grpcPort}`, credentials.createInsecure());
      cleanup.push(() => client.close());
      const call = (
        client as unknown as Record<string, (r: Buffer) => ClientReadableStream<Buffer>>
      ).SubscribeKvEvents?.(encodeSubscribeRequest(start)) as ClientReadableStream<Buffer>;
      const got: Array<{ seq: bigint; hashes: bigint[] }> = [];
      call.on('data', (b: Buffer) => {
        const d = decodeBatch(b, 'smg_proto');
        got.push({
          seq: d.seq,
          hashes: d.events.flatMap((e) => (e.type === 'stored' ? Array.from(e.blockHashes ?? []) : [])),
        });
      });
      call.on('error', () => {});
      return { got, stop: () => call.cancel() };
    };
    const lastSeq = async () => BigInt((await relayed(http)).at(-1)?.seq ?? 0);
    const relayedUpTo = async (n: number) => {
      for (let i = 0; i < 200; i++) {
        const hashes = (await relayed(http)).flatMap((b) => b.events.flatMap((e) => e.block_hashes ?? []));
        if (hashes.length >= n) return;
        await sleep(50);
      }
      throw new Error(`the relay did not publish ${n} blocks`);
    };
    // What a subscriber got must be the log from its start: contiguous seqs, the same blocks.
    const check = async (got: Array<{ seq: bigint; hashes: bigint[] }>, start: bigint) => {
      const log = (await relayed(http)).filter((b) => BigInt(b.seq) >= start);
      expect(got.map((b) => b.seq)).toEqual(log.map((b) => BigInt(b.seq)));
      expect(got.map((b) => b.hashes)).toEqual(
        log.map((b) => b.events.flatMap((e) => e.block_hashes ?? []).map(BigInt)),
      );
    };

    await send(200);
    await relayedUpTo(200);
    const first = (await relayed(http))[0]?.seq as number;
    // Joins from the log's first seq while the engine keeps publishing.
    const a = subscribe(BigInt(first));
    await send(400);
    await relayedUpTo(600);
    const end = await lastSeq();
    await until(() => a.got.at(-1)?.seq === end, 'the first subscriber to catch up');
    await check(a.got, BigInt(first));
    expect(a.got.flatMap((b) => b.hashes)).toEqual(Array.from({ length: 600 }, (_, i) => BigInt(i + 1)));
    a.stop();
    await sleep(200);

    // With no subscriber again; then SMG's own stubs (grpcio, smg-grpc-proto) from the next seq:
    // what the log holds by then, and 20 batches more sent one at a time (100 ms apart, so most
    // reach it live and each is one batch of the relay).
    await send(200);
    await relayedUpTo(800);
    const inLog = (await relayed(http)).filter((x) => BigInt(x.seq) > end).length;
    const peer = runGrpcPeer([`127.0.0.1:${grpcPort}`, 'vllm', String(end + 1n), String(inLog + 20)]);
    for (let k = 0; k < 20; k++) {
      await send(1);
      await sleep(100);
    }
    const batches = (await peer).filter((l) => 'seq' in l) as Array<{
      seq: string;
      events: Array<{ block_hashes?: string[] }>;
    }>;
    const log = (await relayed(http)).filter((x) => BigInt(x.seq) > end);
    expect(batches.map((x) => BigInt(x.seq))).toEqual(log.map((x) => BigInt(x.seq)));
    expect(batches.flatMap((x) => x.events.flatMap((e) => e.block_hashes ?? []).map(BigInt))).toEqual(
      Array.from({ length: 220 }, (_, i) => BigInt(i + 601)),
    );
  }, 60_000);

  it('a batch relayed on the link thread that fails closed is reported under its own rank', async () => {
    // Rank 1's stored event does not fill its block.
    const payloads = trtllmPayloads([
      { hash: 100, tokens: 4, rank: 0 },
      { hash: 101, tokens: 3, rank: 1 },
    ]);
    const { engine, http } = await trtllmRelay();
    await engine.send([Buffer.alloc(0), seq(0), payloads[0] as Buffer]);
    // The first batch joins the rank on the JS side; the next ones go through the native link.
    await sleep(300);
    await engine.send([Buffer.alloc(0), seq(1), payloads[1] as Buffer]);
    let h: { status?: string; fail_closed?: Array<{ dp_rank: number; reason: string }> } = {};
    for (let i = 0; i < 50 && h.status !== 'fail_closed'; i++) {
      await sleep(100);
      h = (await (await fetch(`${http}/healthz`)).json()) as typeof h;
    }
    expect(h.fail_closed?.map((f) => f.dp_rank)).toEqual([1]);
    expect(h.fail_closed?.[0]?.reason).toContain('Unsupported BlockStored layout');
  }, 30_000);

  it('relays TensorRT-LLM ZMQ batches under their attention-DP ranks, and a gap clears every rank', async () => {
    const payloads = trtllmPayloads(Array.from({ length: 6 }, (_, i) => ({ hash: 100 + i, tokens: 4, rank: i % 2 })));
    const { engine, http } = await trtllmRelay();
    for (let i = 0; i < 4; i++) await engine.send([Buffer.alloc(0), seq(i), payloads[i] as Buffer]);
    const ranksOf = async () => {
      const d = (await (await fetch(`${http}/kv_recover`)).json()) as Dump;
      return Object.fromEntries(
        d.TreeDump.workers.map((w) => [w.dp_rank, w.events.flatMap((e) => e.block_hashes).sort((a, b) => a - b)]),
      );
    };
    let got: Record<string, number[]> = {};
    for (let i = 0; i < 50 && Object.values(got).flat().length < 4; i++) {
      await sleep(100);
      got = await ranksOf();
    }
    expect(got).toEqual({ 0: [100, 102], 1: [101, 103] });
    // Seq 4 never comes and there is no replay: both ranks' state is unknown, both are cleared.
    await engine.send([Buffer.alloc(0), seq(5), payloads[5] as Buffer]);
    for (let i = 0; i < 50 && got[0] !== undefined; i++) {
      await sleep(100);
      got = await ranksOf();
    }
    expect(got).toEqual({ 1: [105] });
  }, 30_000);

  it('polls trtllm-serve /kv_cache_events: V1 and V2 events by attention-DP rank, event-id gaps and a restart clear the rank', async () => {
    const block = (hash: number | string, token: number) => ({
      type: 'stored_block',
      block_hash: hash,
      tokens: Array.from({ length: 4 }, (_, i) => ({ type: 'unique_token', token_id: token + i, token_extra_id: 0 })),
      cache_level: 0,
      priority: 35,
    });
    const stored = (id: number, rank: number, hash: number | string, token: number) => ({
      event_id: id,
      data: { type: 'stored', parent_hash: null, blocks: [block(hash, token)] },
      window_size: 32,
      attention_dp_rank: rank,
    });
    const v2 = 'ab'.repeat(32); // a V2 cache manager's SHA-256 block key, hex
    const drains: unknown[][] = [
      [stored(0, 0, 10, 100), stored(1, 0, 11, 200), stored(0, 1, 20, 300)],
      [],
      [stored(5, 0, 12, 400)], // ids 2..4 of rank 0 were dropped by the engine
      [],
      [
        {
          event_id: 0,
          data: { type: 'created', num_blocks_per_cache_level: [128, 0] },
          window_size: 32,
          attention_dp_rank: 1,
        },
        { ...stored(1, 1, v2, 500), hash_algo: 'v2_sha256' },
      ], // rank 1 restarted
    ];
    let served = 0;
    const server = createServer((req, res) => {
      expect([req.method, req.url]).toEqual(['POST', '/kv_cache_events']);
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(drains[served++] ?? []));
    });
    const { http } = await trtllmHttpNode(server);
    for (let i = 0; i < 100 && served < drains.length + 1; i++) await sleep(50);
    await sleep(200);
    const d = (await (await fetch(`${http}/kv_recover`)).json()) as Dump;
    const byRank = Object.fromEntries(
      d.TreeDump.workers.map((w) => [w.dp_rank, w.events.flatMap((e) => e.block_hashes)]),
    );
    expect(byRank[0]).toEqual([12]);
    expect(byRank[1]).toHaveLength(1);
    expect(byRank[1]?.[0]).not.toBe(20);
    const health = (await (await fetch(`${http}/healthz`)).json()) as {
      sources: Array<{
        kind: string;
        state: string;
        stats: { ranks: Array<Record<string, unknown>>; emptyDrains: number };
      }>;
    };
    const src = health.sources[0];
    expect(src?.kind).toBe('http');
    expect(src?.state).toBe('ok');
    expect(src?.stats.emptyDrains).toBeGreaterThanOrEqual(2);
    const ranks = Object.fromEntries((src?.stats.ranks ?? []).map((r) => [r.rank, r]));
    expect(ranks[0]).toMatchObject({ gaps: 1, restarts: 0, nextEventId: 6 });
    expect(ranks[1]).toMatchObject({ gaps: 0, restarts: 1, nextEventId: 2 });
  }, 30_000);

  it('refuses a TensorRT-LLM drain over 256 MiB as it arrives, and clears the ranks it took from the engine', async () => {
    const stored = (id: number, rank: number, hash: number) => ({
      event_id: id,
      data: {
        type: 'stored',
        parent_hash: null,
        blocks: [
          {
            type: 'stored_block',
            block_hash: hash,
            tokens: [1, 2, 3, 4].map((t) => ({ type: 'unique_token', token_id: hash + t, token_extra_id: 0 })),
            cache_level: 0,
            priority: 35,
          },
        ],
      },
      window_size: 32,
      attention_dp_rank: rank,
    });
    let served = 0;
    const server = createServer(async (req, res) => {
      req.resume();
      res.setHeader('content-type', 'application/json');
      const n = served++;
      if (n === 0) return void res.end(JSON.stringify([stored(0, 0, 10), stored(0, 1, 20)]));
      if (n !== 3) return void res.end('[]');
      // 257 MiB of a JSON list, written as the client reads it.
      const chunk = Buffer.alloc(1 << 20, 0x20);
      res.write('[');
      for (let i = 0; i < 257 && !res.destroyed; i++) {
        if (!res.write(chunk)) await new Promise((r) => res.once('drain', r).once('close', r));
      }
      res.end(']');
    });
    const { http } = await trtllmHttpNode(server);
    const health = async () =>
      (
        (await (await fetch(`${http}/healthz`)).json()) as {
          sources: Array<{ state: string; stats: Record<string, number> }>;
        }
      ).sources[0];
    for (let i = 0; i < 200 && ((await health())?.stats.oversizeDrains ?? 0) === 0; i++) await sleep(50);
    const src = await health();
    expect(src?.stats).toMatchObject({ oversizeDrains: 1, failedPolls: 0, undecodable: 0 });
    expect(src?.state).toBe('ok');
    // Blocks 10 and 20 went with the clear: the node holds nothing.
    const d = (await (await fetch(`${http}/kv_recover`)).json()) as Dump;
    expect(d.TreeDump.workers.flatMap((w) => w.events.flatMap((e) => e.block_hashes))).toEqual([]);
  }, 30_000);

  it("fills the relay's own HWM overflow from the engine's replay, ending in the engine's state", async () => {
    const engine = await enginePublisher();
    const { http } = await relayNode(vllmArgs(engine, '--engine-hwm', '2'));
    // 2,000 batches in one burst: far more than the relay's 2-message HWM holds.
    for (let i = 1; i <= 2000; i++) {
      engine.stream.relay(
        encodeBatch({ seq: 0n, ts: 1, dpRank: null, events: [stored(i, null)] }, 'vllm'),
        'vllm',
        null,
      );
    }
    await engine.flush();
    const want = Array.from({ length: 2000 }, (_, i) => i + 1);
    let blocks: number[] = [];
    for (let i = 0; i < 100 && blocks.length < 2000; i++) {
      await sleep(100);
      blocks = await dumpedBlocks(http);
    }
    expect(blocks).toEqual(want);
    const health = (await (await fetch(`${http}/healthz`)).json()) as {
      sources: Array<{ stats: { ranks: Array<Record<string, unknown>> } }>;
    };
    const rank = health.sources[0]?.stats.ranks[0] as Record<string, number>;
    console.log(`relay HWM overflow: ${JSON.stringify(rank)}`);
    // Every batch applied once: what the SUB dropped came from the replay, and what it had queued
    // meanwhile was skipped as duplicates. (The one clear is this engine's seqs starting at 1.)
    expect(rank).toMatchObject({ applied: 2000, lastEngineSeq: 2000, restarts: 0, heldDropped: 0 });
    expect(rank.duplicates).toBeGreaterThan(0);
    expect(rank.cleared).toBeLessThanOrEqual(1);
  }, 60_000);
});
