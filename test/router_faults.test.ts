import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  decodeRecoverAnswer,
  IndexerServer,
  KvEventPublisher,
  KvGrpcServer,
  KvHttpServer,
  SimEngine,
} from '../dist/index.mjs';
import { sleep, TcpLink } from './fixtures.js';
import { post, rng } from './router_fixtures.js';

/**
 * Fault injection (docs/architecture.md#router-side): kvplane nodes followed by `kvplane indexer`
 * (three over gRPC, one over ZMQ with its replay and `/kv_recover`) through random faults; at quiescence the indexer's blocks of every worker equal that node's own
 * `/kv_recover` tree dump. `KVPLANE_FAULT_RUNS` sets the number of seeded runs (default 100);
 * `KVPLANE_FAULT_LONG=1` makes each run longer (more steps and faults).
 */
const RUNS = Number(process.env.KVPLANE_FAULT_RUNS ?? 100);
const LONG = process.env.KVPLANE_FAULT_LONG === '1';
const BS = 16;
/** Batches a node keeps: an outage longer than this expires the indexer's cursor. */
const BUFFER_STEPS = 24;

const FAULTS = ['hwm', 'drop', 'restart', 'indexer_restart', 'expired'] as const;
type Fault = (typeof FAULTS)[number];

class Node {
  publisher!: KvEventPublisher;
  grpc: KvGrpcServer | null = null;
  http!: KvHttpServer;
  sim!: SimEngine;
  grpcPort = 0;
  httpPort = 0;
  /** What the indexer connects through. */
  proxy!: TcpLink;

  /** The ZMQ ports, kept across restarts (a node followed over ZMQ). */
  zmqPorts: [number, number] | null = null;

  constructor(
    readonly id: bigint,
    public seed: number,
    /** No gRPC server: followed over its ZMQ stream and replay socket, with `/kv_recover`. */
    readonly zmqOnly = false,
  ) {}

  async start(): Promise<void> {
    this.proxy ??= await TcpLink.open(() => this.grpcPort);
    const [live, replay] = this.zmqPorts ?? ['*', '*'];
    const create = () =>
      KvEventPublisher.create({
        // `bind:`: a specific address is otherwise connected to (vLLM's rule).
        endpoint: `bind:tcp://127.0.0.1:${live}`,
        replayEndpoint: this.zmqOnly ? `bind:tcp://127.0.0.1:${replay}` : null,
        blockSize: BS,
        bufferSteps: BUFFER_STEPS,
        hwm: 8,
      });
    // A restart on the same ports may find them still held for a moment.
    for (let attempt = 0; ; attempt++) {
      try {
        this.publisher = await create();
        break;
      } catch (err) {
        if (attempt >= 40 || !/in use/.test((err as Error).message)) throw err;
        await sleep(50);
      }
    }
    if (this.zmqOnly) {
      const port = (e: string | null) => Number(/:(\d+)$/.exec(e ?? '')?.[1]);
      this.zmqPorts = [port(this.publisher.endpoint), port(this.publisher.replayEndpoint)];
    }
    this.sim = new SimEngine(this.publisher, {
      seed: this.seed,
      blockSize: BS,
      numBlocks: 256,
      requestsPerSecond: 150,
      systemPrompts: 3,
      documents: 10,
    });
    await this.startGrpc();
    this.grpcPort = this.grpc?.port ?? 0;
    this.http = await KvHttpServer.create({ publisher: this.publisher, port: this.httpPort, grpc: this.grpc });
    this.httpPort = this.http.port;
  }

  async startGrpc(): Promise<void> {
    if (this.zmqOnly) return;
    this.grpc = await KvGrpcServer.create({
      stream: this.publisher.stream,
      host: '127.0.0.1',
      port: this.grpcPort,
      maxLagBatches: 4,
    });
  }

  async stopGrpc(): Promise<void> {
    await this.grpc?.close();
    this.grpc = null;
  }

  /**
   * Over ZMQ, batches published before a subscriber (re)connects are not seen live; the router
   * learns of them from the next batch it gets. Waits until the indexer is connected.
   */
  async subscribed(): Promise<void> {
    if (!this.zmqOnly) return;
    for (let i = 0; i < 250 && this.publisher.stats().subscribers === 0; i++) await sleep(20);
  }

  get url(): string {
    return `http://127.0.0.1:${this.httpPort}`;
  }

  async steps(n: number): Promise<void> {
    for (let i = 0; i < n; i++) {
      this.sim.step();
      await this.publisher.flush();
    }
  }

  /**
   * Many batches at once (more than a subscriber may lag): `n` one-block chains of fresh tokens,
   * drained together into 1024-event batches, then removed again the same way.
   */
  async burst(n: number, salt: number): Promise<void> {
    const hashes = Array.from({ length: n }, (_, i) => BigInt(salt) * 1_000_000n + BigInt(i) + 1n);
    const stored = hashes.map((h, i) => ({
      type: 'stored' as const,
      blockHashes: [h],
      parentBlockHash: null,
      tokenIds: new Uint32Array(BS).fill(salt * 10_000 + i),
      blockSize: BS,
    }));
    this.publisher.publish(stored);
    await this.publisher.flush();
    this.publisher.publish(
      hashes.filter((_, i) => i % 2 === 0).map((h) => ({ type: 'removed' as const, blockHashes: [h] })),
    );
    await this.publisher.flush();
  }

  async restart(seed: number): Promise<void> {
    await this.close(false);
    this.seed = seed;
    await this.start();
  }

  async close(final = true): Promise<void> {
    if (final) await this.proxy.cut();
    await this.http.close();
    await this.stopGrpc();
    await this.publisher.close();
  }

  /** The node's own state, from its `/kv_recover` tree dump: `rank:engineHash` per block. */
  async dumped(): Promise<Set<string>> {
    const res = await fetch(`${this.url}/kv_recover?format=msgpack`);
    const answer = decodeRecoverAnswer(new Uint8Array(await res.arrayBuffer()));
    if (answer.kind !== 'TreeDump') throw new Error(`expected a TreeDump, got ${answer.kind}`);
    const out = new Set<string>();
    for (const w of answer.workers) {
      for (const ev of w.events) for (const h of ev.blockHashes ?? []) out.add(`${w.dpRank}:${h}`);
    }
    return out;
  }
}

/** The indexer's blocks of worker `id`, as `rank:engineHash`. */
function held(ix: IndexerServer, id: bigint): Set<string> {
  const out = new Set<string>();
  for (const s of ix.registry.index('m', 'default').dump(id))
    for (const h of s.blockHashes) out.add(`${s.dpRank}:${h}`);
  return out;
}

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/**
 * Waits for the indexer to hold every node's last seq. A ZMQ-only node whose subscriber lags for a
 * second publishes one more step, as a serving engine would: a batch sent before a reconnected
 * SUB's subscription took is lost to it (ZMQ's slow joiner), and only a later batch shows the gap.
 */
async function converged(ix: IndexerServer, nodes: Node[], ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  const index = ix.registry.index('m', 'default');
  const caughtUp = (n: Node) => {
    const s = index.subscription(n.id)?.stats();
    return s?.state === 'live' && s.lastSeq === n.publisher.stats().lastSeq;
  };
  let nudge = Date.now() + 1000;
  for (;;) {
    if (nodes.every(caughtUp)) return;
    if (Date.now() > end) {
      const subs = nodes.map((n) => ({ node: n.publisher.stats().lastSeq, sub: index.subscription(n.id)?.stats() }));
      throw new Error(`not converged: ${JSON.stringify(subs, (_k, v) => (typeof v === 'bigint' ? String(v) : v))}`);
    }
    if (Date.now() > nudge) {
      for (const n of nodes) if (n.zmqOnly && !caughtUp(n)) await n.steps(1);
      nudge = Date.now() + 1000;
    }
    await sleep(20);
  }
}

describe('router fault injection', () => {
  it(`${RUNS} seeded runs of nodes, faults and an indexer: 0 divergence from the nodes' /kv_recover dumps`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvplane-faults-'));
    const totals: Record<string, number> = {};
    const injected: Record<Fault, number> = { hwm: 0, drop: 0, restart: 0, indexer_restart: 0, expired: 0 };
    let cutOffs = 0;
    /** Adds an indexer's recoveries (by kind) and restarts seen to the totals. */
    const count = (ix: IndexerServer) => {
      for (const s of ix.registry.index('m', 'default').stats().subscriptions) {
        for (const [kind, v] of Object.entries(s.recoveries)) totals[kind] = (totals[kind] ?? 0) + v;
        totals.restarts = (totals.restarts ?? 0) + s.restarts;
        if (s.kind === 'zmq') totals.zmq_tree_dumps = (totals.zmq_tree_dumps ?? 0) + s.recoveries.snapshot;
      }
    };
    for (let run = 0; run < RUNS; run++) {
      const r = rng(run + 1);
      const nodes = [
        new Node(1n, run * 10 + 1),
        new Node(2n, run * 10 + 2),
        new Node(3n, run * 10 + 3),
        new Node(4n, run * 10 + 4, true),
      ];
      for (const n of nodes) await n.start();
      const stateFile = join(dir, `state-${run}.json`);
      let ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, stateFile });
      const closeAll = async () => {
        await ix.close();
        for (const n of nodes) await n.close();
      };
      cleanup.push(closeAll);
      for (const n of nodes) {
        // Through the node's fault proxy; nodes 3 and 4 by their URLs, as kvplane nodes register
        // (3 is found serving gRPC, 4 only ZMQ).
        const where = n.id >= 3n ? { url: n.url } : { endpoint: `grpc://127.0.0.1:${n.proxy.port}` };
        const res = await post(ix.url, '/register', {
          instance_id: Number(n.id),
          ...where,
          model_name: 'm',
          block_size: BS,
        });
        expect(res.status).toBe(201);
      }
      for (const n of nodes) await n.subscribed();
      for (const n of nodes) await n.steps(5);
      const faults = LONG ? 8 : 3;
      for (let f = 0; f < faults; f++) {
        const node = nodes[Math.floor(r() * nodes.length)] as Node;
        let fault = FAULTS[Math.floor(r() * FAULTS.length)] as Fault;
        // Over ZMQ a lost connection is a burst the publisher's HWM drops.
        if (node.zmqOnly && fault === 'drop') fault = 'hwm';
        injected[fault]++;
        switch (fault) {
          case 'hwm': {
            // The indexer stops reading (a stalled router or network): the node's queue for it
            // passes its bound and it is cut off; it resumes from its last seq.
            if (node.zmqOnly) {
              await node.burst(48 * 1024, run * 100 + f + 1);
              break;
            }
            const before = node.grpc?.stats().cutOff ?? 0;
            node.proxy.stall();
            await node.burst(48 * 1024, run * 100 + f + 1);
            for (let i = 0; i < 50 && (node.grpc?.stats().cutOff ?? 0) === before; i++) await sleep(10);
            node.proxy.resume();
            cutOffs += (node.grpc?.stats().cutOff ?? 0) - before;
            break;
          }
          case 'drop':
            node.proxy.drop();
            await node.steps(3 + Math.floor(r() * 8));
            break;
          case 'expired':
            if (node.zmqOnly) {
              // More than the replay log holds, faster than the HWM lets through.
              await node.burst(64 * 1024, run * 100 + f + 50);
              break;
            }
            await node.stopGrpc();
            await node.steps(BUFFER_STEPS + 10);
            await node.startGrpc();
            break;
          case 'restart':
            await node.restart(run * 10 + 100 + f);
            await node.subscribed();
            break;
          case 'indexer_restart':
            count(ix);
            await ix.close();
            await node.steps(4);
            ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, stateFile });
            for (const n of nodes) await n.subscribed();
            break;
        }
        for (const n of nodes) await n.steps(LONG ? 20 : 3 + Math.floor(r() * 5));
      }
      // Engines keep publishing: a last batch shows a ZMQ subscriber anything it missed.
      for (const n of nodes) await n.subscribed();
      for (const n of nodes) await n.steps(1);
      await converged(ix, nodes);
      for (const n of nodes) {
        const mine = held(ix, n.id);
        const theirs = await n.dumped();
        const diverge = [...mine].filter((k) => !theirs.has(k)).length + [...theirs].filter((k) => !mine.has(k)).length;
        expect(diverge, `run ${run} node ${n.id}`).toBe(0);
        expect(theirs.size).toBeGreaterThan(0);
      }
      count(ix);
      cleanup.pop();
      await closeAll();
    }
    console.log(JSON.stringify({ runs: RUNS, injected, recoveries: totals, cutOffs }));
    // Every kind of fault was injected, and the indexer recovered by resuming and by snapshot.
    for (const f of FAULTS) expect(injected[f], f).toBeGreaterThan(0);
    expect(totals.snapshot).toBeGreaterThan(RUNS * 3);
    expect(totals.resume).toBeGreaterThan(0);
    expect(cutOffs).toBeGreaterThan(0);
    // The node followed over ZMQ was rebuilt from /kv_recover tree dumps, not cleared.
    expect(totals.zmq_tree_dumps).toBeGreaterThan(RUNS);
  }, 600_000);
});
